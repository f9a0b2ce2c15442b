/* family_qwen3moe.c — Qwen3-MoE as llama.cpp runs it: the qwen3 attention (family_llama.c's: per-head
 * QK-norm, NEOX RoPE) and, in place of the MLP, routed SwiGLU experts: the router's logits
 * (ffn_gate_inp, the moe_router stage), a softmax over every expert, the top n_expert_used, their
 * probabilities renormalised to sum 1, the chosen experts' outputs summed with those weights; no
 * shared expert. Its hyper-parameters and tensors (ffn_{gate,up,down}_exps stacked per expert) too. */
#include "backward.h"
#include "model_bind.h"
#include "rows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ember_moe_route_row(const float *logits, int64_t E, int64_t k, int32_t *ids, float *weights) {
    float max = -INFINITY;
    for (int64_t e = 0; e < E; e++) max = logits[e] > max ? logits[e] : max;
    double total = 0;
    for (int64_t e = 0; e < E; e++) total += exp((double)logits[e] - max);
    double chosen = 0;
    for (int64_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t i = 0; i < j; i++) taken = taken || ids[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = (int32_t)e;
        }
        ids[j] = best;
        weights[j] = (float)(exp((double)logits[best] - max) / total);
        chosen += weights[j];
    }
    if (chosen < 6.103515625e-5) chosen = 6.103515625e-5;
    for (int64_t j = 0; j < k; j++) weights[j] = (float)(weights[j] / chosen);
}

/* The first of the n rows that bans every one of its E experts (-inf in every column), -1 if none:
 * such a row has nothing to route to (its softmax would be NaN and reach the logits far from here). */
static int64_t unroutable_row(const float *router, int64_t n, int64_t E) {
    for (int64_t t = 0; t < n; t++) {
        bool all = true;
        for (int64_t e = 0; e < E && all; e++) all = router[t * E + e] == -INFINITY;
        if (all) return t;
    }
    return -1;
}

int64_t ember_moe_expert_slots(const int32_t *ids, int64_t n, int64_t k, int32_t e, int32_t *rows) {
    int64_t c = 0;
    for (int64_t i = 0; i < n * k; i++)
        if (ids[i] == e) rows[c++] = (int32_t)i;
    return c;
}

/* Each expert's gate and up over the normed rows routed to it, SwiGLU, into its slot of w->gate
 * (row t holds the activations of its k experts in choice order, n_ff_exp each); layer l's. */
static void experts_up(ember_session *s, int64_t l, int64_t n) {
    const ember_model *m = s->model;
    const ember_layer *L = &m->layers[l];
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd, k = m->n_expert_used, f = m->n_ff_exp;
    const int32_t *ids = (const int32_t *)w->moe_ids;
    int32_t *rows = (int32_t *)w->moe_rows;
    for (int64_t e = 0; e < m->n_expert; e++) {
        const int64_t c = ember_moe_expert_slots(ids, n, k, (int32_t)e, rows);
        if (c == 0) continue;
        for (int64_t i = 0; i < c; i++) memcpy(w->moe_in + i * d, w->xn + rows[i] / k * d, (size_t)d * sizeof(float));
        ember_matmul_multi(m->compute, 2, (const ember_matrix *const[]){&L->exp_gate[e], &L->exp_up[e]}, w->moe_in,
                           (float *const[]){w->moe_g, w->moe_u}, c);
        for (int64_t i = 0; i < c; i++) { /* the backward's: each slot's gate and up where they lie */
            ember_tape_keep_cols(s, l, EMBER_TAPE_GATE, rows[i] / k, rows[i] % k * f, w->moe_g + i * f, f, k * f);
            ember_tape_keep_cols(s, l, EMBER_TAPE_UP, rows[i] / k, rows[i] % k * f, w->moe_u + i * f, f, k * f);
        }
        ember_rows_silu_mul(m, w->moe_g, w->moe_u, c, f);
        for (int64_t i = 0; i < c; i++) memcpy(w->gate + rows[i] * f, w->moe_g + i * f, (size_t)f * sizeof(float));
    }
}

/* Each expert's down projection of its slots of w->gate, added into w->mlp with the slot's weight,
 * experts in ascending order for every row whatever the batch. */
