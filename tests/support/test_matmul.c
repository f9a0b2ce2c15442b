/* test_matmul.c — the tests' single-threaded whole product and their compute contexts (test_matmul.h). */
#include "test_matmul.h"
#include "test_support.h"

#include <stdio.h>
#include <stdlib.h>

ember_compute *test_compute_new(ember_kernels k, int n_threads) {
    ember_compute *c = NULL;
    ember_error err;
    if (ember_compute_new(k, n_threads, &c, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.300s", err.msg);
        return NULL;
    }
    return c;
}

void test_matmul(const ember_kernel_ops *ops, const ember_matrix *w, const float *x, float *y, int64_t n_tok) {
    const ember_type_kernels *mm = ember_kernels_mm(ops, w->type);
    if (!mm) {
        fprintf(stderr, "test_matmul: %s has no product for %s\n", ops->name, ember_type_name((uint32_t)w->type));
        abort();
    }
    if (!mm->act_size) {
        mm->rows(w, x, NULL, 0, y, n_tok, 0, w->n_out);
        return;
    }
    const size_t stride = mm->act_size(w->n_in);
    uint8_t *xa = aligned_alloc(64, (stride * EMBER_MATMUL_MAX_TOKENS + 63) / 64 * 64);
    if (!xa) abort();
    for (int64_t t0 = 0; t0 < n_tok; t0 += EMBER_MATMUL_MAX_TOKENS) {
        const int64_t nt = n_tok - t0 < EMBER_MATMUL_MAX_TOKENS ? n_tok - t0 : EMBER_MATMUL_MAX_TOKENS;
        for (int64_t t = 0; t < nt; t++) mm->act_prepare(x + (t0 + t) * w->n_in, xa + (size_t)t * stride, w->n_in);
        mm->rows(w, x + t0 * w->n_in, xa, stride, y + t0 * w->n_out, nt, 0, w->n_out);
    }
    free(xa);
}
