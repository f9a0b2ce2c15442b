/* tiny_model.h — the tiny-model generator's entry for tools and tests that edit the file before it
 * is written: ember_tiny_model_build into a GGUF writer. Everything else (the parameters, defaults,
 * presets, writing a file) is the tools' public interface, include/ember_tiny_model.h, which is all
 * the bindings see. */
#ifndef EMBER_TINY_MODEL_H
#define EMBER_TINY_MODEL_H

#include "ember_tiny_model.h"
#include "gguf_writer.h"

/* Adds the model's metadata, tokenizer and tensors to w (callers may then edit it). */
ember_status ember_tiny_model_build(const ember_tiny_model_params *p, ember_gguf_writer *w, ember_error *err);

#endif
