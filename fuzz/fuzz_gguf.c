/* fuzz_gguf.c — libFuzzer harness: any bytes as a GGUF file through the reader, model binding (every
 * family), a 2-token prefill on the reference kernels, and the embedded tokenizer (encode + decode).
 * A crash, leak or sanitizer report is a bug; an error status is the expected answer to bad bytes. */
#include "ember.h"
#include "fuzz_input.h"
#include "gguf.h"
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void run_model(const char *path) {
    ember_model_params p = {.path = path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    if (ember_model_load(&p, &m, &err) != EMBER_OK) return;
    const ember_model_info *info = ember_model_get_info(m);
    if (ember_session_new(m, 8, &s, &err) == EMBER_OK) {
        const int32_t ids[2] = {0, info->n_vocab > 1 ? 1 : 0};
        if (ember_session_prefill(s, ids, 2, NULL, &err) == EMBER_OK) ember_session_decode(s, 0, NULL, &err);
    }
    ember_session_free(s);
    ember_model_free(m);
}

static void run_tokenizer(const char *path) {
    ember_gguf *g = NULL;
    ember_tokenizer *t = NULL;
    ember_error err = {0};
    if (ember_gguf_open(path, &g, &err) != EMBER_OK) return;
    if (ember_tokenizer_from_gguf(g, &t, &err) == EMBER_OK) {
        static const char text[] = "Hello world, 123 \xc3\xa9t\xc3\xa9\n\n  <s>x";
        int32_t *ids = NULL;
        size_t n = 0;
        if (ember_tokenizer_encode(t, text, sizeof text - 1, true, true, &ids, &n, &err) == EMBER_OK) {
            char *back = NULL;
            size_t len = 0;
            if (ember_tokenizer_decode(t, ids, n, &back, &len, &err) == EMBER_OK) free(back);
        }
        free(ids);
        ember_tokenizer_check_gguf(t, g, &err);
        ember_tokenizer_free(t);
    }
    ember_gguf_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = ember_fuzz_file(data, size);
    run_model(path);
    run_tokenizer(path);
    return 0;
}
