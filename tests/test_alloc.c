/* test_alloc.c — no allocation per token after warm-up: this executable defines malloc, calloc,
 * realloc, free, posix_memalign and aligned_alloc itself (forwarding to glibc's __libc_* entry
 * points) and counts every call from any thread. For each family (llama, qwen3, gemma4, gpt2),
 * weight type (q8_0, bf16) and kernel set (reference, auto), at 2 threads: load, prefill, decode a
 * few tokens to warm up, then check that further decode steps (greedy and sampled, with and
 * without a C hook table) and a second prefill no longer than the first make no allocation at all.
 * AddressSanitizer replaces malloc itself, so under it the test is skipped (exit 77). */
#include "ember.h"
#include "gguf.h"
#include "ember_tiny_model.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define EMBER_ALLOC_COUNTING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMBER_ALLOC_COUNTING 0
#endif
#endif
#ifndef EMBER_ALLOC_COUNTING
#define EMBER_ALLOC_COUNTING 1
#endif

#if EMBER_ALLOC_COUNTING
/* glibc's own allocator entry points (exported by libc.so.6). */
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);
void *__libc_memalign(size_t align, size_t n);

static unsigned long long alloc_calls; /* malloc/calloc/realloc/memalign calls, any thread */

static void count(void) { __atomic_add_fetch(&alloc_calls, 1, __ATOMIC_RELAXED); }

void *malloc(size_t n);
void *calloc(size_t n, size_t size);
void *realloc(void *p, size_t n);
void free(void *p);
int posix_memalign(void **out, size_t align, size_t n);
void *aligned_alloc(size_t align, size_t n);

