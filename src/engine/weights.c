/* weights.c — read-only access to a model's stored tensors: their list, and their values by GGUF
 * name (whole, or chosen rows), dequantized to f32 on request. Keeps nothing: each call converts
 * from the file mapping into the caller's buffer. */
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

/* The stored tensor `name` as a matrix of n_out rows of n_in values, in the file's layout: read
 * through the kernels' row conversion (the type traits' to_float), they are the values the
 * reference path multiplies with (a repacked copy, if any, holds the same values). */
static ember_status stored_matrix(const ember_model *m, const char *name, ember_matrix *mat, ember_error *err) {
    int64_t n_out, n_in;
    ember_status st = ember_model_weight_shape(m, name, &n_out, &n_in, err);
    if (st != EMBER_OK) return st;
    const gguf_tensor *t = find(m, name);
    *mat = (ember_matrix){.type = t->type,
                          .data = t->data,
                          .n_in = n_in,
                          .n_out = n_out,
                          .row_bytes = ember_type_row_size(t->type, n_in)};
    return EMBER_OK;
}

ember_status ember_model_weight_f32(const ember_model *m, const char *name, float *out, ember_error *err) {
    ember_matrix mat;
    ember_status st = stored_matrix(m, name, &mat, err);
    if (st != EMBER_OK) return st;
    for (int64_t r = 0; r < mat.n_out; r++) m->ops->get_row(&mat, r, out + r * mat.n_in);
    return EMBER_OK;
}

ember_status ember_model_weight_rows_f32(const ember_model *m, const char *name, const int64_t *rows, int64_t n,
                                         float *out, ember_error *err) {
    ember_matrix mat;
    ember_status st = stored_matrix(m, name, &mat, err);
    if (st != EMBER_OK) return st;
    for (int64_t i = 0; i < n; i++) /* every row checked before any is read */
        if (rows[i] < 0 || rows[i] >= mat.n_out)
            return ember_error_set(err, EMBER_ERR_ARG, "weight: row %lld of '%s' out of range 0..%lld",
                                   (long long)rows[i], name, (long long)mat.n_out - 1);
    for (int64_t i = 0; i < n; i++) m->ops->get_row(&mat, rows[i], out + i * mat.n_in);
    return EMBER_OK;
}

int64_t ember_model_tensor_count(const ember_model *m) { return m ? (int64_t)m->gguf->n_tensors : 0; }

bool ember_model_tensor_desc(const ember_model *m, int64_t i, ember_tensor_desc *out) {
    if (!m || i < 0 || i >= (int64_t)m->gguf->n_tensors) return false;
    const gguf_tensor *t = &m->gguf->tensors[i];
    out->name = t->name;
    out->type = ember_type_name(t->type);
    out->n_dims = (int)t->n_dims;
    for (int d = 0; d < 4; d++) out->ne[d] = t->ne[d];
    out->bytes = t->size;
    return true;
}

bool ember_model_tensor_same(const ember_model *a, const ember_model *b, const char *name) {
    const gguf_tensor *ta = a && name ? ember_gguf_find_tensor(a->gguf, name) : NULL;
    const gguf_tensor *tb = b && name ? ember_gguf_find_tensor(b->gguf, name) : NULL;
    if (!ta || !tb || ta->type != tb->type || ta->size != tb->size || memcmp(ta->ne, tb->ne, sizeof ta->ne) != 0)
        return false;
    return ta->data == tb->data || memcmp(ta->data, tb->data, ta->size) == 0;
}
