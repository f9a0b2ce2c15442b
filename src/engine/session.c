/* session.c — a KV cache, a position and a reusable workspace over one model; prefill and decode.
 * Owns no numerics: the family's forward pass does the arithmetic. */
#include "model.h"
#include "nonfinite.h"
#include "memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMBER_DEFAULT_CTX_CAP 4096

/* The workspace's per-token buffers and their widths (floats per token): w's, for model m. */
typedef struct {
    float **p;
    int64_t width;
} workspace_buffer;
#define EMBER_WORKSPACE_BUFFERS 21

static void workspace_buffers(const ember_model *m, ember_workspace *w, workspace_buffer out[EMBER_WORKSPACE_BUFFERS]) {
    int64_t q_dim = m->n_head * m->head_dim, kv_dim = 0, n_ff = 0, qkv_dim = 1;
    for (int64_t l = 0; l < m->n_layer; l++) {
        if (m->layers[l].wqkv.n_out > qkv_dim) qkv_dim = m->layers[l].wqkv.n_out;
        if (m->layers[l].kv_dim > kv_dim) kv_dim = m->layers[l].kv_dim;
        if (m->layers[l].n_ff > n_ff) n_ff = m->layers[l].n_ff;
        int64_t lq = m->n_head * m->layers[l].head_dim;
        if (lq > q_dim) q_dim = lq;
    }
    const workspace_buffer bufs[EMBER_WORKSPACE_BUFFERS] = {
        {&w->x, m->n_embd},
        {&w->xn, m->n_embd},
        {&w->qkv, qkv_dim},
        {&w->q, q_dim},
        {&w->k, kv_dim},
        {&w->v, kv_dim},
        {&w->att, q_dim},
        {&w->attn, m->n_embd},
        {&w->gate, n_ff},
        {&w->up, n_ff},
        {&w->mlp, m->n_embd},
        {&w->ple, m->n_layer * m->ple_dim + 1},
        {&w->ple_gate, m->ple_dim + 1},
        {&w->router, m->n_expert + 1},
        {&w->moe_in, m->n_expert ? m->n_embd : 1},
        {&w->moe_out, m->n_expert ? m->n_embd : 1},
        {&w->moe_g, m->n_ff_exp + 1},
        {&w->moe_u, m->n_ff_exp + 1},
        {&w->moe_w, m->n_expert_used + 1},
        {&w->moe_ids, m->n_expert_used + 1},
        {&w->moe_rows, m->n_expert_used + 1},
    };
    memcpy(out, bufs, sizeof bufs);
}

/* Unobserved prompts are evaluated in slices whose workspace stays within this budget (see
 * evaluate), of a whole number of the products' batches: 256 tokens of Qwen3-0.6B, 128 of
 * LLaMA-3.2-1B, 64 (the least) of an 8B model. The environment may set another. */
#define EMBER_SLICE_BUDGET ((int64_t)16 << 20)

int64_t ember_workspace_token_bytes(const ember_model *m) {
    ember_workspace scratch = {0};
    workspace_buffer bufs[EMBER_WORKSPACE_BUFFERS];
    workspace_buffers(m, &scratch, bufs);
    int64_t token_bytes = 0;
    for (int i = 0; i < EMBER_WORKSPACE_BUFFERS; i++) token_bytes += bufs[i].width * (int64_t)sizeof(float);
    return token_bytes;
}

uint64_t ember_session_bytes(const ember_model *m, int64_t n_ctx) {
    int64_t hd_max = 1;
    for (int64_t l = 0; l < m->n_layer; l++)
        if (m->layers[l].head_dim > hd_max) hd_max = m->layers[l].head_dim;
    const int64_t scratch_floats =
        ember_attention_scratch_floats(ember_compute_threads(m->compute), n_ctx, m->n_head, hd_max);
    uint64_t kv_bytes = 0;
    for (int64_t l = 0; l < m->n_layer; l++) /* K and V, each n_ctx rows in the cache's type */
        if (m->layers[l].kv_source == l)
            kv_bytes += 2u * (uint64_t)ember_type_row_size(m->kv_type, n_ctx * m->layers[l].kv_dim);
    return kv_bytes + (uint64_t)scratch_floats * sizeof(float);
}