void *malloc(size_t n) {
    count();
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t size) {
    count();
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n) {
    count();
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
int posix_memalign(void **out, size_t align, size_t n) {
    count();
    void *p = __libc_memalign(align, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
void *aligned_alloc(size_t align, size_t n) {
    count();
    return __libc_memalign(align, n);
}

static unsigned long long allocs(void) { return __atomic_load_n(&alloc_calls, __ATOMIC_RELAXED); }

/* A hook that reads its view and lets the evaluation continue: the enabled C path. */
static ember_status touch_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *view,
                               ember_error *err) {
    double *sum = user;
    *sum += view->rows > 0 && view->cols > 0 ? (double)view->data[0] : 0.0;
    return EMBER_OK;
}

enum { PROMPT = 12, WARMUP = 3, STEPS = 8 };

/* A check that reports the engine's error message; returns the outcome. */
static bool check_ok(bool ok, const char *label, const char *what, const ember_error *err) {
    CHECK_MSG(ok, "%s %s: %.600s", label, what, err->msg);
    return ok;
}

static void run_case(const char *family, ember_type dtype, ember_kernels kernels) {
    char label[128], path[1200];
    snprintf(label, sizeof label, "%s %s %s", family, ember_type_name(dtype), ember_kernels_name(kernels));
    snprintf(path, sizeof path, "%s/alloc-%s-%s.gguf", ember_test_tmpdir(), family, ember_type_name(dtype));
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = family;
    p.dtype = dtype;
    ember_error err = {0};
    if (!check_ok(ember_tiny_model_write(&p, path, &err) == EMBER_OK, label, "write", &err)) return;

    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_sampler *smp = NULL;
    ember_model_params mp = {.path = path, .kernels = kernels, .n_threads = 2};
    if (!check_ok(ember_model_load(&mp, &m, &err) == EMBER_OK, label, "load", &err)) return;
    const int64_t n_vocab = ember_model_get_info(m)->n_vocab;
    ember_sampler_params sp = {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 7};
    if (!check_ok(ember_session_new(m, 64, &s, &err) == EMBER_OK, label, "session", &err) ||
        !check_ok(ember_sampler_new(&sp, n_vocab, &smp, &err) == EMBER_OK, label, "sampler", &err))
        goto done;

    int32_t ids[PROMPT];
    for (int i = 0; i < PROMPT; i++) ids[i] = (int32_t)((i * 37 + 5) % n_vocab);
    double sum = 0;
    ember_hooks hooks = {.user = &sum};
    for (int st = 0; st < EMBER_STAGE_COUNT; st++) hooks.on_tensor[st] = touch_hook;

    /* warm-up: the first prefill and a few decode steps, with and without hooks */
    bool ok = ember_session_prefill(s, ids, PROMPT, NULL, &err) == EMBER_OK;
    for (int k = 0; ok && k < WARMUP; k++)
        ok = ember_session_decode(s, (int32_t)ember_argmax(ember_session_logits(s), n_vocab), k % 2 ? &hooks : NULL,
                                  &err) == EMBER_OK;
    if (!check_ok(ok, label, "warm-up", &err)) goto done;

    /* decode steps: greedy, disabled path */
    unsigned long long before = allocs();
    for (int k = 0; ok && k < STEPS; k++)
        ok = ember_session_decode(s, (int32_t)ember_argmax(ember_session_logits(s), n_vocab), NULL, &err) == EMBER_OK;
    unsigned long long n_plain = allocs() - before;

    /* decode steps: greedy, with every hook stage set */
    before = allocs();
    for (int k = 0; ok && k < STEPS; k++)
        ok = ember_session_decode(s, (int32_t)ember_argmax(ember_session_logits(s), n_vocab), &hooks, &err) == EMBER_OK;
    unsigned long long n_hooked = allocs() - before;

    /* decode steps: sampled (temperature, top-k, top-p) */
    before = allocs();
    for (int k = 0; ok && k < STEPS; k++)
        ok = ember_session_decode(s, ember_sampler_sample(smp, ember_session_logits(s)), NULL, &err) == EMBER_OK;
    unsigned long long n_sampled = allocs() - before;

    /* a second prefill (shorter than the first) from a reset session, then decode again */
    before = allocs();
    ember_session_reset(s);
    ok = ok && ember_session_prefill(s, ids, PROMPT - 4, NULL, &err) == EMBER_OK;
    for (int k = 0; ok && k < STEPS; k++)
        ok = ember_session_decode(s, (int32_t)ember_argmax(ember_session_logits(s), n_vocab), NULL, &err) == EMBER_OK;
    unsigned long long n_second = allocs() - before;

    check_ok(ok, label, "evaluation", &err);
    CHECK_MSG(n_plain == 0, "%s: %llu allocations in %d decode steps (no hooks)", label, n_plain, STEPS);
    CHECK_MSG(n_hooked == 0, "%s: %llu allocations in %d decode steps with every hook stage set", label, n_hooked,
              STEPS);
    CHECK_MSG(n_sampled == 0, "%s: %llu allocations in %d sampled decode steps", label, n_sampled, STEPS);
    CHECK_MSG(n_second == 0, "%s: %llu allocations in a second prefill of %d tokens and %d decode steps", label,
              n_second, PROMPT - 4, STEPS);
done:
    ember_sampler_free(smp);
    ember_session_free(s);
    ember_model_free(m);
}

/* The counter itself works: otherwise every "0 allocations" above would prove nothing. */
static void test_counter(void) {
    unsigned long long before = allocs();
    void *volatile p = malloc(16);
    void *volatile q = calloc(2, 8);
    p = realloc(p, 64);
    free(p);
    free(q);
    CHECK(allocs() - before == 3);
}

int main(void) {
    test_counter();
    static const char *families[] = {"llama", "qwen3", "gemma4", "gpt2"};
    const ember_type dtypes[] = {EMBER_TYPE_Q8_0, EMBER_TYPE_BF16};
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AUTO};
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) run_case(families[f], dtypes[d], sets[k]);
    return ember_test_finish();
}
#else
int main(void) {
    return ember_test_skip("AddressSanitizer replaces malloc; allocation counting needs the plain build");
}
#endif
