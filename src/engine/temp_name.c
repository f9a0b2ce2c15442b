/* temp_name.c — the one temporaries rule: how a writer names the temporary it renames into place,
 * and when a leftover temporary may be swept. Every atomic writer (lib/ember through
 * ember.core.internal, and the engine's own: the model digest cache) names and sweeps through here.
 *
 *   NAME.ember-tmp-BOOT-PIDNS-PID-RANDOM
 *
 * BOOT: the first 16 hex digits of /proc/sys/kernel/random/boot_id (another machine, or this one
 * after a reboot, has another); PIDNS: the inode of /proc/self/ns/pid (a container has another,
 * where the same pid is someone else); PID: the writer's; RANDOM: 16 hex digits. "0" where the
 * identity cannot be read: such temporaries are never swept, since nothing proves their writer
 * dead. The mark ".ember-tmp-" is ember's alone, so a user's "keep.tmp-99999-cafe" is never one. */
#include "ember_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_boot[17] = "0";
static uint64_t g_pidns;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void read_identity(void) {
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char text[64], hex[17];
        ssize_t n = read(fd, text, sizeof text);
        close(fd);
        size_t k = 0;
        for (ssize_t i = 0; i < n && k < 16; i++) {
            char c = text[i];
            if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')) hex[k++] = c;
        }
        hex[k] = 0;
        if (k == 16) memcpy(g_boot, hex, sizeof hex);
    }
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0) g_pidns = (uint64_t)st.st_ino;
}

static bool identity_known(void) {
    pthread_once(&g_once, read_identity);
    return strcmp(g_boot, "0") != 0 && g_pidns != 0;
}

static uint64_t random_tag(void) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ (uintptr_t)&r;
    }
    return r;
}

bool ember_temp_sibling(const char *path, char *buf, size_t n) {
    (void)identity_known();
    int w = snprintf(buf, n, "%s%s%s-%" PRIu64 "-%ld-%016" PRIx64, path, EMBER_TEMP_MARK, g_boot, g_pidns,
                     (long)getpid(), random_tag());
    return w > 0 && (size_t)w < n;
}

/* Parses "<hex or digits>-" at *p into [start, end) of the field; false when empty. */
static bool field(const char **p, bool hex, const char **start, size_t *len) {
    const char *s = *p;
    while ((*s >= '0' && *s <= '9') || (hex && ((*s >= 'a' && *s <= 'f') || (*s >= 'A' && *s <= 'F')))) s++;
    if (s == *p) return false;
    *start = *p;
    *len = (size_t)(s - *p);
    *p = s;
    return true;
}

static bool decimal(const char *s, size_t len, uint64_t *out) {
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10) return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

bool ember_temp_writer_dead(const char *name) {
    /* the last mark: NAME itself may contain one */
    const char *at = NULL;
    for (const char *s = strstr(name, EMBER_TEMP_MARK); s; s = strstr(s + 1, EMBER_TEMP_MARK)) at = s;
    if (!at || !identity_known()) return false;
    const char *p = at + strlen(EMBER_TEMP_MARK), *f[4];
    size_t len[4];
    for (int i = 0; i < 4; i++) {
        if (!field(&p, i == 0 || i == 3, &f[i], &len[i])) return false;
        if (i < 3 && *p++ != '-') return false;
    }
    if (*p != 0) return false;
    uint64_t ns, pid;
    if (len[0] != 16 || memcmp(f[0], g_boot, 16) != 0) return false;
    if (!decimal(f[1], len[1], &ns) || ns != g_pidns) return false;
    if (!decimal(f[2], len[2], &pid) || pid == 0 || pid > INT32_MAX || (pid_t)pid == getpid()) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int ember_temp_sweep_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!strstr(e->d_name, EMBER_TEMP_MARK) || !ember_temp_writer_dead(e->d_name)) continue;
        struct stat st;
        /* files only: the engine's writers make no directories (lib/ember sweeps its own trees) */
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode) &&
            unlinkat(dirfd(d), e->d_name, 0) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
