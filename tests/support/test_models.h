/* test_models.h — the C tests' writer-made model files: a family's default tiny model in a GGUF
 * writer (to edit before writing), and writing it out. Check failures count as test failures. */
#ifndef EMBER_TEST_MODELS_H
#define EMBER_TEST_MODELS_H

#include "gguf_writer.h"
#include "tiny_model.h"

/* A writer holding the default tiny model of `family` with 2-D weights in `dtype`. */
ember_gguf_writer *ember_test_tiny_writer(const char *family, ember_type dtype);
/* Writes w to path and frees w; returns path. */
const char *ember_test_write_model(ember_gguf_writer *w, const char *path);

#endif
