/* dispatch.c — CPU feature detection (CPUID plus the OS's XCR0 state-saving check), the rule for
 * which kernel sets a CPU can run, the best set, EMBER_KERNELS, and the choice of table. */
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

/* EMBER_CPU_FEATURES (tests): keep only the listed features; a name that is not a feature keeps
 * nothing ("none" is the conventional way to say so). */
static void mask_features(ember_cpu_features *f, const char *list) {
    ember_cpu_features keep = {0};
    struct {
        const char *name;
        bool *flag;
    } names[] = {
        {"avx2", &keep.avx2},
        {"fma", &keep.fma},
        {"f16c", &keep.f16c},
        {"avx512f", &keep.avx512f},
        {"avx512bw", &keep.avx512bw},
        {"avx512vl", &keep.avx512vl},
        {"avx512vnni", &keep.avx512vnni},
        {"avx512bf16", &keep.avx512bf16},
    };
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strlen(names[i].name) == n && strncmp(p, names[i].name, n) == 0) *names[i].flag = true;
        p += n;
        if (*p == ',') p++;
    }
    f->avx2 &= keep.avx2;
    f->fma &= keep.fma;
    f->f16c &= keep.f16c;
    f->avx512f &= keep.avx512f;
    f->avx512bw &= keep.avx512bw;
    f->avx512vl &= keep.avx512vl;
    f->avx512vnni &= keep.avx512vnni;
    f->avx512bf16 &= keep.avx512bf16;
}

const ember_cpu_features *ember_cpu(void) {
    static ember_cpu_features features;
    static bool done;
    if (!done) { /* idempotent: a race only recomputes the same value */
        ember_cpu_features f = detect();
        const char *inject = getenv("EMBER_CPU_FEATURES");
        if (inject) mask_features(&f, inject);
        features = f;
        done = true;
    }
    return &features;
}

/* The kernel sets in order of preference, best last. */
static const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};

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
    if (s && strcmp(s, "auto") == 0) {
        *out = EMBER_KERNELS_AUTO;
        return true;
    }
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (s && strcmp(s, ember_kernels_name(sets[i])) == 0) {
            *out = sets[i];
            return true;
        }
    return false;
}

ember_status ember_kernels_env(ember_kernels *out, ember_error *err) {
    *out = EMBER_KERNELS_AUTO;
    const char *env = getenv("EMBER_KERNELS");
    if (!env || !env[0]) return EMBER_OK;
    if (!ember_kernels_parse(env, out)) {
        *out = EMBER_KERNELS_AUTO;
        char names[128] = "";
        for (int k = 0; k < EMBER_KERNELS_COUNT; k++) {
            if (k) strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, ember_kernels_name((ember_kernels)k), sizeof names - strlen(names) - 1);
        }
        return ember_error_set(err, EMBER_ERR_ARG, "EMBER_KERNELS='%s' is not one of %s", env, names);
    }
    return EMBER_OK;
}

/* The features each SIMD set is compiled for (CMakeLists.txt gives avx2.c / avx512.c these flags):
 * name, whether avx2 needs it, and where it sits in the features. */
typedef struct {
    const char *name;
    bool for_avx2;
    size_t offset;
} need;
static const need needs[] = {
    {"avx2", true, offsetof(ember_cpu_features, avx2)},
    {"fma", true, offsetof(ember_cpu_features, fma)},
    {"f16c", true, offsetof(ember_cpu_features, f16c)},
    {"avx512f", false, offsetof(ember_cpu_features, avx512f)},
    {"avx512bw", false, offsetof(ember_cpu_features, avx512bw)},
    {"avx512vl", false, offsetof(ember_cpu_features, avx512vl)},
    {"avx512vnni", false, offsetof(ember_cpu_features, avx512vnni)},
};

static bool needed(const need *n, ember_kernels k) {
    return k == EMBER_KERNELS_AVX512 || (k == EMBER_KERNELS_AVX2 && n->for_avx2);
}

static bool has(const ember_cpu_features *f, const need *n) { return *(const bool *)((const char *)f + n->offset); }

bool ember_kernels_supported_for(ember_kernels k, const ember_cpu_features *f) {
    if (k != EMBER_KERNELS_AUTO && k != EMBER_KERNELS_REFERENCE && k != EMBER_KERNELS_AVX2 && k != EMBER_KERNELS_AVX512)
        return false;
    for (size_t i = 0; i < sizeof needs / sizeof needs[0]; i++)
        if (needed(&needs[i], k) && !has(f, &needs[i])) return false;
    return true;
}

bool ember_kernels_supported(ember_kernels k) { return ember_kernels_supported_for(k, ember_cpu()); }

ember_kernels ember_kernels_best_for(const ember_cpu_features *f) {
    ember_kernels best = EMBER_KERNELS_REFERENCE;
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (ember_kernels_supported_for(sets[i], f)) best = sets[i];
    return best;
}

ember_kernels ember_kernels_best(void) { return ember_kernels_best_for(ember_cpu()); }

void ember_kernels_missing(ember_kernels k, const ember_cpu_features *f, char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof needs / sizeof needs[0]; i++) {
        if (!needed(&needs[i], k) || has(f, &needs[i])) continue;
        if (buf[0]) strncat(buf, " ", cap - strlen(buf) - 1);
        strncat(buf, needs[i].name, cap - strlen(buf) - 1);
    }
}

const ember_kernel_ops *ember_kernels_table(ember_kernels k) {
    switch (k) {
    case EMBER_KERNELS_REFERENCE: return &ember_kernels_reference;
    case EMBER_KERNELS_AVX2: return ember_kernels_supported(k) ? &ember_kernels_avx2 : NULL;
    case EMBER_KERNELS_AVX512: return ember_kernels_supported(k) ? &ember_kernels_avx512 : NULL;
    default: return NULL;
    }
}

ember_status ember_kernels_resolve(ember_kernels want, ember_kernels *chosen, const ember_kernel_ops **ops,
                                   ember_error *err) {
    *ops = NULL;
    *chosen = want;
    if (want == EMBER_KERNELS_AUTO) {
        ember_status st = ember_kernels_env(&want, err);
        if (st != EMBER_OK) return st;
    }
    if (want == EMBER_KERNELS_AUTO) want = ember_kernels_best();
    *chosen = want;
    *ops = ember_kernels_table(want);
    if (!*ops) { /* an explicit request this CPU cannot run */
        char missing[128];
        ember_kernels_missing(want, ember_cpu(), missing, sizeof missing);
        return ember_error_set(err, EMBER_ERR_UNSUPPORTED,
                               "kernels '%s' were requested but this CPU/OS lacks %s (use 'auto' or 'reference')",
                               ember_kernels_name(want), missing);
    }
    return EMBER_OK;
}

const ember_kernel_ops *ember_kernels_select(ember_kernels want, ember_kernels *chosen) {
    const ember_kernel_ops *ops;
    ember_kernels_resolve(want, chosen, &ops, NULL);
    return ops;
}
