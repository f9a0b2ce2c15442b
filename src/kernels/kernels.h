/* kernels.h — the numeric operations of a forward pass, as one table per kernel set.
 * The reference set (ref.c) is the oracle: plain scalar C, f32 accumulation. Faster sets keep the
 * same signatures and are chosen at run time (dispatch.c). No model knowledge in here. */
#ifndef EMBER_KERNELS_H
#define EMBER_KERNELS_H

#include "ember.h"
#include "gguf.h"

/* A weight matrix used in place from the mapping: n_out rows of n_in values, row-major. */
typedef struct {
    ember_type type;
    const void *data;  /* (n_out, n_in) in `type` */
    int64_t n_in, n_out;
    size_t row_bytes;
} ember_matrix;

float ember_f16_to_f32(uint16_t h);
uint16_t ember_f32_to_f16(float f);   /* round to nearest even */
float ember_bf16_to_f32(uint16_t h);
uint16_t ember_f32_to_bf16(float f);  /* round to nearest even */

/* Row r of m as f32 (n_in values). */
void ember_matrix_row_f32(const ember_matrix *m, int64_t r, float *out);

typedef struct {
    const char *name;
    /* y[t, o] = sum_i W[o, i] * x[t, i] for t < n_tok: y (n_tok, n_out), x (n_tok, n_in) */
    void (*matmul)(const ember_matrix *w, const float *x, float *y, int64_t n_tok);
    float (*dot_f32)(const float *a, const float *b, int64_t n);
} ember_kernel_ops;

extern const ember_kernel_ops ember_kernels_reference;

/* The table for a requested kernel set; falls back to what the CPU supports. */
const ember_kernel_ops *ember_kernels_select(ember_kernels want, ember_kernels *chosen);

/* ---- small ops (reference only for now; shared by every kernel set) ---- */
/* y = x / rms(x) * w (w may be NULL: no weight) */
void ember_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
/* y = (x - mean) / sqrt(var + eps) * w + b */
void ember_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps);
/* Rotates one head of head_dim values at position pos. n_rot: rotated dims (<= head_dim).
 * neox: pairs (i, i + n_rot/2); else adjacent pairs (2i, 2i+1). freq_factors (n_rot/2) may be NULL. */
void ember_rope(float *x, int64_t n_rot, int64_t pos, float base, bool neox, const float *freq_factors);
void ember_softmax(float *x, int64_t n);
float ember_silu(float x);
float ember_gelu_tanh(float x);

#endif
