/* dispatch.c — the CPU feature table (CPUID bit and OS state of each feature), the kernel-set table
 * (each set's name, required features and kernel table), and what they answer: the detected and
 * masked features, which sets a CPU runs, the best one, EMBER_KERNELS. Computes no kernel. */
#include "kernels.h"

#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

/* ---- the feature table ------------------------------------------------------------------------ */

enum { REG_EAX, REG_EBX, REG_ECX, REG_EDX };

/* One CPU feature: its name (EMBER_CPU_FEATURES, ember.cpu(), messages), its flag in
 * ember_cpu_features, where CPUID reports it, and the register state the OS must save for it
 * (XCR0: YMM for the AVX features, ZMM for the AVX-512 ones). */
typedef struct {
    const char *name;
    size_t offset;
    unsigned leaf, subleaf, reg, bit;
    bool zmm;
} cpu_feature;

#define FEATURE(f, leaf, sub, reg, bit, zmm)                                                                           \
    { #f, offsetof(ember_cpu_features, f), leaf, sub, reg, bit, zmm }

/* Indexes of the rows below, for the kernel sets' requirements. */
enum { F_AVX2, F_FMA, F_F16C, F_AVX512F, F_AVX512BW, F_AVX512VL, F_AVX512VNNI, F_AVX512BF16, F_COUNT };

static const cpu_feature features[F_COUNT] = {
    [F_AVX2] = FEATURE(avx2, 7, 0, REG_EBX, 5, false),
    [F_FMA] = FEATURE(fma, 1, 0, REG_ECX, 12, false),
    [F_F16C] = FEATURE(f16c, 1, 0, REG_ECX, 29, false),
    [F_AVX512F] = FEATURE(avx512f, 7, 0, REG_EBX, 16, true),
    [F_AVX512BW] = FEATURE(avx512bw, 7, 0, REG_EBX, 30, true),
    [F_AVX512VL] = FEATURE(avx512vl, 7, 0, REG_EBX, 31, true),
    [F_AVX512VNNI] = FEATURE(avx512vnni, 7, 0, REG_ECX, 11, true),
    [F_AVX512BF16] = FEATURE(avx512bf16, 7, 1, REG_EAX, 5, true),
};

int ember_cpu_feature_count(void) { return F_COUNT; }

const char *ember_cpu_feature_name(int i) { return i >= 0 && i < F_COUNT ? features[i].name : NULL; }

static bool *flag_of(ember_cpu_features *f, int i) { return (bool *)((char *)f + features[i].offset); }

bool ember_cpu_feature_on(const ember_cpu_features *f, int i) {
    return i >= 0 && i < F_COUNT && *(const bool *)((const char *)f + features[i].offset);
}

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Each feature: its CPUID bit, and the OS saving the registers it uses (OSXSAVE, then XCR0). */
static ember_cpu_features detect(void) {
    ember_cpu_features f = {0};
    unsigned r[4];
    if (!__get_cpuid(1, &r[REG_EAX], &r[REG_EBX], &r[REG_ECX], &r[REG_EDX]) || !(r[REG_ECX] & (1u << 27))) return f;
    const uint64_t xcr0 = read_xcr0();
    const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
    for (int i = 0; i < F_COUNT; i++) {
        const cpu_feature *c = &features[i];
        if (!__get_cpuid_count(c->leaf, c->subleaf, &r[REG_EAX], &r[REG_EBX], &r[REG_ECX], &r[REG_EDX])) continue;
        *flag_of(&f, i) = (c->zmm ? zmm : ymm) && (r[c->reg] & (1u << c->bit));
    }
    return f;
}

/* EMBER_CPU_FEATURES (tests): keep only the listed features; a name that is not a feature keeps
 * nothing ("none" is the conventional way to say so). */
static void mask_features(ember_cpu_features *f, const char *list) {
    bool keep[F_COUNT] = {0};
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        for (int i = 0; i < F_COUNT; i++)
            if (strlen(features[i].name) == n && strncmp(p, features[i].name, n) == 0) keep[i] = true;
        p += n;
        if (*p == ',') p++;
    }
    for (int i = 0; i < F_COUNT; i++) *flag_of(f, i) = *flag_of(f, i) && keep[i];
}

