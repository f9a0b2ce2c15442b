/* weights.c — read-only access to a model's stored tensors by GGUF name, dequantized to f32 on
 * request. Keeps nothing: each call converts from the file mapping into the caller's buffer. */
#include "model.h"

#include <stdio.h>
#include <string.h>

/* The tensor called `name`, or `name` + ".weight" (so "blk.3.attn_output" finds the matrix). */
static const gguf_tensor *find(const ember_model *m, const char *name) {
    const gguf_tensor *t = ember_gguf_find_tensor(m->gguf, name);
    if (t) return t;
    char full[512];
    if (snprintf(full, sizeof full, "%s.weight", name) >= (int)sizeof full) return NULL;
    return ember_gguf_find_tensor(m->gguf, full);
}

ember_status ember_model_weight_shape(const ember_model *m, const char *name, int64_t *n_out, int64_t *n_in,
                                      ember_error *err) {
    if (!m || !name || !name[0]) return ember_error_set(err, EMBER_ERR_ARG, "weight: a tensor name is required");
    const gguf_tensor *t = find(m, name);
    if (!t)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "weight: no tensor '%s' (nor '%s.weight') in %s; names are as in the GGUF file, "
                               "e.g. 'blk.0.attn_q', 'output_norm', 'token_embd'",
                               name, name, m->gguf->path);
    /* dims[0] is the row width; every higher dimension counts rows (a vector is one row). */
    *n_in = t->ne[0];
    *n_out = t->n_elements / t->ne[0]; /* the reader checked the product; ne[0] >= 1 */
    return EMBER_OK;
}

ember_status ember_model_weight_f32(const ember_model *m, const char *name, float *out, ember_error *err) {
    int64_t n_out, n_in;
    ember_status st = ember_model_weight_shape(m, name, &n_out, &n_in, err);
    if (st != EMBER_OK) return st;
    const gguf_tensor *t = find(m, name);
    /* The file layout through the kernels' row conversion (the type traits' to_float): the values
     * the reference path multiplies with (a repacked copy, if any, holds the same values). */
    ember_matrix mat = {.type = t->type,
                        .data = t->data,
                        .n_in = n_in,
                        .n_out = n_out,
                        .row_bytes = ember_type_row_size(t->type, n_in)};
    for (int64_t r = 0; r < n_out; r++) m->ops->get_row(&mat, r, out + r * n_in);
    return EMBER_OK;
}
