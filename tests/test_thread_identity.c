/* test_thread_identity.c — whole forward passes are bit-identical for 1, 2 and 3 threads: every
 * family of the parity fixtures, every kernel set this CPU runs, f32 and f16 KV caches, a prefill
 * long enough to split the row-wise small ops and to cross an attention chunk boundary, then decode
 * steps. Each thread count's logits are compared byte for byte with the 1-thread run's. */
#include "cpu.h"
#include "ember.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#define N_PROMPT 300 /* > EMBER_ATTN_CHUNK (256): two chunks; many row chunks of the small ops */
#define N_DECODE 3

/* Logits after the prefill and after each decode step: (1 + N_DECODE) x n_vocab, malloc'd; NULL
 * when the case cannot run (reported). */
static float *run(const char *path, ember_kernels k, ember_kv_type kv, int threads, const int32_t *ids, int64_t *nv) {
    ember_model_params mp = {.path = path, .kernels = k, .n_threads = threads, .kv_cache = kv};
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    float *out = NULL;
    if (ember_model_load(&mp, &m, &err) != EMBER_OK || ember_session_new(m, N_PROMPT + N_DECODE + 1, &s, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.300s: %.300s", path, err.msg);
        goto done;
    }
    *nv = ember_model_get_info(m)->n_vocab;
    out = malloc((size_t)(1 + N_DECODE) * (size_t)*nv * sizeof *out);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(ids[i] % *nv);
    if (!CHECKF(ember_session_prefill(s, prompt, N_PROMPT, NULL, &err) == EMBER_OK, "%s: prefill: %s", path, err.msg)) {
        free(out);
        out = NULL;
        goto done;
    }
    memcpy(out, ember_session_logits(s), (size_t)*nv * sizeof *out);
    for (int d = 0; d < N_DECODE; d++) {
        if (!CHECKF(ember_session_decode(s, prompt[d], NULL, &err) == EMBER_OK, "%s: decode: %s", path, err.msg)) {
            free(out);
            out = NULL;
            goto done;
        }
        memcpy(out + (size_t)(d + 1) * (size_t)*nv, ember_session_logits(s), (size_t)*nv * sizeof *out);
    }
done:
    ember_session_free(s);
    ember_model_free(m);
    return out;
}

int main(void) {
    static const char *cases[] = {"parity/llama-tiny-q8_0", "parity/qwen3-tiny-q8_0", "parity/qwen2-tiny-q8_0",
                                  "parity/gemma4-tiny-q8_0", "parity/gpt2-tiny-q8_0", "parity/llama-tiny-f16"};
    static const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    static const char *set_names[] = {"reference", "avx2", "avx512"};
    int32_t ids[N_PROMPT];
    uint32_t r = 12345;
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 8);
    int ran = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[2048], rel[256];
        snprintf(rel, sizeof rel, "%s/model.gguf", cases[c]);
        if (!ember_fixture_path(rel, path, sizeof path)) {
            printf("%s: fixture missing, skipped\n", rel);
            continue;
        }
        for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
            if (!ember_kernels_supported(sets[k])) {
                printf("%s: not supported by this CPU, skipped\n", set_names[k]);
                continue;
            }
            for (int kv = 0; kv < 2; kv++) {
                const ember_kv_type t = kv ? EMBER_KV_F16 : EMBER_KV_F32;
                int64_t nv = 0, nv2 = 0;
                float *one = run(path, sets[k], t, 1, ids, &nv);
                if (!one) continue;
                for (int threads = 2; threads <= 3; threads++) {
                    float *many = run(path, sets[k], t, threads, ids, &nv2);
                    if (!many) continue;
                    CHECK_MSG(nv2 == nv && memcmp(one, many, (size_t)(1 + N_DECODE) * (size_t)nv * sizeof *one) == 0,
                              "%s %s %s KV: %d threads differ from 1 thread", cases[c], set_names[k], kv ? "f16" : "f32",
                              threads);
                    free(many);
                }
                free(one);
                ran++;
            }
        }
    }
    if (ran == 0) return ember_test_skip("no parity fixture found (set EMBER_FIXTURES)");
    printf("%d (case, set, KV) combinations checked at 1, 2 and 3 threads\n", ran);
    return ember_test_finish();
}