static int64_t prefill_slice(const ember_model *m) {
    /* EMBER_PREFILL_SLICE=N sets it (tests cut short prompts; 0 never slices) */
    const char *env = getenv("EMBER_PREFILL_SLICE");
    if (env && env[0]) {
        char *end;
        long long v = strtoll(env, &end, 10);
        if (*end == '\0' && v >= 0) return v > 0 ? (int64_t)v : INT64_MAX;
    }
    const int64_t token_bytes = ember_workspace_token_bytes(m);
    const int64_t batches = EMBER_SLICE_BUDGET / token_bytes / EMBER_MATMUL_MAX_TOKENS;
    return (batches > 1 ? batches : 1) * EMBER_MATMUL_MAX_TOKENS;
}

ember_status ember_session_context_of(const ember_model *m, int64_t *n_ctx, ember_error *err) {
    if (*n_ctx <= 0) {
        if (m->n_ctx_train < 1)
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "session: the model's context_length is %lld, so a session needs an explicit "
                                   "context (1..%lld)",
                                   (long long)m->n_ctx_train, (long long)1 << 24);
        *n_ctx = m->n_ctx_train < EMBER_DEFAULT_CTX_CAP ? m->n_ctx_train : EMBER_DEFAULT_CTX_CAP;
    }
    if (*n_ctx < 1 || *n_ctx > ((int64_t)1 << 24))
        return ember_error_set(err, EMBER_ERR_ARG, "session: context %lld is out of range (1..%lld)", (long long)*n_ctx,
                               (long long)1 << 24);
    return EMBER_OK;
}

ember_status ember_session_new(ember_model *m, int64_t n_ctx, ember_session **out, ember_error *err) {
    *out = NULL;
    ember_status ctx_st = ember_session_context_of(m, &n_ctx, err);
    if (ctx_st != EMBER_OK) return ctx_st;
    /* The KV cache and the attention scratch, estimated before any of it is allocated: a context
     * that cannot fit is refused here, naming the bytes, instead of failing (or swapping) later. */
    int64_t hd_max = 1;
    for (int64_t l = 0; l < m->n_layer; l++)
        if (m->layers[l].head_dim > hd_max) hd_max = m->layers[l].head_dim;
    const int64_t scratch_floats =
        ember_attention_scratch_floats(ember_compute_threads(m->compute), n_ctx, m->n_head, hd_max);
    const uint64_t kv_bytes = ember_session_bytes(m, n_ctx);
    const char *source;
    uint64_t avail = ember_memory_available(&source);
    if (kv_bytes > avail)
        return ember_error_set(err, EMBER_ERR_NOMEM,
                               "session: a %lld-token context needs %llu bytes of KV cache, more than the %llu bytes "
                               "available (%s)",
                               (long long)n_ctx, (unsigned long long)kv_bytes, (unsigned long long)avail, source);
    ember_session *s = calloc(1, sizeof *s);
    if (!s) return ember_error_set(err, EMBER_ERR_NOMEM, "session: out of memory");
    s->model = m;
    s->n_ctx = n_ctx;
    s->prefill_slice = prefill_slice(m);
    s->allow_nonfinite = m->allow_nonfinite;
    s->k_cache = calloc((size_t)m->n_layer, sizeof *s->k_cache);
    s->v_cache = calloc((size_t)m->n_layer, sizeof *s->v_cache);
    s->ws.scores = malloc((size_t)scratch_floats * sizeof(float));
    s->ws.last = malloc((size_t)m->n_embd * sizeof(float));
    s->ws.logits = calloc((size_t)m->n_vocab, sizeof(float));
    s->ws.ple_row = malloc((size_t)(m->n_layer * m->ple_dim + 1) * sizeof(float));
    bool ok = s->k_cache && s->v_cache && s->ws.scores && s->ws.last && s->ws.logits && s->ws.ple_row;
    for (int64_t l = 0; ok && l < m->n_layer; l++) {
        const ember_layer *L = &m->layers[l];
        if (L->kv_source != l) continue; /* reads another layer's cache */
        size_t bytes = ember_type_row_size(m->kv_type, n_ctx * L->kv_dim);
        s->k_cache[l] = malloc(bytes);
        s->v_cache[l] = malloc(bytes);
        ok = s->k_cache[l] && s->v_cache[l];
    }
    if (!ok) {
        ember_session_free(s);
        return ember_error_set(err, EMBER_ERR_NOMEM, "session: cannot allocate a %lld-token KV cache",
                               (long long)n_ctx);
    }
    *out = s;
    return EMBER_OK;
}

