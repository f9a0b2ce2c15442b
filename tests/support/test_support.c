/* test_support.c — check harness, fixture lookup and a small reader for NumPy .npy/.npz files.
 * The .npz reader handles only stored (uncompressed) zip entries, which is what the fixtures use. */
#include "test_support.h"

#include <stdarg.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ember_test_passed, ember_test_failed;

bool ember_test_check(bool ok, const char *expr, const char *file, int line, const char *msg) {
    if (ok) {
        ember_test_passed++;
        return true;
    }
    ember_test_failed++;
    fprintf(stderr, "FAIL %s:%d: %s%s%s\n", file, line, expr, msg ? " -- " : "", msg ? msg : "");
    return false;
}

bool ember_test_checkf(bool ok, const char *expr, const char *file, int line, const char *fmt, ...) {
    if (ok) return ember_test_check(true, expr, file, line, NULL);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ember_test_check(false, expr, file, line, msg);
}

int ember_test_finish(void) {
    printf("%d passed, %d failed\n", ember_test_passed, ember_test_failed);
    return ember_test_failed == 0 && ember_test_passed > 0 ? 0 : 1;
}

int ember_test_skip(const char *why) {
    printf("SKIP: %s\n", why);
    return 77;
}

bool ember_test_span(const float *x, size_t n, float *lo, float *hi) {
    bool finite = true;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(x[i]) != 0;
        *lo = fminf(*lo, x[i]);
        *hi = fmaxf(*hi, x[i]);
    }
    return finite;
}

double ember_test_rel_diff(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num || d != d) num = d;
        den = fmax(den, fabs((double)b[i]));
        if (num != num) return num;
    }
    return den > 0 ? num / den : num;
}

const char *ember_fixtures_dir(void) {
    const char *env = getenv("EMBER_FIXTURES");
    return env && *env ? env : EMBER_FIXTURES_DEFAULT;
}

bool ember_fixture_path(const char *rel, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", ember_fixtures_dir(), rel);
    struct stat st;
    return stat(out, &st) == 0;
}

const ember_kernels ember_test_sets[EMBER_TEST_N_SETS] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2,
                                                          EMBER_KERNELS_AVX512};
const char *const ember_test_set_names[EMBER_TEST_N_SETS] = {"reference", "avx2", "avx512"};

bool ember_test_set_runs(size_t k) {
    if (ember_kernels_supported(ember_test_sets[k])) return true;
    printf("%s: not supported by this CPU, skipped\n", ember_test_set_names[k]);
    return false;
}

bool ember_test_case_model(const char *case_dir, char *out, size_t cap) {
    char rel[512];
    snprintf(rel, sizeof rel, "%s/model.gguf", case_dir);
    if (ember_fixture_path(rel, out, cap)) return true;
    printf("%s: fixture missing, skipped\n", rel);
    return false;
}

const char *ember_test_tmpdir(void) {
    static char dir[1024];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/test-tmp", EMBER_BUILD_DIR);
        mkdir(dir, 0755);
    }
    return dir;
}

char *ember_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

bool ember_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

/* Parses an in-memory .npy (format 1.0/2.0, '<f4', C order). */
static bool npy_parse(const unsigned char *b, size_t n, npy_f32 *out) {
    if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0) return false;
    size_t hlen, hoff;
    if (b[6] == 1) {
        hlen = (size_t)b[8] | ((size_t)b[9] << 8);
        hoff = 10;
    } else {
        if (n < 12) return false;
        hlen = (size_t)b[8] | ((size_t)b[9] << 8) | ((size_t)b[10] << 16) | ((size_t)b[11] << 24);
        hoff = 12;
    }
    if (hoff + hlen > n) return false;
    char hdr[512];
    size_t hl = hlen < sizeof hdr - 1 ? hlen : sizeof hdr - 1;
    memcpy(hdr, b + hoff, hl);
    hdr[hl] = 0;
    if (!strstr(hdr, "'<f4'") || strstr(hdr, "'fortran_order': True")) return false;
    const char *sh = strstr(hdr, "'shape': (");
    if (!sh) return false;
    sh += strlen("'shape': (");
    long long d0 = 1, d1 = 1;
    int got = sscanf(sh, "%lld, %lld", &d0, &d1);
    if (got < 1) {
        if (*sh != ')') return false;
        d0 = 1; /* 0-d array */
    }
    if (got == 1) {
        d1 = d0;
        d0 = 1;
    }
    size_t count = (size_t)d0 * (size_t)d1;
    if (hoff + hlen + count * 4 > n) return false;
    out->rows = d0;
    out->cols = d1;
    out->data = malloc(count * 4 + 4);
    if (!out->data) return false;
    memcpy(out->data, b + hoff + hlen, count * 4);
    return true;
}

bool npy_load_f32(const char *path, npy_f32 *out) {
    size_t n;
    unsigned char *b = (unsigned char *)ember_read_file(path, &n);
    if (!b) return false;
    bool ok = npy_parse(b, n, out);
    free(b);
    return ok;
}

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint32_t rd16(const unsigned char *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

bool npz_load_f32(const char *path, const char *name, npy_f32 *out) {
    size_t n;
    unsigned char *b = (unsigned char *)ember_read_file(path, &n);
    if (!b) return false;
    char want[256];
    snprintf(want, sizeof want, "%s.npy", name);
    bool ok = false;
    size_t off = 0;
    /* Walk local file headers: stored entries only. */
    while (off + 30 <= n && rd32(b + off) == 0x04034b50) {
        uint32_t method = rd16(b + off + 8), csize = rd32(b + off + 18);
        uint32_t nlen = rd16(b + off + 26), xlen = rd16(b + off + 28);
        size_t data = off + 30 + nlen + xlen;
        if (data > n) break;
        if (csize == 0xFFFFFFFFu && xlen >= 20) csize = rd32(b + off + 30 + nlen + 4 + 8); /* zip64 */
        if (data + csize > n) break;
        if (method == 0 && nlen == strlen(want) && memcmp(b + off + 30, want, nlen) == 0) {
            ok = npy_parse(b + data, csize, out);
            break;
        }
        off = data + csize;
    }
    free(b);
    return ok;
}

void npy_free(npy_f32 *a) {
    free(a->data);
    a->data = NULL;
}
