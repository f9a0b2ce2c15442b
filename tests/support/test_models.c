/* test_models.c — tiny-model writers for the C tests (test_models.h); builds on tools/tiny_model.c
 * and must not decide what a test expects of the file. */
#include "test_models.h"
#include "test_support.h"

ember_gguf_writer *ember_test_tiny_writer(const char *family, ember_type dtype) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = family;
    p.dtype = dtype;
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_error err = {0};
    CHECK_MSG(ember_tiny_model_build(&p, w, &err) == EMBER_OK, "%.900s", err.msg);
    return w;
}

const char *ember_test_write_model(ember_gguf_writer *w, const char *path) {
    ember_error err = {0};
    CHECK_MSG(ember_gguf_writer_write(w, path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_gguf_writer_free(w);
    return path;
}
