/* test_matmul.h — the tests' single-threaded whole product through one kernel set's table (the
 * engine uses ember_matmul, which threads it): prepares the activations, runs the type's rows; and
 * the compute context the SIMD tests make for a kernel set. */
#ifndef EMBER_TEST_MATMUL_H
#define EMBER_TEST_MATMUL_H

#include "kernels.h"

/* y (n_tok, n_out) = x (n_tok, n_in) W^T with set `ops`, in slices of EMBER_MATMUL_MAX_TOKENS.
 * Allocates; aborts when the set has no product for W's type (a test bug). */
void test_matmul(const ember_kernel_ops *ops, const ember_matrix *w, const float *x, float *y, int64_t n_tok);

/* A compute context for kernel set k with n_threads threads, or NULL after a failed CHECK naming
 * the error. */
ember_compute *test_compute_new(ember_kernels k, int n_threads);

#endif
