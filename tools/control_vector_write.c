/* control_vector_write.c — writes a control vector in the GGUF layout llama.cpp's cvector-generator
 * writes, through the GGUF writer. Must not compute directions (lib/ember/analysis/cvector.lua does)
 * nor decide where they are added (the reader's caller, lib/ember/run/control_vector.lua).
 *
 * The layout (llama.cpp examples/cvector-generator, export_gguf): general.architecture =
 * "controlvector", controlvector.model_hint = the model's general.architecture (a string),
 * controlvector.layer_count = the number of directions (i32), then one f32 1-D tensor of n_embd
 * values per direction, named direction.N (N >= 1, in the order given). The engine's reader
 * (src/engine/control_vector.c) checks exactly what is written here. */
#include "ember_tiny_model.h"

#include <math.h>
#include <stdio.h>

#include "gguf_writer.h"

/* The checks a file must pass to be read back: directions numbered from 1, strictly increasing,
 * finite values, a width. */
static ember_status check_directions(const char *path, int64_t n_embd, int64_t n_dirs, const int64_t *layers,
                                     const float *values, ember_error *err) {
    if (n_embd < 1)
        return ember_error_set(err, EMBER_ERR_ARG, "control vector %s: width %lld < 1", path, (long long)n_embd);
    if (n_dirs < 1) return ember_error_set(err, EMBER_ERR_ARG, "control vector %s: no direction to write", path);
    for (int64_t i = 0; i < n_dirs; i++) {
        if (layers[i] < 1 || layers[i] > 999999999) {
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "control vector %s: direction.%lld: layers are numbered from 1 (llama.cpp never "
                                   "steers layer 0)",
                                   path, (long long)layers[i]);
        }
        if (i > 0 && layers[i] <= layers[i - 1]) {
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "control vector %s: direction.%lld after direction.%lld (give each layer once, in "
                                   "increasing order)",
                                   path, (long long)layers[i], (long long)layers[i - 1]);
        }
        for (int64_t j = 0; j < n_embd; j++) {
            if (!isfinite(values[i * n_embd + j])) {
                return ember_error_set(err, EMBER_ERR_ARG, "control vector %s: direction.%lld[%lld] is not finite",
                                       path, (long long)layers[i], (long long)j);
            }
        }
    }
    return EMBER_OK;
}

ember_status ember_control_vector_write(const char *path, const char *model_hint, int64_t n_embd, int64_t n_dirs,
                                        const int64_t *layers, const float *values, ember_error *err) {
    ember_status st = check_directions(path, n_embd, n_dirs, layers, values, err);
    if (st != EMBER_OK) return st;
    if (n_dirs > INT32_MAX) return ember_error_set(err, EMBER_ERR_ARG, "control vector %s: too many directions", path);
    ember_gguf_writer *w = ember_gguf_writer_new();
    if (!w) return ember_error_set(err, EMBER_ERR_NOMEM, "control vector %s: out of memory", path);
    ember_gguf_writer_set_string(w, "general.architecture", "controlvector");
    ember_gguf_writer_set_string(w, "controlvector.model_hint", model_hint ? model_hint : "");
    ember_gguf_writer_set_i32(w, "controlvector.layer_count", (int32_t)n_dirs);
    for (int64_t i = 0; i < n_dirs; i++) {
        char name[32];
        snprintf(name, sizeof name, "direction.%lld", (long long)layers[i]);
        const int64_t ne[1] = {n_embd};
        ember_gguf_writer_add_tensor(w, name, EMBER_TYPE_F32, 1, ne, values + i * n_embd);
    }
    st = ember_gguf_writer_write(w, path, err); /* reports the first error any call above recorded */
    ember_gguf_writer_free(w);
    return st;
}
