/* model_bind.h — helpers the family files use to read hyper-parameters and bind named tensors.
 * Each error names the file and the key or tensor that was missing or misshapen. */
#ifndef EMBER_MODEL_BIND_H
#define EMBER_MODEL_BIND_H

#include "model.h"

typedef struct {
    ember_model *m;
    const char *arch; /* metadata key prefix */
    ember_error *err;
} binder;

#define TRY(expr)                                                                                                 \
    do {                                                                                                          \
        ember_status st_ = (expr);                                                                                \
        if (st_ != EMBER_OK) return st_;                                                                          \
    } while (0)

ember_status bind_fail(binder *b, ember_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "<arch>.<suffix>" as an integer; absence is an error only when `required`. */
ember_status hp_int(binder *b, const char *suffix, int64_t *out, bool required, int64_t def);
ember_status hp_float(binder *b, const char *suffix, float *out, float def);
/* A 1-D vector of n values as f32 (f16/bf16 converted once into an owned copy). */
ember_status bind_vec(binder *b, const char *name, int64_t n, bool required, const float **out);
/* A matrix of n_out rows of n_in values (GGUF dims {n_in, n_out}). */
ember_status bind_mat(binder *b, const char *name, int64_t n_in, int64_t n_out, bool required, ember_matrix *out);

ember_status ember_llama_bind(binder *b);
ember_status ember_gpt2_bind(binder *b);
ember_status ember_gemma4_bind(binder *b);

#endif
