/* test_model_digest.c — the cached model digest: a fresh hash equals SHA-256 of the bytes, an
 * unchanged file is answered from the cache, a changed key (mtime, size) or a corrupt entry means
 * a new hash, `fresh` ignores the cache, a just-modified file is not cached, and the background
 * thread can be abandoned or overtaken at any point. The cache's temporaries follow the one
 * temporaries rule: named with ember's mark and the writer's boot, namespace and pid, and a killed
 * writer's are swept before an entry is written, nobody else's. */
#define _GNU_SOURCE /* nftw */
#include "test_support.h"

#include "ember.h"
#include "ember_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>

#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_dir[512], g_cache[600], g_file[600];

/* Sets the file's modification time to `sec` seconds (plus `nsec`) since the epoch. */
static bool set_mtime(const char *path, time_t sec, long nsec) {
    struct timespec ts[2] = {{.tv_sec = sec, .tv_nsec = nsec}, {.tv_sec = sec, .tv_nsec = nsec}};
    return utimensat(AT_FDCWD, path, ts, 0) == 0;
}

/* Writes n pseudo-random bytes (seeded) to path; returns them (malloc'd). */
static unsigned char *write_bytes(const char *path, size_t n, uint32_t seed) {
    unsigned char *b = malloc(n ? n : 1);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (unsigned char)(x >> 24);
    }
    if (!ember_write_file(path, b, n)) {
        free(b);
        return NULL;
    }
    return b;
}

/* One start + wait; the digest and its source through out parameters. */
static ember_status digest(bool fresh, char hex[65], ember_digest_source *src, ember_error *err) {
    ember_digest *d = NULL;
    ember_status st = ember_digest_start(g_file, g_cache, fresh, &d, err);
    if (st != EMBER_OK) return st;
    st = ember_digest_wait(d, hex, src, err);
    ember_digest_free(d);
    return st;
}

