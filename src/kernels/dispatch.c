/* dispatch.c — CPU feature detection (CPUID plus the OS's XCR0 state-saving check) and the choice
 * of kernel set. An override (the `kernels` parameter, or EMBER_KERNELS) lets tests pin a set. */
#include "kernels.h"

#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static ember_cpu_features detect(void) {
    ember_cpu_features f = {0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
    if (!osxsave) return f;
    uint64_t xcr0 = read_xcr0();
    bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    f.avx2 = ymm && (b & (1u << 5));
    f.fma = ymm && fma;
    f.f16c = ymm && f16c;
    f.avx512f = zmm && (b & (1u << 16));
    f.avx512bw = zmm && (b & (1u << 30));
    f.avx512vl = zmm && (b & (1u << 31));
    f.avx512vnni = zmm && (c & (1u << 11));
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = zmm && (a & (1u << 5));
    return f;
}

const ember_cpu_features *ember_cpu(void) {
    static ember_cpu_features features;
    static bool done;
    if (!done) { /* idempotent: a race only recomputes the same value */
        features = detect();
        done = true;
    }
    return &features;
}

const char *ember_kernels_name(ember_kernels k) {
    switch (k) {
    case EMBER_KERNELS_AUTO: return "auto";
    case EMBER_KERNELS_REFERENCE: return "reference";
    case EMBER_KERNELS_AVX2: return "avx2";
    case EMBER_KERNELS_AVX512: return "avx512";
    }
    return "unknown";
}

bool ember_kernels_parse(const char *s, ember_kernels *out) {
    static const ember_kernels all[] = {EMBER_KERNELS_AUTO, EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2,
                                        EMBER_KERNELS_AVX512};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (s && strcmp(s, ember_kernels_name(all[i])) == 0) {
            *out = all[i];
            return true;
        }
    return false;
}

/* The features each SIMD set is compiled for (CMakeLists.txt gives avx2.c / avx512.c these flags). */
bool ember_kernels_supported(ember_kernels k) {
    const ember_cpu_features *f = ember_cpu();
    switch (k) {
    case EMBER_KERNELS_AUTO:
    case EMBER_KERNELS_REFERENCE: return true;
    case EMBER_KERNELS_AVX2: return f->avx2 && f->fma && f->f16c;
    case EMBER_KERNELS_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni;
    }
    return false;
}

const ember_kernel_ops *ember_kernels_select(ember_kernels want, ember_kernels *chosen) {
    if (want == EMBER_KERNELS_AUTO) {
        const char *env = getenv("EMBER_KERNELS");
        ember_kernels k;
        if (env && ember_kernels_parse(env, &k)) want = k;
    }
    if (want == EMBER_KERNELS_AUTO)
        want = ember_kernels_supported(EMBER_KERNELS_AVX512) ? EMBER_KERNELS_AVX512
               : ember_kernels_supported(EMBER_KERNELS_AVX2) ? EMBER_KERNELS_AVX2
                                                              : EMBER_KERNELS_REFERENCE;
    *chosen = want;
    if (!ember_kernels_supported(want)) return NULL; /* an explicit request this CPU cannot run */
    switch (want) {
    case EMBER_KERNELS_AVX2: return &ember_kernels_avx2;
    case EMBER_KERNELS_AVX512: return &ember_kernels_avx512;
    default: return &ember_kernels_reference;
    }
}
