/* test_rng.h — the seeded random numbers of the SIMD tests: splitmix64, uniforms in [-1, 1) and
 * sums of uniforms as near-Gaussian values. Each test keeps its own seed, so its stream stays
 * what its measured budgets were taken on. */
#ifndef EMBER_TEST_RNG_H
#define EMBER_TEST_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t state;
} ember_test_rng;

static inline uint64_t ember_test_rng_u64(ember_test_rng *r) { /* splitmix64 */
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float ember_test_rng_uniform(ember_test_rng *r) {
    return (float)((ember_test_rng_u64(r) >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

/* The sum of `terms` uniforms times `scale` (sqrt(3 / terms) gives variance 1). */
static inline float ember_test_rng_gaussian(ember_test_rng *r, int terms, float scale) {
    float s = 0;
    for (int i = 0; i < terms; i++) s += ember_test_rng_uniform(r);
    return s * scale;
}

#endif
