/* control_vector.c — reads the control-vector GGUF files llama.cpp's cvector-generator writes
 * (`direction.N` tensors, f32, one per steered layer) into plain arrays. Must not apply them: where
 * a direction lands is the Lua library's business (lib/ember/run/control_vector.lua, docs/cli.md).
 *
 * What llama.cpp accepts (common/common.cpp, common_control_vector_load_one) and so what is checked
 * here: every tensor is named `direction.N` with N a positive decimal integer (direction.0 is
 * refused: llama.cpp never steers layer 0), f32, one-dimensional, and all of one width.
 * cvector-generator also writes general.architecture = "controlvector", controlvector.model_hint
 * (the model's architecture) and controlvector.layer_count; llama.cpp reads none of them. A file
 * whose general.architecture names something else (a model given by mistake) is refused. */
#include "gguf.h"

#include <stdlib.h>
#include <string.h>

/* direction.N -> N (>= 0), or -1 when the name is not of that form. Digits only: no sign, no
 * blanks, no trailing text (llama.cpp's std::stoi would take "direction.3x" as 3; such a name is
 * refused here rather than guessed at). */
static int64_t direction_layer(const char *name) {
    static const char prefix[] = "direction.";
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) return -1;
    const char *p = name + sizeof prefix - 1;
    if (*p == '\0' || strlen(p) > 9) return -1; /* at most 9 digits: fits an int like llama.cpp's */
    int64_t n = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        n = n * 10 + (*p - '0');
    }
    return n;
}

void ember_control_vector_free(ember_control_vector *cv) {
    if (!cv) return;
    free(cv->layers);
    free(cv->values);
    free(cv->model_hint);
    free(cv);
}

/* The file's metadata: an architecture other than "controlvector" is refused; the model hint and
 * layer count are kept. */
static ember_status read_metadata(const ember_gguf *g, const char *path, ember_control_vector *cv, ember_error *err) {
    char *arch = ember_gguf_get_string(g, "general.architecture");
    if (arch && strcmp(arch, "controlvector") != 0) {
        ember_status st = ember_error_set(err, EMBER_ERR_FORMAT,
                                          "control vector %s: general.architecture is '%s', not 'controlvector' (is "
                                          "this a model file? a control vector holds only direction.N tensors)",
                                          path, arch);
        free(arch);
        return st;
    }
    free(arch);
    cv->model_hint = ember_gguf_get_string(g, "controlvector.model_hint");
    int64_t lc;
    if (ember_gguf_get_int(g, "controlvector.layer_count", &lc)) cv->layer_count = lc;
    return EMBER_OK;
}

/* Tensor i: named direction.N with N >= 1, f32, one-dimensional, as wide as tensor 0; its layer
 * into cv->layers[i]. */
static ember_status read_direction(const ember_gguf *g, uint64_t i, const char *path, ember_control_vector *cv,
                                   ember_error *err) {
    const gguf_tensor *t = &g->tensors[i];
    int64_t n = direction_layer(t->name);
    if (n < 0)
        return ember_error_set(err, EMBER_ERR_FORMAT,
                               "control vector %s: tensor '%s' is not named direction.N (N a layer number)", path,
                               t->name);
    if (n == 0)
        return ember_error_set(err, EMBER_ERR_FORMAT,
                               "control vector %s: tensor '%s': layer 0 cannot be steered (llama.cpp's "
                               "direction.N starts at 1)",
                               path, t->name);
    if (t->type != EMBER_TYPE_F32)
        return ember_error_set(err, EMBER_ERR_FORMAT, "control vector %s: tensor '%s' is %s, not f32", path, t->name,
                               ember_type_name(t->type));
    /* one-dimensional as ggml counts it: trailing dimensions of 1 do not count */
    if (t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return ember_error_set(
            err, EMBER_ERR_FORMAT, "control vector %s: tensor '%s' is not one-dimensional (%lld x %lld x %lld x %lld)",
            path, t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    if (i == 0) {
        cv->n_embd = t->ne[0];
    } else if (t->ne[0] != cv->n_embd) {
        return ember_error_set(err, EMBER_ERR_FORMAT,
                               "control vector %s: tensor '%s' has %lld values, '%s' has %lld (all directions "
                               "must have one width)",
                               path, t->name, (long long)t->ne[0], g->tensors[0].name, (long long)cv->n_embd);
    }
    cv->layers[i] = n;
    return EMBER_OK;
}

/* Every direction's values copied out of the mapping (n_directions x n_embd floats). */
static ember_status copy_values(const ember_gguf *g, const char *path, ember_control_vector *cv, ember_error *err) {
    if (cv->n_embd < 1)
        return ember_error_set(err, EMBER_ERR_FORMAT, "control vector %s: direction tensors are empty", path);
    /* n_directions * n_embd floats; each tensor's size was bounds-checked by the reader */
    size_t n_values = (size_t)cv->n_directions * (size_t)cv->n_embd;
    if (n_values / (size_t)cv->n_directions != (size_t)cv->n_embd || n_values > SIZE_MAX / sizeof(float))
        return ember_error_set(err, EMBER_ERR_FORMAT, "control vector %s: too large", path);
    cv->values = malloc(n_values * sizeof(float));
    if (!cv->values) return ember_error_set(err, EMBER_ERR_NOMEM, "control vector %s: out of memory", path);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        memcpy(cv->values + i * (size_t)cv->n_embd, g->tensors[i].data, (size_t)cv->n_embd * sizeof(float));
    }
    /* the mapping may have changed under us (a truncation reads as zeros): refuse such values */
    return ember_gguf_check_unchanged(g, err);
}

ember_status ember_control_vector_read(const char *path, ember_control_vector **out, ember_error *err) {
    *out = NULL;
    ember_gguf *g = NULL;
    ember_status st = ember_gguf_open(path, &g, err);
    if (st != EMBER_OK) return st;

    ember_control_vector *cv = calloc(1, sizeof *cv);
    if (!cv) {
        ember_gguf_close(g);
        return ember_error_set(err, EMBER_ERR_NOMEM, "control vector %s: out of memory", path);
    }
    cv->layer_count = -1;
    if ((st = read_metadata(g, path, cv, err)) != EMBER_OK) goto fail;
    if (g->n_tensors == 0) {
        st = ember_error_set(err, EMBER_ERR_FORMAT, "control vector %s: no direction.N tensors", path);
        goto fail;
    }
    cv->n_directions = (int64_t)g->n_tensors;
    cv->layers = calloc((size_t)g->n_tensors, sizeof *cv->layers);
    if (!cv->layers) {
        st = ember_error_set(err, EMBER_ERR_NOMEM, "control vector %s: out of memory", path);
        goto fail;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((st = read_direction(g, i, path, cv, err)) != EMBER_OK) goto fail;
    if ((st = copy_values(g, path, cv, err)) != EMBER_OK) goto fail;
    ember_gguf_close(g);
    *out = cv;
    return EMBER_OK;

fail:
    ember_gguf_close(g);
    ember_control_vector_free(cv);
    return st;
}
