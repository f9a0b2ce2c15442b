/* rows.h — the row-wise small ops of a forward pass (norms, QK-norm + RoPE, gated activations, KV
 * store) split by token over the compute pool, so a long prefill keeps every thread busy. */
#ifndef EMBER_ROWS_H
#define EMBER_ROWS_H

#include "model.h"

/* y[t] = rmsnorm(x[t]) * w for t < n rows of d values (y may equal x). */
void ember_rows_rmsnorm(const ember_model *m, float *y, const float *x, const float *w, int64_t n, int64_t d,
                        float eps);
/* y[t] = layernorm(x[t]) * w + b for t < n rows of d values (y may equal x). */
void ember_rows_layernorm(const ember_model *m, float *y, const float *x, const float *w, const float *b, int64_t n,
                          int64_t d, float eps);
/* Per token t < n of n_heads heads of hd values at position pos0 + t: the per-head RMSNorm (norm
 * may be NULL: none) then RoPE of n_rot dims (n_rot 0: none). */
void ember_rows_norm_rope(const ember_model *m, float *x, int64_t n, int64_t n_heads, int64_t hd, const float *norm,
                          float eps, int64_t n_rot, int64_t pos0, float base, bool neox, const float *freq_factors);
/* g[t] = silu(g[t]) * u[t] (gelu: gelu_tanh(g[t]) * u[t], u may be NULL) over n rows of width. */
void ember_rows_silu_mul(const ember_model *m, float *g, const float *u, int64_t n, int64_t width);
void ember_rows_gelu_mul(const ember_model *m, float *g, const float *u, int64_t n, int64_t width);

#endif
