/* test_pass_identity.c — whole forward passes are bit-identical however they are run: every family
 * of the parity fixtures, every kernel set this CPU runs, f32 and f16 KV caches, a prefill long
 * enough to split the row-wise small ops, to cross an attention chunk boundary and to be evaluated
 * in slices (session.c; 100 tokens here), then decode steps. Against the plain 1-thread run, byte for byte:
 *   - 2 and 3 threads;
 *   - the prompt with a read-only hook attached (the pass is then evaluated whole, not in slices);
 *   - the prompt given as several prefills of uneven lengths. */
#include "cpu.h"
#include "ember.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#define N_PROMPT 300 /* > EMBER_ATTN_CHUNK (256): two chunks; three prefill slices; many row chunks */
#define N_DECODE 3

typedef enum { PLAIN, HOOKED, PARTS } run_mode;
static const char *mode_names[] = {"plain", "hooked (whole pass)", "in parts"};

/* A hook that only reads: counts its calls, so the test knows the hooked pass ran hooked. */
static ember_status count_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                               ember_error *err) {
    (void)stage, (void)ctx, (void)v, (void)err;
    ++*(int64_t *)user;
    return EMBER_OK;
}

static ember_status prefill(ember_session *s, const int32_t *prompt, run_mode mode, ember_error *err) {
    int64_t calls = 0;
    ember_hooks observe = {.user = &calls};
    observe.on_tensor[EMBER_STAGE_AFTER_MLP] = count_hook;
    if (mode == HOOKED) {
        ember_status st = ember_session_prefill(s, prompt, N_PROMPT, &observe, err);
        CHECK_MSG(st != EMBER_OK || calls > 0, "the read-only hook was never called");
        return st;
    }
    if (mode == PLAIN) return ember_session_prefill(s, prompt, N_PROMPT, NULL, err);
    static const int64_t parts[] = {1, 7, 64, 129, N_PROMPT - 201}; /* sums to N_PROMPT */
    int64_t done = 0;
    ember_status st = EMBER_OK;
    for (size_t i = 0; st == EMBER_OK && i < sizeof parts / sizeof parts[0]; done += parts[i++])
        st = ember_session_prefill(s, prompt + done, parts[i], NULL, err);
    return st;
}

/* Logits after the prefill and after each decode step: (1 + N_DECODE) x n_vocab, malloc'd; NULL
 * when the case cannot run (reported). */
static float *run(const char *path, ember_kernels k, ember_kv_type kv, int threads, run_mode mode, const int32_t *ids,
                  int64_t *nv) {
    ember_model_params mp = {.path = path, .kernels = k, .n_threads = threads, .kv_cache = kv};
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    float *out = NULL;
    if (ember_model_load(&mp, &m, &err) != EMBER_OK ||
        ember_session_new(m, N_PROMPT + N_DECODE + 1, &s, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.300s: %.300s", path, err.msg);
        goto done;
    }
    *nv = ember_model_get_info(m)->n_vocab;
    out = malloc((size_t)(1 + N_DECODE) * (size_t)*nv * sizeof *out);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(ids[i] % *nv);
    if (!CHECKF(prefill(s, prompt, mode, &err) == EMBER_OK, "%s: prefill (%s): %s", path, mode_names[mode], err.msg)) {
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
    /* slices of 100 tokens (the default would not cut a tiny model's 300-token prompt) */
    setenv("EMBER_PREFILL_SLICE", "100", 1);
    static const char *cases[] = {"parity/llama-tiny-q8_0",  "parity/qwen3-tiny-q8_0", "parity/qwen2-tiny-q8_0",
                                  "parity/gemma4-tiny-q8_0", "parity/gpt2-tiny-q8_0",  "parity/llama-tiny-f16"};
    /* (threads, mode) of every run compared with the plain 1-thread one */
    static const struct {
        int threads;
        run_mode mode;
    } variants[] = {{2, PLAIN}, {3, PLAIN}, {1, HOOKED}, {2, PARTS}};
    int32_t ids[N_PROMPT];
    uint32_t r = 12345;
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 8);
    int ran = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[2048];
        if (!ember_test_case_model(cases[c], path, sizeof path)) continue;
        for (size_t k = 0; k < EMBER_TEST_N_SETS; k++) {
            if (!ember_test_set_runs(k)) continue;
            for (int kv = 0; kv < 2; kv++) {
                const ember_kv_type t = kv ? EMBER_KV_F16 : EMBER_KV_F32;
                int64_t nv = 0, nv2 = 0;
                float *one = run(path, ember_test_sets[k], t, 1, PLAIN, ids, &nv);
                if (!one) continue;
                for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
                    float *other = run(path, ember_test_sets[k], t, variants[v].threads, variants[v].mode, ids, &nv2);
                    if (!other) continue;
                    CHECK_MSG(nv2 == nv && memcmp(one, other, (size_t)(1 + N_DECODE) * (size_t)nv * sizeof *one) == 0,
                              "%s %s %s KV: %d threads %s differ from the plain 1-thread run", cases[c],
                              ember_test_set_names[k], kv ? "f16" : "f32", variants[v].threads,
                              mode_names[variants[v].mode]);
                    free(other);
                }
                free(one);
                ran++;
            }
        }
    }
    if (ran == 0) return ember_test_skip("no parity fixture found (set EMBER_FIXTURES)");
    printf("%d (case, set, KV) combinations checked: 2 and 3 threads, hooked, in parts\n", ran);
    return ember_test_finish();
}
