/* test_support.h — a minimal check harness for ember's C tests, plus fixture and .npy helpers.
 * Tests print one line per failed check and a closing "N passed, N failed" line. */
#ifndef EMBER_TEST_SUPPORT_H
#define EMBER_TEST_SUPPORT_H

#include "ember.h"

#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>

extern int ember_test_passed, ember_test_failed;

#define CHECK(cond) ember_test_check((cond), #cond, __FILE__, __LINE__, NULL)
#define CHECK_MSG(cond, ...)                                                                                           \
    do {                                                                                                               \
        char m_[1024];                                                                                                 \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                                          \
        ember_test_check((cond), #cond, __FILE__, __LINE__, m_);                                                       \
    } while (0)
#define CHECK_NEAR(a, b, tol)                                                                                          \
    CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%s = %.9g, %s = %.9g, tol %.3g", #a, (double)(a), #b,         \
              (double)(b), (double)(tol))

bool ember_test_check(bool ok, const char *expr, const char *file, int line, const char *msg);
/* CHECK_MSG as an expression: returns whether the check passed, so a test can stop on failure. */
#define CHECKF(cond, ...) ember_test_checkf((cond), #cond, __FILE__, __LINE__, __VA_ARGS__)
bool ember_test_checkf(bool ok, const char *expr, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Prints the closing line; returns the process exit code (0 only when nothing failed). */
int ember_test_finish(void);
/* Exit code 77 (ctest: skipped) with a message naming what was missing. */
int ember_test_skip(const char *why);

/* Smallest and largest of n values into lo/hi; returns whether every value is finite. */
bool ember_test_span(const float *x, size_t n, float *lo, float *hi);
/* The largest |a[i] - b[i]| over the largest |b[i]| (the difference itself when b is all zeros);
 * NaN when a difference is NaN, so a NaN never passes a tolerance. */
double ember_test_rel_diff(const float *a, const float *b, int64_t n);

/* EMBER_FIXTURES or the default beside the source tree; the returned path is static. */
const char *ember_fixtures_dir(void);
/* fixtures_dir + "/" + rel into out; returns true when that file exists. */
bool ember_fixture_path(const char *rel, char *out, size_t cap);

/* The kernel sets the identity tests run each case on (reference first), with their names. */
#define EMBER_TEST_N_SETS 3
extern const ember_kernels ember_test_sets[EMBER_TEST_N_SETS];
extern const char *const ember_test_set_names[EMBER_TEST_N_SETS];
/* Whether set k of them runs on this CPU; prints "NAME: not supported by this CPU, skipped" when not. */
bool ember_test_set_runs(size_t k);
/* The fixture CASE_DIR/model.gguf into out; prints "...: fixture missing, skipped" when it is absent. */
bool ember_test_case_model(const char *case_dir, char *out, size_t cap);
/* A scratch directory under the build tree, created on demand. */
const char *ember_test_tmpdir(void);

/* Whole file into a malloc'd buffer (NUL-terminated); NULL on failure. */
char *ember_read_file(const char *path, size_t *len);
bool ember_write_file(const char *path, const void *data, size_t len);

/* A float32 .npy array (little-endian, C order, 1-D or 2-D). */
typedef struct {
    float *data;
    int64_t rows, cols;
} npy_f32;
bool npy_load_f32(const char *path, npy_f32 *out);
/* An entry "name.npy" of a stored (uncompressed) .npz archive. */
bool npz_load_f32(const char *path, const char *name, npy_f32 *out);
void npy_free(npy_f32 *a);

#endif