static void experts_down(const ember_model *m, const ember_layer *L, ember_workspace *w, int64_t n) {
    const int64_t d = m->n_embd, k = m->n_expert_used, f = m->n_ff_exp;
    const int32_t *ids = (const int32_t *)w->moe_ids;
    int32_t *rows = (int32_t *)w->moe_rows;
    memset(w->mlp, 0, (size_t)(n * d) * sizeof(float));
    for (int64_t e = 0; e < m->n_expert; e++) {
        const int64_t c = ember_moe_expert_slots(ids, n, k, (int32_t)e, rows);
        if (c == 0) continue;
        for (int64_t i = 0; i < c; i++) memcpy(w->moe_g + i * f, w->gate + rows[i] * f, (size_t)f * sizeof(float));
        ember_matmul(m->compute, &L->exp_down[e], w->moe_g, w->moe_out, c);
        for (int64_t i = 0; i < c; i++) {
            float *y = w->mlp + rows[i] / k * d;
            const float wt = w->moe_w[rows[i]], *o = w->moe_out + i * d;
            for (int64_t j = 0; j < d; j++) y[j] += wt * o[j];
        }
    }
}

/* The MoE block of layer l over w->x into w->mlp, with its moe_router, mlp_activation and after_mlp
 * stages (the last two see the choice in ctx). */
static ember_status moe_block(ember_session *s, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l, int64_t n,
                              ember_error *err) {
    const ember_model *m = s->model;
    const ember_layer *L = &m->layers[l];
    ember_workspace *w = &s->ws;
    ember_trace *tr = s->trace;
    const int64_t d = m->n_embd, E = m->n_expert, k = m->n_expert_used;
    ember_rows_rmsnorm(m, w->xn, w->x, L->ffn_norm, n, d, m->norm_eps);
    ember_trace_step(tr, "ffn_norm", l, EMBER_KOP_RMSNORM, NULL, w->xn, n, d);
    ember_matmul(m->compute, &L->gate_inp, w->xn, w->router, n);
    ember_trace_step(tr, "ffn_gate_inp", l, EMBER_KOP_PRODUCT, &L->gate_inp, w->router, n, E);
    ember_status st = ember_hook_call(hooks, EMBER_STAGE_MOE_ROUTER, ctx, l, w->router, n, E, err);
    if (st) return st;
    const int64_t bad = unroutable_row(w->router, n, E);
    if (bad >= 0)
        return ember_error_set(err, EMBER_ERR_HOOK,
                               "moe_router of layer %lld: token row %lld (0-based) bans all %lld experts (-inf in "
                               "every column); leave at least one allowed",
                               (long long)l, (long long)bad, (long long)E);
    for (int64_t t = 0; t < n; t++)
        ember_moe_route_row(w->router + t * E, E, k, (int32_t *)w->moe_ids + t * k, w->moe_w + t * k);
    ember_tape_keep(s, l, EMBER_TAPE_ROUTER, w->router, n, E);
    experts_up(s, l, n);
    ember_trace_step(tr, "ffn_moe_act", l, EMBER_KOP_SILU_MUL, NULL, w->gate, n, L->n_ff);
    ember_eval_ctx routed = *ctx;
    routed.n_experts_used = k;
    routed.expert_ids = (const int32_t *)w->moe_ids;
    routed.expert_weights = w->moe_w;
    if ((st = ember_hook_call(hooks, EMBER_STAGE_MLP_ACTIVATION, &routed, l, w->gate, n, L->n_ff, err))) return st;
    experts_down(m, L, w, n);
    ember_trace_step(tr, "ffn_moe_out", l, EMBER_KOP_ENGINE, NULL, w->mlp, n, d);
    return ember_hook_call(hooks, EMBER_STAGE_AFTER_MLP, &routed, l, w->mlp, n, d, err);
}

ember_status ember_qwen3moe_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd, n = p->n;
    ember_trace *tr = s->trace;
    ember_eval_ctx ctx = ember_forward_ctx(p);
    ember_status st = ember_pass_embed(p, 1.0f, err);
    if (st) return st;
    for (int64_t l = 0; l < m->n_layer; l++) {
        if ((st = ember_pass_layer_start(p, hooks, &ctx, l, err))) return st;
        if ((st = ember_llama_attention(p, hooks, &ctx, l, err))) return st;
        if ((st = moe_block(s, hooks, &ctx, l, n, err))) return st;
        ember_add_into(w->x, w->mlp, n * d);
        ember_trace_step(tr, "layer_output", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LAYER, &ctx, l, w->x, n, d, err))) return st;
    }
    ember_tape_keep(s, -1, EMBER_TAPE_X, w->x, n, d);
    return ember_logits_head(p, hooks, &ctx, err);
}

/* Tensor `suffix` of every layer: its extent `dim` must be `want` (the expert count the keys say),
 * checked before anything is allocated. */
