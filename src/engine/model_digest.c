/* model_digest.c — the SHA-256 of a model file for provenance: answered from a cache keyed by the
 * file's identity, or computed on a low-priority background thread. Never trusts a changed key. */
#include "ember.h"
#include "ember_internal.h"
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/sha256.h>

/* One cache entry per (device, inode), so a file that changes in place replaces its own entry
 * instead of leaving stale ones behind. The text format (no JSON in the engine):
 *
 *   ember-model-sha256 1
 *   dev <u64>
 *   ino <u64>
 *   size <u64>
 *   mtime_ns <i64>
 *   sha256 <64 lowercase hex>
 *   path <the path it was hashed under: for people reading the directory, never compared>
 *
 * Anything else (a short read, a missing line, a stray byte) is a miss: re-hash, never an error. */
#define DIGEST_MAGIC "ember-model-sha256 1"
#define DIGEST_SUBDIR "model-sha256"
#define DIGEST_CHUNK ((size_t)1 << 20)
/* A file modified less than this long before hashing started is hashed but not cached: a second
 * write within the file system's timestamp granularity could leave the key unchanged ("racily
 * clean", as git calls it). Coarse clocks and FAT-like file systems tick in up to 2 s. */
#define DIGEST_RACY_NS (2LL * 1000000000LL)

typedef struct {
    uint64_t dev, ino, size;
    int64_t mtime_ns;
} digest_key;

struct ember_digest {
    char *path;
    char *entry_path; /* cache file for this key, or NULL when there is no cache directory */
    digest_key key;
    ember_digest_source source;
    int64_t started_ns; /* CLOCK_REALTIME when hashing began, for the racy-clean rule */

    /* Hashing state, shared by the background thread and a waiter: whoever holds `mu` hashes
     * the next chunk, so the waiter finishes at its own priority what the background thread
     * (niced) has not reached yet. */
    pthread_mutex_t mu;
    int fd;
    uint64_t offset;
    mbedtls_sha256_context ctx;
    unsigned char *buf; /* (DIGEST_CHUNK) */
    bool done;
    ember_status status;
    char msg[512];
    char hex[65];

    bool has_thread;
    pthread_t thread;
    atomic_bool cancel;
};

const char *ember_digest_source_name(ember_digest_source s) { return s == EMBER_DIGEST_CACHED ? "cached" : "fresh"; }

static digest_key key_of(const struct stat *st) {
    digest_key k = {.dev = (uint64_t)st->st_dev,
                    .ino = (uint64_t)st->st_ino,
                    .size = (uint64_t)st->st_size,
                    .mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec};
    return k;
}

static bool key_equal(const digest_key *a, const digest_key *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

bool ember_digest_cache_dir(char *buf, size_t n) {
    /* XDG: a relative XDG_CACHE_HOME is invalid and must be ignored */
    const char *xdg = getenv("XDG_CACHE_HOME");
    int w = -1;
    if (xdg && xdg[0] == '/') w = snprintf(buf, n, "%s/ember", xdg);
    else {
        const char *home = getenv("HOME");
        if (home && home[0] == '/') w = snprintf(buf, n, "%s/.cache/ember", home);
    }
    return w > 0 && (size_t)w < n;
}

/* mkdir -p for the cache directory (owner-only: the entries name the user's files). */
static bool make_dirs(const char *dir) {
    char tmp[PATH_MAX];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof tmp) return false;
    memcpy(tmp, dir, len + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return false;
        *p = '/';
    }
    return mkdir(tmp, 0700) == 0 || errno == EEXIST;
}

/* Parses "<name> <unsigned decimal>\n" at *p; advances past it. */
static bool parse_u64_line(const char **p, const char *name, uint64_t *out) {
    size_t nl = strlen(name);
    if (strncmp(*p, name, nl) != 0 || (*p)[nl] != ' ') return false;
    const char *s = *p + nl + 1;
    if (*s < '0' || *s > '9') return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10) return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (*s != '\n') return false;
    *out = v;
    *p = s + 1;
    return true;
}