const ember_cpu_features *ember_cpu(void) {
    static ember_cpu_features detected;
    static bool done;
    if (!done) { /* idempotent: a race only recomputes the same value */
        ember_cpu_features f = detect();
        const char *inject = getenv("EMBER_CPU_FEATURES");
        if (inject) mask_features(&f, inject);
        detected = f;
        done = true;
    }
    return &detected;
}

/* ---- the kernel-set table --------------------------------------------------------------------- */

#define NEEDS(f) (1u << (f))
#define AVX2_NEEDS (NEEDS(F_AVX2) | NEEDS(F_FMA) | NEEDS(F_F16C))

/* One kernel set: its name (--kernels, EMBER_KERNELS, messages), the features it is compiled for
 * (CMakeLists.txt gives its file -m<feature> for each, and no other instruction-set flag:
 * tests/check_kernel_flags.sh compares them) and its table. In order of preference, best last. */
typedef struct {
    const char *name;
    unsigned needs; /* NEEDS(F_...) bits */
    const ember_kernel_ops *ops;
} kernel_set;

static const kernel_set sets[EMBER_KERNELS_COUNT] = {
    [EMBER_KERNELS_AUTO] = {"auto", 0, NULL},
    [EMBER_KERNELS_REFERENCE] = {"reference", 0, &ember_kernels_reference},
    [EMBER_KERNELS_AVX2] = {"avx2", AVX2_NEEDS, &ember_kernels_avx2},
    [EMBER_KERNELS_AVX512] = {"avx512",
                              AVX2_NEEDS | NEEDS(F_AVX512F) | NEEDS(F_AVX512BW) | NEEDS(F_AVX512VL) |
                                  NEEDS(F_AVX512VNNI),
                              &ember_kernels_avx512},
};

static bool is_set(ember_kernels k) { return (unsigned)k < EMBER_KERNELS_COUNT; }

const char *ember_kernels_name(ember_kernels k) { return is_set(k) ? sets[k].name : "unknown"; }

bool ember_kernels_requires(ember_kernels k, int feature) {
    return is_set(k) && feature >= 0 && feature < F_COUNT && (sets[k].needs & NEEDS(feature));
}

bool ember_kernels_parse(const char *s, ember_kernels *out) {
    for (int k = 0; s && k < EMBER_KERNELS_COUNT; k++)
        if (strcmp(s, sets[k].name) == 0) {
            *out = (ember_kernels)k;
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
            strncat(names, sets[k].name, sizeof names - strlen(names) - 1);
        }
        return ember_error_set(err, EMBER_ERR_ARG, "EMBER_KERNELS='%s' is not one of %s", env, names);
    }
    return EMBER_OK;
}

bool ember_kernels_supported_for(ember_kernels k, const ember_cpu_features *f) {
    if (!is_set(k)) return false;
    for (int i = 0; i < F_COUNT; i++)
        if ((sets[k].needs & NEEDS(i)) && !ember_cpu_feature_on(f, i)) return false;
    return true;
}

bool ember_kernels_supported(ember_kernels k) { return ember_kernels_supported_for(k, ember_cpu()); }

ember_kernels ember_kernels_best_for(const ember_cpu_features *f) {
    ember_kernels best = EMBER_KERNELS_REFERENCE;
    for (int k = EMBER_KERNELS_REFERENCE; k < EMBER_KERNELS_COUNT; k++)
        if (ember_kernels_supported_for((ember_kernels)k, f)) best = (ember_kernels)k;
    return best;
}

ember_kernels ember_kernels_best(void) { return ember_kernels_best_for(ember_cpu()); }

void ember_kernels_missing(ember_kernels k, const ember_cpu_features *f, char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    for (int i = 0; is_set(k) && i < F_COUNT; i++) {
        if (!(sets[k].needs & NEEDS(i)) || ember_cpu_feature_on(f, i)) continue;
        if (buf[0]) strncat(buf, " ", cap - strlen(buf) - 1);
        strncat(buf, features[i].name, cap - strlen(buf) - 1);
    }
}

const ember_kernel_ops *ember_kernels_table(ember_kernels k) {
    return is_set(k) && ember_kernels_supported(k) ? sets[k].ops : NULL;
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