static ember_status check_expert_extent(binder *b, const char *suffix, int dim, int64_t want, const char *key) {
    for (int64_t l = 0; l < b->m->n_layer; l++) {
        char name[128];
        snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, suffix);
        const gguf_tensor *t = ember_gguf_find_tensor(b->m->gguf, name);
        if (!t) return bind_fail(b, EMBER_ERR_FORMAT, "missing tensor '%s'", name);
        if (t->ne[dim] != want)
            return bind_fail(b, EMBER_ERR_FORMAT,
                             "metadata key '%s.%s' = %lld contradicts tensor '%s' ([%lld, %lld, %lld]: %lld experts)",
                             b->arch, key, (long long)want, name, (long long)t->ne[0], (long long)t->ne[1],
                             (long long)t->ne[2], (long long)t->ne[dim]);
    }
    return EMBER_OK;
}

/* The routing keys as llama.cpp's qwen3moe runs them: expert_count and expert_used_count required
 * (1 <= used <= count), softmax routing renormalised over the chosen (its graph's fixed choice: a
 * file that says otherwise is refused naming the key), each expert's width; then the tensors'
 * expert extents against the count, all before any allocation. */
static ember_status moe_hparams(binder *b) {
    ember_model *m = b->m;
    TRY(hp_int(b, "expert_count", &m->n_expert, true, 0));
    TRY(hp_int(b, "expert_used_count", &m->n_expert_used, true, 0));
    if (m->n_expert < 1 || m->n_expert_used < 1 || m->n_expert_used > m->n_expert)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "metadata keys '%s.expert_count' = %lld and '%s.expert_used_count' = %lld: the experts used "
                         "per token must be from 1 to the expert count",
                         b->arch, (long long)m->n_expert, b->arch, (long long)m->n_expert_used);
    int64_t norm, gating;
    TRY(hp_int(b, "expert_weights_norm", &norm, false, 1));
    TRY(hp_int(b, "expert_gating_func", &gating, false, 1));
    if (norm != 1 || gating != 1)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED,
                         "metadata key '%s.%s' = %lld: qwen3moe routes by softmax and renormalises the chosen "
                         "experts' weights",
                         b->arch, norm != 1 ? "expert_weights_norm" : "expert_gating_func",
                         (long long)(norm != 1 ? norm : gating));
    TRY(hp_dim(b, "expert_feed_forward_length", &m->n_ff_exp, false, m->n_ff / m->n_expert_used));
    if (m->n_ff_exp < 1)
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s.expert_feed_forward_length' must be >= 1", b->arch);
    TRY(check_expert_extent(b, "ffn_gate_inp.weight", 1, m->n_expert, "expert_count"));
    TRY(check_expert_extent(b, "ffn_gate_exps.weight", 2, m->n_expert, "expert_count"));
    TRY(check_expert_extent(b, "ffn_up_exps.weight", 2, m->n_expert, "expert_count"));
    return check_expert_extent(b, "ffn_down_exps.weight", 2, m->n_expert, "expert_count");
}

/* Hyper-parameters and tensors of qwen3moe (llama.cpp's names and layouts). */
ember_status ember_qwen3moe_bind(binder *b) {
    ember_model *m = b->m;
    TRY(hp_require(b, "attention.layer_norm_rms_epsilon"));
    TRY(ember_llama_hparams(b));
    TRY(moe_hparams(b));
    int64_t slots, per_layer;
    TRY(hp_mul(b, "the chosen experts' width (expert_used_count x expert_feed_forward_length)", m->n_expert_used,
               m->n_ff_exp, &slots));
    TRY(hp_mul(b, "expert matrices", 3 * m->n_layer, m->n_expert, &per_layer));
    TRY(bind_common(b));
    m->experts = calloc((size_t)per_layer, sizeof *m->experts);
    if (!m->experts) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
    const int64_t d = m->n_embd, E = m->n_expert, f = m->n_ff_exp;
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
        bind_layer_geometry(L, l, slots, m->n_head_kv, m->head_dim);
        TRY(ember_llama_bind_attention(b, l, L));
        L->exp_gate = m->experts + 3 * l * E;
        L->exp_up = L->exp_gate + E;
        L->exp_down = L->exp_up + E;
        TRY(bind_mat(b, NAME("ffn_gate_inp.weight"), d, E, true, &L->gate_inp));
        TRY(bind_experts(b, NAME("ffn_gate_exps.weight"), d, f, E, L->exp_gate));
        TRY(bind_experts(b, NAME("ffn_up_exps.weight"), d, f, E, L->exp_up));
        TRY(bind_experts(b, NAME("ffn_down_exps.weight"), f, d, E, L->exp_down));
#undef NAME
    }
    return EMBER_OK;
}