/* Reads the entry for key; true only for a well-formed entry whose every key field matches. */
static bool cache_lookup(const char *entry_path, const digest_key *key, char hex[65]) {
    FILE *f = fopen(entry_path, "rb");
    if (!f) return false;
    char text[PATH_MAX + 512];
    size_t n = fread(text, 1, sizeof text - 1, f);
    bool complete = feof(f) && !ferror(f);
    fclose(f);
    if (!complete) return false; /* an entry is never this long: not ours */
    text[n] = 0;
    if (strlen(text) != n) return false; /* NUL bytes */
    const char *p = text;
    size_t ml = strlen(DIGEST_MAGIC);
    if (strncmp(p, DIGEST_MAGIC, ml) != 0 || p[ml] != '\n') return false;
    p += ml + 1;
    digest_key k;
    uint64_t mtime;
    if (!parse_u64_line(&p, "dev", &k.dev) || !parse_u64_line(&p, "ino", &k.ino) ||
        !parse_u64_line(&p, "size", &k.size) || !parse_u64_line(&p, "mtime_ns", &mtime) || mtime > INT64_MAX)
        return false;
    k.mtime_ns = (int64_t)mtime;
    if (!key_equal(&k, key)) return false;
    if (strncmp(p, "sha256 ", 7) != 0) return false;
    p += 7;
    for (int i = 0; i < 64; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return false;
    if (p[64] != '\n') return false;
    if (strncmp(p + 65, "path ", 5) != 0 || text[n - 1] != '\n') return false;
    memcpy(hex, p, 64);
    hex[64] = 0;
    return true;
}

/* Sweeps the killed writers' temporaries from the entry's directory, then writes the entry
 * through a temporary of its own (the temporaries rule, ember_temp_sibling) and rename(): readers
 * see the old entry or the new one, never half of one. Failures are silent: the cache only saves
 * time. */
static void cache_store(const char *entry_path, const digest_key *key, const char hex[65], const char *path) {
    char tmp[PATH_MAX];
    const char *slash = strrchr(entry_path, '/');
    if (slash && (size_t)(slash - entry_path) < sizeof tmp) {
        memcpy(tmp, entry_path, (size_t)(slash - entry_path));
        tmp[slash - entry_path] = 0;
        (void)ember_temp_sweep_files(slash == entry_path ? "/" : tmp);
    }
    if (!ember_temp_sibling(entry_path, tmp, sizeof tmp)) return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        return;
    }
    fprintf(f, "%s\ndev %" PRIu64 "\nino %" PRIu64 "\nsize %" PRIu64 "\nmtime_ns %" PRId64 "\nsha256 %s\npath ",
            DIGEST_MAGIC, key->dev, key->ino, key->size, key->mtime_ns, hex);
    for (const char *c = path; *c; c++) fputc(*c == '\n' ? '?' : *c, f); /* one line, whatever the name */
    fputc('\n', f);
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, entry_path) != 0) unlink(tmp);
}

/* Hashes the next chunk; true while there is more. Caller holds d->mu. At the end the file must
 * still have the key it had when it was opened: otherwise the bytes read may mix two versions. */
static bool hash_step(ember_digest *d) {
    if (d->done) return false;
    ssize_t got = pread(d->fd, d->buf, DIGEST_CHUNK, (off_t)d->offset);
    if (got < 0 && errno == EINTR) return true;
    if (got > 0) {
        mbedtls_sha256_update_ret(&d->ctx, d->buf, (size_t)got);
        d->offset += (uint64_t)got;
        if (d->offset < d->key.size) return true;
    }
    d->done = true;
    struct stat st;
    digest_key now = {0};
    if (got < 0) {
        d->status = EMBER_ERR_IO;
        snprintf(d->msg, sizeof d->msg, "%s: read error while hashing: %s", d->path, strerror(errno));
    } else if (d->offset != d->key.size || fstat(d->fd, &st) != 0 || (now = key_of(&st), !key_equal(&now, &d->key))) {
        d->status = EMBER_ERR_IO;
        snprintf(d->msg, sizeof d->msg,
                 "%s: the file changed while it was being hashed (size or modification "
                 "time); its digest would not describe any one version of it",
                 d->path);
    } else {
        unsigned char digest[32];
        mbedtls_sha256_finish_ret(&d->ctx, digest);
        ember_sha256_digest_hex(digest, d->hex);
        d->status = EMBER_OK;
        if (d->entry_path && d->key.mtime_ns < d->started_ns - DIGEST_RACY_NS)
            cache_store(d->entry_path, &d->key, d->hex, d->path);
    }
    close(d->fd);
    d->fd = -1;
    free(d->buf);
    d->buf = NULL;
    return false;
}