/* The one cache entry's path (there is exactly one file under model-sha256/). */
static bool entry_path(char *out, size_t n) {
    struct stat st;
    if (stat(g_file, &st) != 0) return false;
    snprintf(out, n, "%s/model-sha256/%llu-%llu", g_cache, (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    return access(out, F_OK) == 0;
}

/* The entry's "sha256 <hex>" line (the first line's magic also contains the word). */
static char *digest_line(char *text) {
    char *at = strstr(text, "\nsha256 ");
    return at ? at + 1 : NULL;
}

static void test_known_vector(void) {
    /* FIPS 180-2 example: SHA-256("abc") */
    ember_write_file(g_file, "abc", 3);
    set_mtime(g_file, 1000000000, 0);
    char hex[65];
    ember_digest_source src;
    ember_error err = {0};
    CHECK(digest(true, hex, &src, &err) == EMBER_OK);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
    CHECK(src == EMBER_DIGEST_FRESH);
    CHECK(strcmp(ember_digest_source_name(EMBER_DIGEST_FRESH), "fresh") == 0);
    CHECK(strcmp(ember_digest_source_name(EMBER_DIGEST_CACHED), "cached") == 0);
}

static void test_cache_cycle(void) {
    /* several chunks and a tail, so the background thread and the waiter share the work */
    const size_t n = (size_t)3 * (1 << 20) + 12345;
    unsigned char *bytes = write_bytes(g_file, n, 1);
    CHECK(bytes != NULL);
    char want[65];
    ember_sha256_hex(bytes, n, want);
    CHECK(set_mtime(g_file, 1500000000, 123456789));

    char hex[65], entry[700];
    ember_digest_source src = EMBER_DIGEST_CACHED;
    ember_error err = {0};
    CHECK(digest(false, hex, &src, &err) == EMBER_OK);
    CHECK_MSG(strcmp(hex, want) == 0, "fresh digest %s, want %s", hex, want);
    CHECK(src == EMBER_DIGEST_FRESH);
    CHECK(entry_path(entry, sizeof entry));

    /* unchanged file: the cache answers */
    src = EMBER_DIGEST_FRESH;
    CHECK(digest(false, hex, &src, &err) == EMBER_OK);
    CHECK(src == EMBER_DIGEST_CACHED);
    CHECK(strcmp(hex, want) == 0);

    /* The answer really comes from the entry, not from hashing: a forged digest under the same
     * key is returned as it is. */
    size_t len;
    char *text = ember_read_file(entry, &len);
    CHECK(text != NULL);
    char *at = text ? digest_line(text) : NULL;
    CHECK(at != NULL);
    if (at) {
        memset(at + 7, 'e', 64);
        ember_write_file(entry, text, len);
    }
    CHECK(digest(false, hex, &src, &err) == EMBER_OK);
    CHECK(src == EMBER_DIGEST_CACHED);
    CHECK(hex[0] == 'e' && hex[63] == 'e');

    /* fresh (--verify-model) ignores the entry and rewrites it with the true digest */
    CHECK(digest(true, hex, &src, &err) == EMBER_OK);
    CHECK(src == EMBER_DIGEST_FRESH);
    CHECK(strcmp(hex, want) == 0);
    CHECK(digest(false, hex, &src, &err) == EMBER_OK);
    CHECK(src == EMBER_DIGEST_CACHED && strcmp(hex, want) == 0);

    /* touching the file (a new modification time, 1 ns apart) means a new hash: forge the entry
     * first so that trusting it would show */
    if (at) {
        free(text);
        text = ember_read_file(entry, &len);
        at = text ? digest_line(text) : NULL;
        if (at) {
            memset(at + 7, 'e', 64);
            ember_write_file(entry, text, len);
        }
    }
    CHECK(set_mtime(g_file, 1500000000, 123456790));
    CHECK(digest(false, hex, &src, &err) == EMBER_OK);
    CHECK(src == EMBER_DIGEST_FRESH);
    CHECK(strcmp(hex, want) == 0);

    /* a different size under the old modification time: new hash, new digest */
    unsigned char *other = write_bytes(g_file, n - 1, 2);
    char want2[65];
    ember_sha256_hex(other, n - 1, want2);
    CHECK(set_mtime(g_file, 1500000000, 123456790));
    CHECK(digest(false, hex, &src, &err) == EMBER_OK);
    CHECK(src == EMBER_DIGEST_FRESH);
    CHECK(strcmp(hex, want2) == 0);
    free(other);
    free(text);
    free(bytes);
}

static void test_corrupt_entries(void) {
    unsigned char *bytes = write_bytes(g_file, 70000, 3);
    char want[65], hex[65], entry[700];
    ember_sha256_hex(bytes, 70000, want);
    set_mtime(g_file, 1600000000, 0);
    ember_digest_source src;
    ember_error err = {0};
    CHECK(digest(false, hex, &src, &err) == EMBER_OK && src == EMBER_DIGEST_FRESH);
    CHECK(entry_path(entry, sizeof entry));
    size_t len;
    char *good = ember_read_file(entry, &len);
    CHECK(good != NULL && len > 100);
    if (!good) return;

    /* each corruption is a miss: the true digest, freshly computed, and no error */
    struct {
        const char *what;
        size_t keep;
        const char *append;
    } cases[] = {
        {"empty", 0, ""},        {"truncated in the digest", 0, NULL},     {"garbage", 0, "\x01\x02 not an entry\n"},
        {"a NUL byte", 0, NULL}, {"a second digest digit short", 0, NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char buf[4096];
        size_t n = 0;
        if (c == 0) n = 0;
        else if (c == 1) {
            char *at = digest_line(good);
            n = (size_t)(at - good) + 7 + 30;
            memcpy(buf, good, n);
        } else if (c == 2) {
            n = strlen(cases[c].append);
            memcpy(buf, cases[c].append, n);
        } else if (c == 3) {
            memcpy(buf, good, len);
            buf[10] = 0;
            n = len;
        } else {
            char *at = digest_line(good);
            size_t head = (size_t)(at - good) + 7 + 63;
            memcpy(buf, good, head);
            memcpy(buf + head, good + head + 1, len - head - 1);
            n = len - 1;
        }
        ember_write_file(entry, buf, n);
        src = EMBER_DIGEST_CACHED;
        memset(hex, 0, sizeof hex);
        CHECK_MSG(digest(false, hex, &src, &err) == EMBER_OK, "%s: %.300s", cases[c].what, err.msg);
        CHECK_MSG(src == EMBER_DIGEST_FRESH, "%s: was trusted", cases[c].what);
        CHECK_MSG(strcmp(hex, want) == 0, "%s: digest %s", cases[c].what, hex);
        /* and the entry is whole again */
        CHECK_MSG(digest(false, hex, &src, &err) == EMBER_OK && src == EMBER_DIGEST_CACHED, "%s: not rewritten",
                  cases[c].what);
    }
    free(good);
    free(bytes);
}

static void test_racy_and_unwritable(void) {
    unsigned char *bytes = write_bytes(g_file, 5000, 4);
    char want[65], hex[65];
    ember_sha256_hex(bytes, 5000, want);
    ember_digest_source src;
    ember_error err = {0};
    /* just written (mtime = now): hashed, but not cached, since a second write in the same tick
     * of the file system's clock would keep the key */
    CHECK(digest(false, hex, &src, &err) == EMBER_OK && src == EMBER_DIGEST_FRESH && strcmp(hex, want) == 0);
    CHECK(digest(false, hex, &src, &err) == EMBER_OK && src == EMBER_DIGEST_FRESH);

    /* a cache directory that cannot exist (under a regular file): still a correct digest */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/cache-is-a-file", g_dir);
    ember_write_file(bad, "x", 1);
    set_mtime(g_file, 1700000000, 0);
    ember_digest *d = NULL;
    CHECK(ember_digest_start(g_file, bad, false, &d, &err) == EMBER_OK);
    CHECK(d && ember_digest_wait(d, hex, &src, &err) == EMBER_OK && strcmp(hex, want) == 0 &&
          src == EMBER_DIGEST_FRESH);
    /* waiting twice gives the same answer */
    CHECK(d && ember_digest_wait(d, hex, &src, &err) == EMBER_OK && strcmp(hex, want) == 0);
    ember_digest_free(d);
    free(bytes);
}

static void test_abandon_and_errors(void) {
    unsigned char *bytes = write_bytes(g_file, (size_t)8 << 20, 5);
    set_mtime(g_file, 1700000001, 0);
    ember_error err = {0};
    /* freed at once and after a moment: the thread stops between chunks */
    for (int i = 0; i < 2; i++) {
        ember_digest *d = NULL;
        CHECK(ember_digest_start(g_file, g_cache, true, &d, &err) == EMBER_OK);
        if (i) usleep(2000);
        ember_digest_free(d);
    }
    ember_digest_free(NULL);

    char missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-model.gguf", g_dir);
    ember_digest *d = (ember_digest *)1;
    CHECK(ember_digest_start(missing, g_cache, false, &d, &err) == EMBER_ERR_IO);
    CHECK(d == NULL);
    CHECK_MSG(strstr(err.msg, "no-such-model.gguf") != NULL, "message: %.300s", err.msg);
    /* a FIFO is refused at once (opening it for reading would wait for a writer forever) */
    char fifo[700];
    snprintf(fifo, sizeof fifo, "%s/model.fifo", g_dir);
    if (mkfifo(fifo, 0600) == 0) {
        d = (ember_digest *)1;
        CHECK(ember_digest_start(fifo, g_cache, false, &d, &err) == EMBER_ERR_IO && d == NULL);
        CHECK_MSG(strstr(err.msg, "FIFO") != NULL, "message: %.300s", err.msg);
    }
    free(bytes);
}

/* This boot's id (16 hex digits) and PID namespace inode, read here by other means than the
 * engine's: false where the system has neither. */
static bool identity(char boot[17], unsigned long long *ns) {
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return false;
    int k = 0, c;
    while (k < 16 && (c = fgetc(f)) != EOF)
        if (c != '-') boot[k++] = (char)c;
    boot[k] = 0;
    fclose(f);
    struct stat st;
    if (k != 16 || stat("/proc/self/ns/pid", &st) != 0) return false;
    *ns = (unsigned long long)st.st_ino;
    return true;
}

/* How many entries of the directory have `part` in their names. */
static int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += strstr(e->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

static void test_killed_writers_temporaries(void) {
    char boot[17];
    unsigned long long ns;
    if (!identity(boot, &ns)) {
        printf("SKIP killed writers' temporaries: no boot id or PID namespace here\n");
        return;
    }
    unsigned char *bytes = write_bytes(g_file, 4096, 9);
    CHECK(bytes && set_mtime(g_file, 1600000000, 0));
    free(bytes);
    struct stat st;
    CHECK(stat(g_file, &st) == 0);
    char sub[700], entry[800], t[7][900], own[900];
    snprintf(sub, sizeof sub, "%s/model-sha256", g_cache);
    snprintf(entry, sizeof entry, "%s/%llu-%llu", sub, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    /* 4194305: above Linux's largest pid_max (2^22), so no such process runs; pid 1 always runs */
    const char *dead = "4194305";
    snprintf(t[0], sizeof t[0], "%s.ember-tmp-%s-%llu-%s-0123456789abcdef", entry, boot, ns, dead);
    snprintf(t[1], sizeof t[1], "%s/9-9.ember-tmp-%s-%llu-%s-fedcba9876543210", sub, boot, ns, dead);
    snprintf(t[2], sizeof t[2], "%s.ember-tmp-%s-%llu-1-0123456789abcdef", entry, boot, ns); /* live */
    snprintf(t[3], sizeof t[3], "%s.ember-tmp-%c%s-%llu-%s-0123456789abcdef", entry, boot[0] == 'a' ? 'b' : 'a',
             boot + 1, ns, dead); /* another boot */
    snprintf(t[4], sizeof t[4], "%s.ember-tmp-%s-%llu-%s-0123456789abcdef", entry, boot, ns + 1, dead); /* another ns */
    snprintf(t[5], sizeof t[5], "%s.tmp-Ab12Cd", entry);        /* the form earlier versions wrote */
    snprintf(t[6], sizeof t[6], "%s/keep.tmp-99999-cafe", sub); /* someone else's */
    CHECK(mkdir(g_cache, 0700) == 0 || errno == EEXIST);
    CHECK(mkdir(sub, 0700) == 0 || errno == EEXIST);
    for (int i = 0; i < 7; i++) CHECK(ember_write_file(t[i], "partial", 7));

    char hex[65];
    ember_digest_source src;
    ember_error err = {0};
    CHECK(digest(true, hex, &src, &err) == EMBER_OK && src == EMBER_DIGEST_FRESH);
    CHECK_MSG(access(t[0], F_OK) != 0 && access(t[1], F_OK) != 0, "a killed writer's temporary was not swept");
    for (int i = 2; i < 7; i++) CHECK_MSG(access(t[i], F_OK) == 0, "'%s' was swept", t[i]);
    /* the entry written; of the temporaries only the three not provably dead are left: this
     * writer left none of its own behind */
    CHECK(access(entry, F_OK) == 0);
    CHECK_MSG(count_entries(sub, EMBER_TEMP_MARK) == 3, "%d temporaries left, want 3",
              count_entries(sub, EMBER_TEMP_MARK));

    /* the name a writer gives its temporary: the mark, this boot, this namespace, this pid */
    CHECK(ember_temp_sibling(entry, own, sizeof own));
    char want[900];
    snprintf(want, sizeof want, "%s.ember-tmp-%s-%llu-%ld-", entry, boot, ns, (long)getpid());
    CHECK_MSG(strncmp(own, want, strlen(want)) == 0 && strlen(own) == strlen(want) + 16, "temporary '%s'", own);
    CHECK(!ember_temp_writer_dead("x.ember-tmp-draft") && !ember_temp_writer_dead(strrchr(own, '/') + 1));
    for (int i = 2; i < 7; i++) unlink(t[i]);
}

static void test_default_dir(void) {
    char buf[600];
    setenv("XDG_CACHE_HOME", "/some/where", 1);
    CHECK(ember_digest_cache_dir(buf, sizeof buf) && strcmp(buf, "/some/where/ember") == 0);
    /* a relative XDG_CACHE_HOME is invalid (XDG base directory spec): HOME decides */
    setenv("XDG_CACHE_HOME", "relative/dir", 1);
    setenv("HOME", "/home/someone", 1);
    CHECK(ember_digest_cache_dir(buf, sizeof buf) && strcmp(buf, "/home/someone/.cache/ember") == 0);
    unsetenv("XDG_CACHE_HOME");
    CHECK(ember_digest_cache_dir(buf, sizeof buf) && strcmp(buf, "/home/someone/.cache/ember") == 0);
    unsetenv("HOME");
    CHECK(!ember_digest_cache_dir(buf, sizeof buf));
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/digest-XXXXXX", ember_test_tmpdir());
    if (!mkdtemp(g_dir)) return ember_test_skip("cannot make a scratch directory");
    snprintf(g_cache, sizeof g_cache, "%s/cache/ember", g_dir);
    snprintf(g_file, sizeof g_file, "%s/model.gguf", g_dir);
    test_known_vector();
    test_cache_cycle();
    test_corrupt_entries();
    test_racy_and_unwritable();
    test_abandon_and_errors();
    test_killed_writers_temporaries();
    test_default_dir();
    nftw(g_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    return ember_test_finish();
}
