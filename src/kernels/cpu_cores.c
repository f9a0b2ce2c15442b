/* cpu_cores.c — how many threads to use by default: the physical cores this process may run on
 * (hyper-threads share a core's execution units, so a second thread per core mostly waits). The
 * one owner of that count; it reads Linux's CPU topology and never decides anything else. */
#define _GNU_SOURCE
#include "cpu.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CPUS 4096

/* One integer from a small sysfs file; -1 when missing. */
static long read_long(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

/* Counts distinct (package, core) pairs among the allowed CPUs; pairs[] holds them. */
static int add_pair(long *pairs, int n, long pkg, long core) {
    long key = pkg * 1000003L + core;
    for (int i = 0; i < n; i++)
        if (pairs[i] == key) return n;
    pairs[n] = key;
    return n + 1;
}

/* From DIR/cpuN/topology/{physical_package_id,core_id} (DIR is /sys/devices/system/cpu). */
static int cores_from_sysfs(const char *dir, const bool *allowed, long *pairs) {
    int n = 0, missing = 0;
    char path[1024];
    /* CPU numbers may have gaps (offline or absent CPUs), but not hundreds in a row */
    for (int cpu = 0; cpu < MAX_CPUS && missing < 256; cpu++) {
        snprintf(path, sizeof path, "%s/cpu%d/topology/core_id", dir, cpu);
        long core = read_long(path);
        if (core < 0) {
            missing++;
            continue;
        }
        missing = 0;
        if (allowed && !allowed[cpu]) continue;
        snprintf(path, sizeof path, "%s/cpu%d/online", dir, cpu);
        if (read_long(path) == 0) continue; /* offline (cpu0 has no such file: always online) */
        snprintf(path, sizeof path, "%s/cpu%d/topology/physical_package_id", dir, cpu);
        long pkg = read_long(path);
        n = add_pair(pairs, n, pkg < 0 ? 0 : pkg, core);
    }
    return n;
}

/* From /proc/cpuinfo's "processor", "physical id" and "core id" lines (no sysfs, e.g. some
 * containers). */
static int cores_from_cpuinfo(const char *path, const bool *allowed, long *pairs) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[512];
    long cpu = -1, pkg = 0, core = -1;
    int n = 0;
    for (;;) {
        bool eof = fgets(line, sizeof line, f) == NULL;
        if (eof || line[0] == '\n') { /* the end of one processor's block */
            if (cpu >= 0 && core >= 0 && (!allowed || (cpu < MAX_CPUS && allowed[cpu])))
                n = add_pair(pairs, n, pkg, core);
            cpu = -1, pkg = 0, core = -1;
            if (eof) break;
            continue;
        }
        const char *colon = strchr(line, ':');
        if (!colon) continue;
        long v = strtol(colon + 1, NULL, 10);
        if (strncmp(line, "processor", 9) == 0) cpu = v;
        else if (strncmp(line, "physical id", 11) == 0) pkg = v;
        else if (strncmp(line, "core id", 7) == 0) core = v;
    }
    fclose(f);
    return n;
}

int ember_cpu_cores_from(const char *sysfs_dir, const char *cpuinfo_path, const bool *allowed) {
    long *pairs = malloc(MAX_CPUS * sizeof *pairs);
    if (!pairs) return 0;
    int n = sysfs_dir ? cores_from_sysfs(sysfs_dir, allowed, pairs) : 0;
    if (n == 0 && cpuinfo_path) n = cores_from_cpuinfo(cpuinfo_path, allowed, pairs);
    free(pairs);
    return n;
}

int ember_cpu_logical_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int ember_cpu_physical_cores(void) {
    static int cached = 0; /* the topology does not change under a running process we care about */
    if (cached > 0) return cached;
    bool allowed[MAX_CPUS];
    bool *mask = NULL;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int i = 0; i < MAX_CPUS; i++) allowed[i] = i < CPU_SETSIZE && CPU_ISSET(i, &set);
        mask = allowed;
    }
    int n = ember_cpu_cores_from("/sys/devices/system/cpu", "/proc/cpuinfo", mask);
    int logical = ember_cpu_logical_cores();
    if (n <= 0 || n > logical) n = logical; /* unknown topology: every CPU we may use */
    cached = n;
    return n;
}