static void workspace_free(ember_workspace *w) {
    float **all[] = {&w->x,       &w->qkv,   &w->xn,     &w->q,          &w->k,       &w->v,        &w->att,
                     &w->attn,    &w->gate,  &w->up,     &w->mlp,        &w->ple,     &w->ple_gate, &w->ple_row,
                     &w->scores,  &w->last,  &w->logits, &w->all_logits, &w->pattern, &w->router,   &w->moe_in,
                     &w->moe_out, &w->moe_g, &w->moe_u,  &w->moe_w,      &w->moe_ids, &w->moe_rows};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(*all[i]);
        *all[i] = NULL;
    }
}

void ember_session_free(ember_session *s) {
    if (!s) return;
    for (int64_t l = 0; s->k_cache && l < s->model->n_layer; l++) {
        free(s->k_cache[l]);
        free(s->v_cache[l]);
    }
    free(s->k_cache);
    free(s->v_cache);
    workspace_free(&s->ws);
    free(s);
}

ember_status ember_workspace_reserve(ember_session *s, int64_t n, ember_error *err) {
    ember_workspace *w = &s->ws;
    if (n <= w->cap_tokens) return EMBER_OK;
    workspace_buffer bufs[EMBER_WORKSPACE_BUFFERS];
    workspace_buffers(s->model, w, bufs);
    for (size_t i = 0; i < EMBER_WORKSPACE_BUFFERS; i++) {
        float *p = realloc(*bufs[i].p, (size_t)n * (size_t)bufs[i].width * sizeof(float));
        if (!p)
            return ember_error_set(err, EMBER_ERR_NOMEM, "session: cannot allocate a %lld-token workspace",
                                   (long long)n);
        *bufs[i].p = p;
    }
    w->cap_tokens = n;
    return EMBER_OK;
}

/* ---- non-finite values ------------------------------------------------------------------------
 * The steady state pays one pass over the logits row. Only when it finds a NaN or infinity does a
 * second, locating pass rerun the same evaluation (same position, so the cache rows it rewrites get
 * the same values) with a check after every hook point, the experiment's own hooks still called
 * first so that a hook that writes NaN is found where it wrote it.
 * In the logits, -inf is a value, not a failure: it is how an after_logits hook bans a token, and
 * the sampler gives it probability 0. NaN, +inf, or every logit at -inf leave nothing to sample. */

/* The family's forward over n tokens of this session alone: a single-sequence pass. */
static ember_status session_forward(ember_session *s, const int32_t *ids, int64_t n, const ember_hooks *hooks,
                                    ember_error *err) {
    const ember_pass_seq seq = {.s = s, .row = 0, .n = n};
    const ember_sequence info = {.index = 0, .first_row = 0, .length = n, .start_position = s->pos};
    const ember_pass p = {.host = s, .ids = ids, .n = n, .n_seq = 1, .seq = &seq, .sequences = &info};
    return s->model->family->forward(&p, hooks, err);
}

static ember_status nonfinite_error(ember_session *s, const int32_t *ids, int64_t n, const ember_hooks *hooks,
                                    int64_t bad, float bad_value, ember_error *err) {
    const ember_model *m = s->model;
    ember_nonfinite_locator lc = {.user = hooks, .rows = -1, .logits_row = -1};
    const ember_hooks all = ember_nonfinite_hooks(&lc);
    ember_error pass_err = {0};
    ember_status st = ember_workspace_reserve(s, n, &pass_err); /* hooked: the whole batch at once */
    s->head_bad = -1;
    if (st == EMBER_OK) st = session_forward(s, ids, n, &all, &pass_err);
    if (st != EMBER_OK && !lc.found) return ember_error_set(err, st, "%s", pass_err.msg);
    s->has_logits = false;
    char where[192];
    ember_nonfinite_where(&lc, s->head_bad, s->head_bad_value, where, sizeof where);
    return ember_error_set(err, EMBER_ERR_NONFINITE,
                           "%s: evaluation at position %lld produced non-finite logits (logit %lld = %g); %s "
                           "(allow_nonfinite = true keeps going)",
                           m->gguf->path, (long long)s->pos, (long long)bad, (double)bad_value, where);
}

