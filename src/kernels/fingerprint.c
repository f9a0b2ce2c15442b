/* fingerprint.c — the one value fingerprint of ember: FNV-1a 64 over the bit patterns of f32
 * values (their little-endian bytes, in order). Traces, dumps and activation-stats all use it. */
#include "types.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ember_fingerprint_f32 hashes the in-memory bytes and assumes a little-endian host"
#endif

#define FNV64_OFFSET 0xcbf29ce484222325ull
#define FNV64_PRIME 0x100000001b3ull

uint64_t ember_fingerprint_bytes(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV64_PRIME;
    }
    return h;
}

/* Bytes rather than values: -0.0 and +0.0, or two NaN payloads, are different bit patterns and so
 * different fingerprints, which is what "the same bits" means for parity checks. */
uint64_t ember_fingerprint_f32(const float *x, int64_t n) {
    return n > 0 ? ember_fingerprint_bytes(FNV64_OFFSET, x, (size_t)n * sizeof(float)) : FNV64_OFFSET;
}

uint64_t ember_fingerprint_start(void) { return FNV64_OFFSET; }
