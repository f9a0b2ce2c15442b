/* test_half_convert.c — the KV store's f32 -> f16 / bf16 row conversions (ops->f32_to_f16_row,
 * f32_to_bf16_row) on every kernel set: bit for bit the scalar conversions, over every rounding
 * boundary of every f16 / bf16 value, signed zeros, subnormals, overflow, NaNs with payloads and
 * every tail length; plus hand-computed values and exact round trips. Correctness only. */
#include "kernels.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Inputs: for every 16-bit pattern h, the f32 it widens to (f16 and bf16 readings), and that value
 * moved to just below, onto and just above the rounding tie with its neighbour (f16 drops 13
 * mantissa bits, bf16 16), both signs; then special and random patterns. */
static int64_t make_inputs(float *x, int64_t cap) {
    int64_t n = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f16 = ember_f16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &f16, 4);
        const uint32_t f16_ties[] = {u, u + 0x0fff, u + 0x1000, u + 0x1001};
        for (int i = 0; i < 4 && n < cap; i++) x[n++] = from_bits(f16_ties[i]);
        const uint32_t b = h << 16;
        const uint32_t bf_ties[] = {b, b + 0x7fff, b + 0x8000, b + 0x8001};
        for (int i = 0; i < 4 && n < cap; i++) x[n++] = from_bits(bf_ties[i]);
    }
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x33000000u, 0x33000001u,
                                0xb3800000u, 0x387fe000u, 0x387ff000u, 0x38800000u, 0x477fefffu, 0x477ff000u,
                                0xc77ff000u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu, 0x7fbfffffu, 0x7fc0ffffu};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && n < cap; i++) x[n++] = from_bits(special[i]);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    while (n < cap) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        x[n++] = from_bits((uint32_t)(r >> 16));
    }
    return n;
}

static void check_set(const char *name, const ember_kernel_ops *ops, const float *x, int64_t n) {
    uint16_t *y = malloc((size_t)(n + 64) * sizeof *y);
    for (int kind = 0; kind < 2; kind++) {
        void (*row)(uint16_t *, const float *, int64_t) = kind == 0 ? ops->f32_to_f16_row : ops->f32_to_bf16_row;
        uint16_t (*one)(float) = kind == 0 ? ember_f32_to_f16 : ember_f32_to_bf16;
        const char *what = kind == 0 ? "f16" : "bf16";
        if (!CHECKF(row != NULL, "%s: no %s row conversion", name, what)) continue;
        row(y, x, n);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if (y[i] != one(x[i]) && bad++ == 0) first = i;
        uint32_t fb = 0;
        if (first >= 0) memcpy(&fb, &x[first], 4);
        CHECK_MSG(bad == 0,
                  "%s %s: %lld of %lld differ from the scalar conversion (first: 0x%08x -> 0x%04x, want 0x%04x)", name,
                  what, (long long)bad, (long long)n, fb, first >= 0 ? y[first] : 0, first >= 0 ? one(x[first]) : 0);
        /* every length 0..40 at every start offset 0..3: the vector bodies, the tails, and nothing
         * written past the end */
        for (int64_t off = 0; off < 4; off++)
            for (int64_t len = 0; len <= 40; len++) {
                for (int64_t i = 0; i < len + 8; i++) y[i] = 0xdead;
                row(y, x + 1000 + off, len);
                bool ok = true;
                for (int64_t i = 0; i < len; i++) ok &= y[i] == one(x[1000 + off + i]);
                for (int64_t i = len; i < len + 8; i++) ok &= y[i] == 0xdead;
                CHECK_MSG(ok, "%s %s: length %lld at offset %lld", name, what, (long long)len, (long long)off);
            }
    }
    free(y);
}

int main(void) {
    /* the scalar conversions against hand-computed values (the independent expectation the SIMD
     * rows are then held to, bit for bit) */
    CHECK(ember_f32_to_f16(1.0f) == 0x3c00);
    CHECK(ember_f32_to_f16(-2.0f) == 0xc000);
    CHECK(ember_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(ember_f32_to_f16(65519.0f) == 0x7bff);        /* below the tie with 65536: rounds down */
    CHECK(ember_f32_to_f16(65520.0f) == 0x7c00);        /* the tie rounds to even: infinity */
    CHECK(ember_f32_to_f16(0x1p-24f) == 0x0001);        /* smallest subnormal */
    CHECK(ember_f32_to_f16(0x1p-25f) == 0x0000);        /* tie between 0 and 2^-24: even (0) */
    CHECK(ember_f32_to_f16(0x1.8p-24f) == 0x0002);      /* tie between 1 and 2 (x 2^-24): even (2) */
    CHECK(ember_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00); /* tie: even mantissa 0 */
    CHECK(ember_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02); /* tie: even mantissa 2 */
    CHECK(ember_f32_to_f16(-0.0f) == 0x8000);
    CHECK(ember_f32_to_f16(NAN) == 0x7e00);
    CHECK(ember_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(ember_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80); /* tie: even */
    CHECK(ember_f32_to_bf16(1.0f + 0x3p-8f) == 0x3f82);
    CHECK(ember_f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80); /* FLT_MAX rounds to infinity */
    CHECK(ember_f32_to_bf16(from_bits(0x7f800001u)) == 0x7fc0); /* a signalling NaN stays a NaN */
    /* every f16 value survives f16 -> f32 -> f16 exactly */
    int round_trip_bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (!nan && ember_f32_to_f16(ember_f16_to_f32((uint16_t)h)) != h) round_trip_bad++;
    }
    CHECK_MSG(round_trip_bad == 0, "%d f16 values do not round-trip", round_trip_bad);

    const int64_t n = 65536 * 8 + 24 + 200000;
    float *x = malloc((size_t)n * sizeof *x);
    const int64_t got = make_inputs(x, n);
    CHECK(got == n);
    static const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    int ran = 0;
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        const ember_kernel_ops *ops = ember_kernels_table(sets[s]);
        if (!ops) {
            printf("kernel set %d: not supported by this CPU, skipped\n", (int)sets[s]);
            continue;
        }
        check_set(ops->name, ops, x, n);
        ran++;
    }
    CHECK(ran >= 1);
    free(x);
    return ember_test_finish();
}