/* The attention_pattern stage's buffer: one layer's pattern, n_head * n rows of pos + n keys.
 * Grown before the forward pass (never inside it), and at least to one decode row per head over
 * the whole context, so decoding after a hooked prefill does not grow it token by token. A run
 * that never hooks the stage never allocates it. */
static ember_status reserve_pattern(ember_session *s, int64_t n, ember_error *err) {
    ember_workspace *w = &s->ws;
    const int64_t heads = s->model->n_head, need = heads * n * (s->pos + n);
    if (need <= w->cap_pattern) return EMBER_OK;
    const int64_t want = need > heads * s->n_ctx ? need : heads * s->n_ctx;
    float *p = realloc(w->pattern, (size_t)want * sizeof(float));
    if (!p)
        return ember_error_set(err, EMBER_ERR_NOMEM,
                               "session: cannot allocate the attention pattern (%lld heads x %lld rows x %lld keys)",
                               (long long)heads, (long long)n, (long long)(s->pos + n));
    w->pattern = p;
    w->cap_pattern = want;
    return EMBER_OK;
}

/* Prompts are evaluated s->prefill_slice tokens at a time when nothing observes the pass (no hook,
 * no trace, no per-row logits), so the workspace holds a slice instead of the whole prompt (58 MiB
 * of it for 512 tokens of LLaMA-3.2-1B). Every value stays the same, bit for bit: a token's
 * products and attention do not depend on the other tokens of its batch (tests/
 * test_pass_identity.c), and the products take 64 tokens at a time anyway. Observed passes stay
 * whole because hooks and traces see one evaluation of all n tokens. */

static bool observed(const ember_session *s, const ember_hooks *hooks) {
    if (s->trace || s->all_logits || (hooks && hooks->saes)) return true;
    for (int i = 0; hooks && i < EMBER_STAGE_COUNT; i++)
        if (hooks->on_tensor[i]) return true;
    return false;
}

/* The forward pass over n tokens from s->pos, in slices when unobserved; s->pos is left as it was. */
static ember_status forward_slices(ember_session *s, const int32_t *ids, int64_t n, int64_t slice,
                                   const ember_hooks *hooks, ember_error *err) {
    const int64_t pos0 = s->pos;
    ember_status st = EMBER_OK;
    for (int64_t done = 0; st == EMBER_OK && done < n; done += slice) {
        s->pos = pos0 + done;
        s->head_off = done + slice < n; /* the LM head is a whole read of its weights: once, at the end */
        st = session_forward(s, ids + done, n - done < slice ? n - done : slice, hooks, err);
    }
    s->head_off = false;
    s->pos = pos0;
    return st;
}

ember_status ember_check_tokens(const ember_session *s, const int32_t *ids, int64_t n, const char *who,
                                ember_error *err) {
    if (n < 1) return ember_error_set(err, EMBER_ERR_ARG, "%s: no tokens to evaluate", who);
    if (n > s->n_ctx - s->pos)
        return ember_error_set(err, EMBER_ERR_CONTEXT,
                               "%s: context is full (%lld of %lld positions used, %lld more requested)", who,
                               (long long)s->pos, (long long)s->n_ctx, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->model->n_vocab)
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "%s: token id %d at index %lld is outside the vocabulary (0..%lld)", who, ids[i],
                                   (long long)i, (long long)s->model->n_vocab - 1);
    return EMBER_OK;
}

