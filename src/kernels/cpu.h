/* cpu.h — which kernel sets this CPU can run: the CPU features, the set names, the one parser of
 * EMBER_KERNELS and the one answer to "the best set" (dispatch.c). Public through include/ember.h.
 * Every caller that needs the best set (auto, ember.cpu().kernels, the CLI) asks
 * ember_kernels_best(): there is no second copy of the rule. */
#ifndef EMBER_CPU_H
#define EMBER_CPU_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    EMBER_KERNELS_AUTO = 0,
    EMBER_KERNELS_REFERENCE,
    EMBER_KERNELS_AVX2,
    EMBER_KERNELS_AVX512,
} ember_kernels;
/* One past the last set: the names of 0 .. EMBER_KERNELS_COUNT-1 are the one list of choices
 * (`--kernels`, EMBER_KERNELS, ember.kernel_sets). */
#define EMBER_KERNELS_COUNT (EMBER_KERNELS_AVX512 + 1)

/* One flag per row of the CPU feature table (dispatch.c), in its order. */
typedef struct {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16;
} ember_cpu_features;

/* The feature table: how many features ember detects, feature i's name ("avx2", ...; NULL outside
 * 0..count-1), and whether f has it. The one list of feature names: EMBER_CPU_FEATURES, ember.cpu()
 * and the kernel sets' requirements read it. */
int ember_cpu_feature_count(void);
const char *ember_cpu_feature_name(int i);
bool ember_cpu_feature_on(const ember_cpu_features *f, int i);

/* The features of this CPU and OS (CPUID plus XCR0). For tests, EMBER_CPU_FEATURES (a comma list
 * of the field names, or "none") replaces the detected set by its intersection with it: a test
 * can take features away, never add one the CPU lacks, so an injected set is always runnable. */
const ember_cpu_features *ember_cpu(void);
const char *ember_kernels_name(ember_kernels k);
/* Parses "auto" | "reference" | "avx2" | "avx512"; returns false for anything else. */
bool ember_kernels_parse(const char *s, ember_kernels *out);
/* EMBER_KERNELS from the environment: unset or empty -> AUTO; a value that is not a set name is
 * an EMBER_ERR_ARG error naming the variable. The one place the variable is read. */
ember_status ember_kernels_env(ember_kernels *out, ember_error *err);

/* Whether set k needs feature i (its file is compiled for it; auto and reference need none). */
bool ember_kernels_requires(ember_kernels k, int feature);
/* Whether features f can run set k (auto and reference: always). */
bool ember_kernels_supported_for(ember_kernels k, const ember_cpu_features *f);
bool ember_kernels_supported(ember_kernels k); /* on this CPU */
/* The best set features f can run: avx512, else avx2, else reference. */
ember_kernels ember_kernels_best_for(const ember_cpu_features *f);
/* The best set this CPU can run: what `auto` resolves to without EMBER_KERNELS. */
ember_kernels ember_kernels_best(void);
/* The CPU features set k needs that f lacks, space separated ("" when none). */
void ember_kernels_missing(ember_kernels k, const ember_cpu_features *f, char *buf, size_t cap);

/* The default thread count: the physical cores among the CPUs this process may run on (its
 * affinity mask), from /sys/devices/system/cpu/cpuN/topology (else /proc/cpuinfo's core ids;
 * else every allowed CPU). cpu_cores.c is the one owner of this rule. */
int ember_cpu_physical_cores(void);
/* The CPUs this process may run on (the affinity mask; else the online CPUs). */
int ember_cpu_logical_cores(void);
/* For tests: distinct (package, core) pairs under a sysfs-like directory (NULL: skip), else in a
 * cpuinfo-like file (NULL: skip), counting only CPUs with allowed[cpu] (NULL: all); 0 if none. */
int ember_cpu_cores_from(const char *sysfs_dir, const char *cpuinfo_path, const bool *allowed);

#ifdef __cplusplus
}
#endif
#endif
