/* memory.c — the memory still available to this process (MemAvailable, RLIMIT_AS headroom), read
 * when a session is sized. Must not allocate the memory it reports on. */
#include "memory.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return UINT64_MAX;
    char line[256];
    uint64_t kib = UINT64_MAX;
    unsigned long long v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
            kib = (uint64_t)v;
            break;
        }
    }
    fclose(f);
    return kib == UINT64_MAX || kib > UINT64_MAX / 1024 ? UINT64_MAX : kib * 1024;
}

/* RLIMIT_AS minus the address space already in use (/proc/self/statm's first field). */
static uint64_t as_headroom(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1) pages = 0;
        fclose(f);
    }
    long ps = sysconf(_SC_PAGESIZE);
    uint64_t used = (uint64_t)pages * (uint64_t)(ps > 0 ? ps : 4096);
    return (uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 0;
}

uint64_t ember_memory_available(const char **source) {
    uint64_t avail = mem_available(), as = as_headroom();
    *source = "no limit known";
    if (avail != UINT64_MAX) *source = "MemAvailable";
    if (as < avail) {
        avail = as;
        *source = "RLIMIT_AS";
    }
    return avail;
}