/* The background thread: niced so that it takes only CPU time the evaluation leaves idle (the
 * first token is never delayed by it); a waiter takes over at its own priority. */
static void *digest_thread(void *arg) {
    ember_digest *d = arg;
#ifdef SYS_gettid
    /* Linux: a thread id here lowers this thread only (setpriority(2), NOTES) */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
#endif
    for (;;) {
        if (atomic_load(&d->cancel)) break;
        pthread_mutex_lock(&d->mu);
        bool more = hash_step(d);
        pthread_mutex_unlock(&d->mu);
        if (!more) break;
    }
    return NULL;
}

ember_status ember_digest_start(const char *path, const char *cache_dir, bool fresh, ember_digest **out,
                                ember_error *err) {
    *out = NULL;
    if (!path || !*path) return ember_error_set(err, EMBER_ERR_ARG, "model digest: no file path given");
    ember_digest *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) {
        free(d);
        return ember_error_set(err, EMBER_ERR_NOMEM, "model digest: out of memory");
    }
    struct stat st;
    /* the regular-file gate: a FIFO or a device is an error naming it, never a hang */
    ember_status gate = ember_file_open_regular(path, &d->fd, &st, err);
    if (gate != EMBER_OK) {
        free(d->path);
        free(d);
        return gate;
    }
    /* the key of the bytes this descriptor reads, not of whatever the path names later */
    d->key = key_of(&st);
    d->started_ns = now_ns();
    pthread_mutex_init(&d->mu, NULL);
    atomic_init(&d->cancel, false);

    char dir[PATH_MAX];
    bool have_dir = cache_dir ? (snprintf(dir, sizeof dir, "%s", cache_dir) < (int)sizeof dir)
                              : ember_digest_cache_dir(dir, sizeof dir);
    if (have_dir) {
        char sub[PATH_MAX], entry[PATH_MAX];
        int w1 = snprintf(sub, sizeof sub, "%s/%s", dir, DIGEST_SUBDIR);
        int w2 = snprintf(entry, sizeof entry, "%s/%" PRIu64 "-%" PRIu64, sub, d->key.dev, d->key.ino);
        if (w1 > 0 && w1 < (int)sizeof sub && w2 > 0 && w2 < (int)sizeof entry && make_dirs(sub))
            d->entry_path = strdup(entry);
    }

    if (!fresh && d->entry_path && cache_lookup(d->entry_path, &d->key, d->hex)) {
        d->source = EMBER_DIGEST_CACHED;
        d->done = true;
        d->status = EMBER_OK;
        close(d->fd);
        d->fd = -1;
        *out = d;
        return EMBER_OK;
    }

    d->source = EMBER_DIGEST_FRESH;
    mbedtls_sha256_init(&d->ctx);
    mbedtls_sha256_starts_ret(&d->ctx, 0);
    d->buf = malloc(DIGEST_CHUNK);
    if (!d->buf) {
        ember_digest_free(d);
        return ember_error_set(err, EMBER_ERR_NOMEM, "model digest: out of memory");
    }
    /* Without a thread the waiter hashes everything itself: slower to finish, still correct. */
    d->has_thread = pthread_create(&d->thread, NULL, digest_thread, d) == 0;
    *out = d;
    return EMBER_OK;
}

ember_status ember_digest_wait(ember_digest *d, char hex[65], ember_digest_source *source, ember_error *err) {
    pthread_mutex_lock(&d->mu);
    while (hash_step(d)) continue; /* the rest, in file order, at the caller's priority */
    ember_status st = d->status;
    if (st == EMBER_OK) {
        memcpy(hex, d->hex, 65);
        if (source) *source = d->source;
    } else {
        ember_error_set(err, st, "%s", d->msg);
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

void ember_digest_free(ember_digest *d) {
    if (!d) return;
    if (d->has_thread) {
        atomic_store(&d->cancel, true);
        pthread_join(d->thread, NULL);
    }
    if (d->fd >= 0) close(d->fd);
    if (d->source == EMBER_DIGEST_FRESH) mbedtls_sha256_free(&d->ctx);
    pthread_mutex_destroy(&d->mu);
    free(d->buf);
    free(d->entry_path);
    free(d->path);
    free(d);
}