static ember_status evaluate(ember_session *s, ember_phase phase, const int32_t *ids, int64_t n,
                             const ember_hooks *hooks, ember_error *err) {
    ember_status st = ember_check_tokens(s, ids, n, "session", err);
    if (st != EMBER_OK) return st;
    /* the weights are read from the file's mapping: refuse to compute on a file that changed */
    st = ember_model_check_unchanged(s->model, err);
    if (st != EMBER_OK) return st;
    const int64_t slice = observed(s, hooks) || n <= s->prefill_slice ? n : s->prefill_slice;
    st = ember_workspace_reserve(s, slice, err);
    if (st == EMBER_OK && hooks && hooks->on_tensor[EMBER_STAGE_ATTENTION_PATTERN]) st = reserve_pattern(s, n, err);
    if (st != EMBER_OK) return st;
    if (s->all_logits && n > s->ws.all_cap) { /* grown once to the largest batch asked, like the rest */
        float *p = realloc(s->ws.all_logits, (size_t)n * (size_t)s->model->n_vocab * sizeof(float));
        if (!p)
            return ember_error_set(err, EMBER_ERR_NOMEM, "session: cannot allocate the logits of %lld positions",
                                   (long long)n);
        s->ws.all_logits = p;
        s->ws.all_cap = n;
    }
    s->has_logits = false;
    s->n_all = 0;
    s->head_bad = -1;
    s->phase = phase;
    if (s->trace) ember_trace_eval_start(s->trace, s, phase, n);
    st = forward_slices(s, ids, n, slice, hooks, err);
    /* a truncation during the evaluation: the weights read as zeros, so its result is void */
    ember_error changed = {0};
    if (ember_model_check_unchanged(s->model, &changed) != EMBER_OK) {
        if (err) *err = changed;
        if (s->trace) ember_trace_eval_end(s->trace, false);
        return changed.code;
    }
    if (st == EMBER_OK && !s->allow_nonfinite) {
        /* the head checked what it computed (attention.c); what an after_logits hook wrote is
         * checked here, where -inf is a banned token */
        int64_t bad = s->head_bad;
        float bad_value = s->head_bad_value;
        if (bad < 0 && ember_hook_wants(hooks, EMBER_STAGE_AFTER_LOGITS)) {
            bad = ember_logits_first_nonfinite(s->ws.logits, s->model->n_vocab);
            if (bad >= 0) bad_value = s->ws.logits[bad];
        }
        if (bad >= 0) {
            /* the locating pass repeats the evaluation: it is not a step of the run, so untraced */
            ember_trace *t = s->trace;
            s->trace = NULL;
            st = nonfinite_error(s, ids, n, hooks, bad, bad_value, err);
            s->trace = t;
        }
    }
    if (s->trace) ember_trace_eval_end(s->trace, st == EMBER_OK);
    if (st != EMBER_OK) return st; /* the cache beyond pos may hold partial rows; pos is unchanged */
    s->pos += n;
    s->has_logits = true;
    s->n_all = s->all_logits ? n : 0;
    return EMBER_OK;
}

ember_status ember_session_prefill(ember_session *s, const int32_t *ids, int64_t n, const ember_hooks *hooks,
                                   ember_error *err) {
    return evaluate(s, EMBER_PHASE_PREFILL, ids, n, hooks, err);
}

ember_status ember_session_decode(ember_session *s, int32_t id, const ember_hooks *hooks, ember_error *err) {
    return evaluate(s, EMBER_PHASE_DECODE, &id, 1, hooks, err);
}

const float *ember_session_logits(const ember_session *s) { return s->has_logits ? s->ws.logits : NULL; }

void ember_session_set_all_logits(ember_session *s, bool on) { s->all_logits = on; }

const float *ember_session_all_logits(const ember_session *s, int64_t *n_rows) {
    *n_rows = s->has_logits ? s->n_all : 0;
    return *n_rows > 0 ? s->ws.all_logits : NULL;
}
int64_t ember_session_position(const ember_session *s) { return s->pos; }
int64_t ember_session_context(const ember_session *s) { return s->n_ctx; }
const ember_model *ember_session_model(const ember_session *s) { return s->model; }

void ember_session_set_allow_nonfinite(ember_session *s, bool allow) { s->allow_nonfinite = allow; }

void ember_session_reset(ember_session *s) {
    s->pos = 0;
    s->has_logits = false;
    s->n_all = 0;
}

/* The KV cache holds one row per position, written by the evaluation of that position and read
 * by later ones; nothing else the session keeps depends on the positions evaluated (the workspace
 * is rewritten by every pass). So moving the position back to p keeps rows 0..p-1 exactly as
 * their evaluation left them, and the next evaluation overwrites p.. as if the run had gone
 * there directly (tests/test_session_rewind.c checks it bit for bit). */
ember_status ember_session_rewind(ember_session *s, int64_t position, ember_error *err) {
    if (position < 0 || position > s->pos)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "session: cannot rewind to position %lld (the cache holds positions 0..%lld)",
                               (long long)position, (long long)s->pos - 1);
    s->pos = position;
    s->has_logits = false;
    s->n_all = 0;
    return EMBER_OK;
}
