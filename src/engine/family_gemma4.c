/* family_gemma4.c — the Gemma block: Gemma 4 dense, text only (SPEC §2.1: per-layer embeddings,
 * sliding and full layers with their own head sizes and RoPE, Q/K/V norms, shared-KV layers,
 * post-norms, softcap), and Gemma 2 and 3 as the same block without per-layer inputs, shared KV or
 * V norm (Gemma 2: attention and final softcaps; Gemma 3: QK-norm, its own RoPE on sliding layers).
 * Every step that differs from the llama block is spelled out here rather than flagged there. */
#include "backward.h"
#include "model_bind.h"
#include "rows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-layer inputs of n tokens: (token's PLE row * sqrt(ple) + rmsnorm(proj(x) / sqrt(d))) / sqrt(2).
 * x holds the already-scaled input embeddings (n, d); out is (n, n_layer*ple). */
static void per_layer_inputs(const ember_model *m, const int32_t *ids, const float *x, float *out, float *tmp,
                             int64_t n) {
    const int64_t d = m->n_embd, ple = m->ple_dim, width = m->n_layer * ple;
    ember_matmul(m->compute, &m->ple_proj, x, out, n);
    const float proj_scale = 1.0f / sqrtf((float)d), tok_scale = sqrtf((float)ple);
    const float mix = 1.0f / sqrtf(2.0f);
    for (int64_t t = 0; t < n; t++) {
        float *row = out + t * width;
        for (int64_t i = 0; i < width; i++) row[i] *= proj_scale;
        for (int64_t l = 0; l < m->n_layer; l++)
            m->ops->rmsnorm(row + l * ple, row + l * ple, m->ple_proj_norm, ple, m->norm_eps);
    }
    for (int64_t t = 0; t < n; t++) {
        float *row = out + t * width;
        ember_embedding_row(m, &m->ple_tok_embd, ids[t], tmp);
        for (int64_t i = 0; i < width; i++) row[i] = (row[i] + tmp[i] * tok_scale) * mix;
    }
}

/* Layer l's attention sub-block: norm, Q (and K/V when the layer computes its own cache), the
 * attention stages, output, post-norm, after_attention, residual add. */
static ember_status gemma4_attention(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                     ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const ember_layer *L = &m->layers[l];
    const int64_t d = m->n_embd, n = p->n, hd = L->head_dim;
    const float eps = m->norm_eps;
    ember_trace *tr = s->trace;
    ember_status st;
    ember_rows_rmsnorm(m, w->xn, w->x, L->attn_norm, n, d, eps);
    ember_trace_step(tr, "attn_norm", l, EMBER_KOP_RMSNORM, NULL, w->xn, n, d);
    /* Q, and K/V when this layer computes its own cache, in one product over the shared input */
    const bool own_kv = L->kv_source == l, has_v = own_kv && L->wv.data;
    ember_matmul_multi(m->compute, own_kv ? (has_v ? 3 : 2) : 1, (const ember_matrix *const[]){&L->wq, &L->wk, &L->wv},
                       w->xn, (float *const[]){w->q, w->k, w->v}, n);
    ember_trace_step(tr, "attn_q", l, EMBER_KOP_PRODUCT, &L->wq, w->q, n, m->n_head * hd);
    if (own_kv) ember_trace_step(tr, "attn_k", l, EMBER_KOP_PRODUCT, &L->wk, w->k, n, L->kv_dim);
    if (has_v) ember_trace_step(tr, "attn_v", l, EMBER_KOP_PRODUCT, &L->wv, w->v, n, L->kv_dim);
    ember_tape_keep(s, l, EMBER_TAPE_Q, w->q, n, m->n_head * hd); /* the backward's: before norm and RoPE */
    if (own_kv) ember_tape_keep(s, l, EMBER_TAPE_K, w->k, n, L->kv_dim);
    ember_pass_norm_rope(p, w->q, m->n_head, hd, L->q_norm, eps, L->n_rot, L->rope_base, true, L->rope_freqs);
    ember_trace_step(tr, "q_rope", l, EMBER_KOP_ROPE, NULL, w->q, n, m->n_head * hd);
    if (own_kv) {
        if (!has_v) memcpy(w->v, w->k, (size_t)(n * L->kv_dim) * sizeof(float)); /* V = raw K projection */
        ember_pass_norm_rope(p, w->k, L->n_head_kv, hd, L->k_norm, eps, L->n_rot, L->rope_base, true, L->rope_freqs);
        ember_trace_step(tr, "k_rope", l, EMBER_KOP_ROPE, NULL, w->k, n, L->kv_dim);
        if (m->family->v_norm) { /* gemma4: every V head RMS-normalized without a weight */
            ember_rows_rmsnorm(m, w->v, w->v, NULL, n * L->n_head_kv, hd, eps);
            ember_trace_step(tr, "v_norm", l, EMBER_KOP_RMSNORM, NULL, w->v, n, L->kv_dim);
        }
        ember_pass_kv_store(p, l, w->k, w->v, L->kv_dim);
    }
    /* a shared-KV layer mixes its donor's cache with its own query: its pattern and heads */
    const int64_t window = L->sliding ? m->window : 0;
    if ((st = ember_attention_stages(p, hooks, ctx, l, L, m->attn_scale, window, err))) return st;
    ember_matmul(m->compute, &L->wo, w->att, w->attn, n);
    ember_trace_step(tr, "attn_output", l, EMBER_KOP_PRODUCT, &L->wo, w->attn, n, d);
    ember_tape_keep(s, l, EMBER_TAPE_ATTN, w->attn, n, d);
    ember_rows_rmsnorm(m, w->attn, w->attn, L->post_attn_norm, n, d, eps);
    ember_trace_step(tr, "attn_post_norm", l, EMBER_KOP_RMSNORM, NULL, w->attn, n, d);
    if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_ATTENTION, ctx, l, w->attn, n, d, err))) return st;
    ember_add_into(w->x, w->attn, n * d);
    ember_trace_step(tr, "attn_residual", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
    ember_tape_keep(s, l, EMBER_TAPE_X_MID, w->x, n, d);
    return EMBER_OK;
}

/* Layer l's per-layer embedding step: gelu(gate . h) * this layer's input -> proj -> norm -> add. */
static void gemma4_per_layer_input(const ember_pass *p, int64_t l) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    const int64_t n = p->n;
    ember_workspace *w = &s->ws;
    const ember_layer *L = &m->layers[l];
    const int64_t d = m->n_embd, ple = m->ple_dim;
    ember_trace *tr = s->trace;
    ember_matmul(m->compute, &L->inp_gate, w->x, w->ple_gate, n);
    ember_trace_step(tr, "ple_gate", l, EMBER_KOP_PRODUCT, &L->inp_gate, w->ple_gate, n, ple);
    for (int64_t t = 0; t < n; t++)
        m->ops->gelu_mul_ref(w->ple_gate + t * ple, w->ple + t * m->n_layer * ple + l * ple, ple);
    ember_trace_step(tr, "ple_act", l, EMBER_KOP_GELU_MUL_REF, NULL, w->ple_gate, n, ple);
    ember_matmul(m->compute, &L->proj, w->ple_gate, w->mlp, n);
    ember_trace_step(tr, "ple_proj", l, EMBER_KOP_PRODUCT, &L->proj, w->mlp, n, d);
    ember_rows_rmsnorm(m, w->mlp, w->mlp, L->post_norm, n, d, m->norm_eps);
    ember_trace_step(tr, "ple_post_norm", l, EMBER_KOP_RMSNORM, NULL, w->mlp, n, d);
    ember_add_into(w->x, w->mlp, n * d);
}

ember_status ember_gemma4_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd, ple = m->ple_dim, n = p->n;
    const float eps = m->norm_eps;
    ember_trace *tr = s->trace;
    ember_eval_ctx ctx = ember_forward_ctx(p);
    ember_status st = ember_pass_embed(p, sqrtf((float)d), err);
    if (st) return st;
    if (ple > 0) {
        per_layer_inputs(m, p->ids, w->x, w->ple, w->ple_row, n);
        ember_trace_step(tr, "per_layer_inputs", -1, EMBER_KOP_PRODUCT, &m->ple_proj, w->ple, n, m->n_layer * ple);
    }

    for (int64_t l = 0; l < m->n_layer; l++) {
        const ember_layer *L = &m->layers[l];
        if ((st = ember_pass_layer_start(p, hooks, &ctx, l, err))) return st;
        if ((st = gemma4_attention(p, hooks, &ctx, l, err))) return st;

        /* GELU-gated MLP */
        ember_rows_rmsnorm(m, w->xn, w->x, L->ffn_norm, n, d, eps);
        ember_trace_step(tr, "ffn_norm", l, EMBER_KOP_RMSNORM, NULL, w->xn, n, d);
        ember_matmul_multi(m->compute, 2, (const ember_matrix *const[]){&L->w_gate, &L->w_up}, w->xn,
                           (float *const[]){w->gate, w->up}, n);
        ember_trace_step(tr, "ffn_gate", l, EMBER_KOP_PRODUCT, &L->w_gate, w->gate, n, L->n_ff);
        ember_trace_step(tr, "ffn_up", l, EMBER_KOP_PRODUCT, &L->w_up, w->up, n, L->n_ff);
        ember_tape_keep(s, l, EMBER_TAPE_GATE, w->gate, n, L->n_ff);
        ember_tape_keep(s, l, EMBER_TAPE_UP, w->up, n, L->n_ff);
        ember_rows_gelu_mul(m, w->gate, w->up, n, L->n_ff);
        ember_trace_step(tr, "ffn_act", l, EMBER_KOP_GELU_MUL, NULL, w->gate, n, L->n_ff);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_MLP_ACTIVATION, &ctx, l, w->gate, n, L->n_ff, err))) return st;
        ember_matmul(m->compute, &L->w_down, w->gate, w->mlp, n);
        ember_trace_step(tr, "ffn_down", l, EMBER_KOP_PRODUCT, &L->w_down, w->mlp, n, d);
        ember_tape_keep(s, l, EMBER_TAPE_MLP, w->mlp, n, d);
        ember_rows_rmsnorm(m, w->mlp, w->mlp, L->post_ffw_norm, n, d, eps);
        ember_trace_step(tr, "ffn_post_norm", l, EMBER_KOP_RMSNORM, NULL, w->mlp, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_MLP, &ctx, l, w->mlp, n, d, err))) return st;
        ember_add_into(w->x, w->mlp, n * d);
        ember_trace_step(tr, "ffn_residual", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);

        if (ple > 0) gemma4_per_layer_input(p, l);
        if (L->out_scale != 1.0f)
            for (int64_t i = 0; i < n * d; i++) w->x[i] *= L->out_scale;
        ember_trace_step(tr, "layer_output", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LAYER, &ctx, l, w->x, n, d, err))) return st;
    }

    ember_tape_keep(s, -1, EMBER_TAPE_X, w->x, n, d);
    return ember_logits_head(p, hooks, &ctx, err);
}

/* A per-layer hyper-parameter: an array with one entry per layer, or one integer for all. */
static ember_status per_layer_int(binder *b, const char *suffix, int64_t l, int64_t *out) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", b->arch, suffix);
    const gguf_kv *kv = ember_gguf_find(b->m->gguf, key);
    if (!kv) return bind_fail(b, EMBER_ERR_FORMAT, "missing metadata key '%s'", key);
    if (kv->value.type != GGUF_TYPE_ARRAY) return hp_dim(b, suffix, out, true, 0);
    double v;
    if (kv->value.v.arr.count != (uint64_t)b->m->n_layer || !ember_gguf_array_number(&kv->value, (uint64_t)l, &v) ||
        !(v >= 0) || v > (double)b->m->gguf->max_extent)
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s' must hold one number per layer (%lld)", key,
                         (long long)b->m->n_layer);
    *out = (int64_t)v;
    return EMBER_OK;
}

static ember_status layer_is_sliding(binder *b, int64_t l, bool *out) {
    char key[256];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", b->arch);
    const gguf_kv *kv = ember_gguf_find(b->m->gguf, key);
    double v;
    if (!kv || kv->value.type != GGUF_TYPE_ARRAY || kv->value.v.arr.count != (uint64_t)b->m->n_layer ||
        !ember_gguf_array_number(&kv->value, (uint64_t)l, &v))
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s' must be a bool array with one entry per layer", key);
    *out = v != 0.0;
    return EMBER_OK;
}

/* The tensors of layer l every Gemma has (llama.cpp's names), for its head size, KV width and MLP
 * width already set in L: the norms around attention and MLP, Q (and the per-head Q/K norms where
 * the family has QK-norm), K and V when the layer computes its own cache (V optional where the
 * family norms V: gemma4), O, and the gated MLP. */
static ember_status bind_gemma_layer(binder *b, int64_t l, ember_layer *L) {
    const ember_model *m = b->m;
    const int64_t d = m->n_embd;
    const bool qk_norm = m->family->qk_norm;
    int64_t q_dim;
    char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
    TRY(hp_mul(b, "query width (heads x head size)", m->n_head, L->head_dim, &q_dim));
    TRY(bind_vec(b, NAME("attn_norm.weight"), d, true, &L->attn_norm));
    TRY(bind_mat(b, NAME("attn_q.weight"), d, q_dim, true, &L->wq));
    if (qk_norm) TRY(bind_vec(b, NAME("attn_q_norm.weight"), L->head_dim, true, &L->q_norm));
    if (L->kv_source == l) {
        TRY(bind_mat(b, NAME("attn_k.weight"), d, L->kv_dim, true, &L->wk));
        TRY(bind_mat(b, NAME("attn_v.weight"), d, L->kv_dim, !m->family->v_norm, &L->wv));
        if (qk_norm) TRY(bind_vec(b, NAME("attn_k_norm.weight"), L->head_dim, true, &L->k_norm));
    }
    TRY(bind_mat(b, NAME("attn_output.weight"), q_dim, d, true, &L->wo));
    TRY(bind_vec(b, NAME("post_attention_norm.weight"), d, true, &L->post_attn_norm));
    TRY(bind_vec(b, NAME("ffn_norm.weight"), d, true, &L->ffn_norm));
    TRY(bind_mat(b, NAME("ffn_gate.weight"), d, L->n_ff, true, &L->w_gate));
    TRY(bind_mat(b, NAME("ffn_up.weight"), d, L->n_ff, true, &L->w_up));
    TRY(bind_mat(b, NAME("ffn_down.weight"), L->n_ff, d, true, &L->w_down));
    TRY(bind_vec(b, NAME("post_ffw_norm.weight"), d, true, &L->post_ffw_norm));
#undef NAME
    return EMBER_OK;
}

/* Hyper-parameters and tensors of Gemma 4 dense (llama.cpp's names). */
ember_status ember_gemma4_bind(binder *b) {
    ember_model *m = b->m;
    int64_t hd_full, hd_swa, rot_full, rot_swa, shared;
    float base_full, base_swa;
    TRY(bind_common_hparams(b));
    TRY(hp_int(b, "context_length", &m->n_ctx_train, false, 8192));
    TRY(hp_dim(b, "attention.key_length", &hd_full, true, 0));
    TRY(hp_dim(b, "attention.key_length_swa", &hd_swa, false, hd_full));
    TRY(hp_dim(b, "rope.dimension_count", &rot_full, false, hd_full));
    TRY(hp_dim(b, "rope.dimension_count_swa", &rot_swa, false, hd_swa));
    TRY(hp_float_positive(b, "rope.freq_base", &base_full, 1000000.0f));
    TRY(hp_float_positive(b, "rope.freq_base_swa", &base_swa, 10000.0f));
    TRY(hp_int(b, "attention.sliding_window", &m->window, true, 0));
    TRY(hp_int(b, "attention.shared_kv_layers", &shared, false, 0));
    TRY(hp_dim(b, "embedding_length_per_layer_input", &m->ple_dim, false, 0));
    TRY(hp_float(b, "final_logit_softcapping", &m->softcap, 0.0f));
    if (!isfinite(m->softcap) || m->softcap < 0.0f)
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s.final_logit_softcapping' = %g must be finite and >= 0",
                         b->arch, (double)m->softcap);
    TRY(hp_float_positive(b, "attention.layer_norm_rms_epsilon", &m->norm_eps, 1e-6f));
    if (m->n_layer < 1 || m->n_embd < 1 || m->n_head < 1 || shared >= m->n_layer || hd_full < 2 || hd_swa < 2 ||
        rot_full > hd_full || rot_swa > hd_swa || rot_full % 2 || rot_swa % 2)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "inconsistent hyper-parameters (%lld layers, %lld shared-KV layers, head sizes %lld/%lld)",
                         (long long)m->n_layer, (long long)shared, (long long)hd_full, (long long)hd_swa);
    m->head_dim = hd_full;
    m->n_rot = rot_full;
    m->rope_base = base_full;
    m->rope_neox = true;

    TRY(bind_common(b));
    TRY(bind_vec(b, "rope_freqs.weight", rot_full / 2, false, &m->rope_freqs));
    int64_t ple_width = 0;
    TRY(hp_mul(b, "per-layer input width (layers x per-layer width)", m->n_layer, m->ple_dim, &ple_width));
    if (m->ple_dim > 0) {
        TRY(bind_mat(b, "per_layer_token_embd.weight", ple_width, m->n_vocab, true, &m->ple_tok_embd));
        TRY(bind_mat(b, "per_layer_model_proj.weight", m->n_embd, ple_width, true, &m->ple_proj));
        TRY(bind_vec(b, "per_layer_proj_norm.weight", m->ple_dim, true, &m->ple_proj_norm));
    }

    const int64_t d = m->n_embd, kv_from = m->n_layer - shared;
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
        TRY(layer_is_sliding(b, l, &L->sliding));
        TRY(per_layer_int(b, "feed_forward_length", l, &L->n_ff));
        TRY(per_layer_int(b, "attention.head_count_kv", l, &L->n_head_kv));
        if (L->n_head_kv < 1 || m->n_head % L->n_head_kv)
            return bind_fail(b, EMBER_ERR_FORMAT, "layer %lld: %lld KV heads do not divide %lld heads", (long long)l,
                             (long long)L->n_head_kv, (long long)m->n_head);
        L->head_dim = L->sliding ? hd_swa : hd_full;
        L->n_rot = L->sliding ? rot_swa : rot_full;
        L->rope_base = L->sliding ? base_swa : base_full;
        L->rope_freqs = L->sliding ? NULL : m->rope_freqs; /* proportional RoPE: full layers only */
        TRY(hp_mul(b, "key/value width (KV heads x head size)", L->n_head_kv, L->head_dim, &L->kv_dim));
        /* Shared-KV layers read the last cache of their own kind before kv_from. */
        L->kv_source = l < kv_from ? l : kv_from - (L->sliding ? 2 : 1);
        if (L->kv_source < 0 || m->layers[L->kv_source].sliding != L->sliding ||
            m->layers[L->kv_source].kv_dim != L->kv_dim)
            return bind_fail(b, EMBER_ERR_FORMAT,
                             "layer %lld shares the KV cache of layer %lld, which has another kind or shape",
                             (long long)l, (long long)L->kv_source);
        TRY(bind_gemma_layer(b, l, L));
        if (m->ple_dim > 0) {
            TRY(bind_mat(b, NAME("inp_gate.weight"), d, m->ple_dim, true, &L->inp_gate));
            TRY(bind_mat(b, NAME("proj.weight"), m->ple_dim, d, true, &L->proj));
            TRY(bind_vec(b, NAME("post_norm.weight"), d, true, &L->post_norm));
        }
        const float *scale;
        TRY(bind_vec(b, NAME("layer_output_scale.weight"), 1, false, &scale));
        L->out_scale = scale ? scale[0] : 1.0f;
#undef NAME
    }
    m->n_ff = m->layers[0].n_ff;
    m->n_head_kv = m->layers[0].n_head_kv;
    m->attn_scale = 1.0f;
    return EMBER_OK;
}

/* ---- Gemma 2 and Gemma 3 ----------------------------------------------------------------------
 * What llama.cpp reads differently for the two (its gemma2 and gemma3 hyper-parameters): which
 * layers slide, the defaults of the window and the softcaps, the sliding layers' RoPE, and the
 * model size whose queries it scales by 1/sqrt(hidden / heads) instead of 1/sqrt(head size). */
typedef struct {
    int64_t swa_period;     /* layer l slides unless l % period == period - 1 (set_swa_pattern) */
    bool period_key;        /* attention.sliding_window_pattern may set another period (gemma3) */
    int64_t window_default; /* attention.sliding_window when absent; 0: no sliding layers */
    bool softcaps;          /* attention and final logit softcaps, 50 and 30 unless the file says */
    bool final_cap_key;     /* a final softcap only where the file gives final_logit_softcapping */
    bool swa_rope_own;      /* sliding layers: rope.freq_base_swa (10000), unscaled; else as global */
    int64_t layers_27b;     /* the 27B model's layer count (queries scaled by 1/sqrt(hidden / heads)) */
    bool tied_only;         /* the head is always the embedding: llama.cpp refuses an output.weight */
} gemma_generation;

static const gemma_generation GEMMA2 = {
    .swa_period = 2, .window_default = 4096, .softcaps = true, .layers_27b = 46, .tied_only = true};
static const gemma_generation GEMMA3 = {
    .swa_period = 6, .period_key = true, .final_cap_key = true, .swa_rope_own = true, .layers_27b = 62};

/* The sizes, norms, RoPE and attention settings of a Gemma 2/3 file, checked. */
static ember_status gemma23_hparams(binder *b, const gemma_generation *g, float *base_swa, float *rope_factor,
                                    int64_t *period) {
    ember_model *m = b->m;
    TRY(bind_common_hparams(b));
    TRY(hp_int(b, "context_length", &m->n_ctx_train, true, 0));
    TRY(hp_dim(b, "feed_forward_length", &m->n_ff, true, 0));
    TRY(hp_dim(b, "attention.head_count_kv", &m->n_head_kv, false, m->n_head));
    if (m->n_layer < 1 || m->n_embd < 1 || m->n_head < 1 || m->n_head_kv < 1 || m->n_head % m->n_head_kv)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "inconsistent hyper-parameters: %lld layers, width %lld, %lld heads, %lld KV heads",
                         (long long)m->n_layer, (long long)m->n_embd, (long long)m->n_head, (long long)m->n_head_kv);
    TRY(hp_require(b, "attention.layer_norm_rms_epsilon"));
    TRY(hp_float_positive(b, "attention.layer_norm_rms_epsilon", &m->norm_eps, 1e-6f));
    TRY(hp_head_size(b, &m->head_dim));
    TRY(hp_rope_dims(b, m->head_dim, &m->n_rot));
    TRY(hp_float_positive(b, "rope.freq_base", &m->rope_base, 10000.0f));
    *base_swa = m->rope_base;
    if (g->swa_rope_own) TRY(hp_float_positive(b, "rope.freq_base_swa", base_swa, 10000.0f));
    TRY(hp_rope_scaling(b, rope_factor));
    TRY(hp_int(b, "attention.sliding_window", &m->window, false, g->window_default));
    if (g->window_default > 0 && m->window < 1)
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s.attention.sliding_window' = %lld must be >= 1", b->arch,
                         (long long)m->window);
    *period = g->swa_period;
    if (g->period_key) TRY(hp_int(b, "attention.sliding_window_pattern", period, false, g->swa_period));
    if (g->softcaps) {
        TRY(hp_float_positive(b, "attn_logit_softcapping", &m->attn_softcap, 50.0f));
        TRY(hp_float_positive(b, "final_logit_softcapping", &m->softcap, 30.0f));
    } else if (g->final_cap_key) {
        TRY(hp_float(b, "final_logit_softcapping", &m->softcap, 0.0f));
        if (!isfinite(m->softcap) || m->softcap < 0.0f)
            return bind_fail(b, EMBER_ERR_FORMAT,
                             "metadata key '%s.final_logit_softcapping' = %g must be finite and >= 0", b->arch,
                             (double)m->softcap);
    }
    /* llama.cpp's query scale: 1/sqrt(hidden / heads) for the 27B models, else 1/sqrt(head size) */
    m->attn_scale = 1.0f / sqrtf((float)(m->n_layer == g->layers_27b ? m->n_embd / m->n_head : m->head_dim));
    m->rope_neox = true;
    return EMBER_OK;
}

/* Gemma 2 and 3: one head size, KV width and MLP width for every layer; the sliding layers every
 * layer but each period's last (all global when the window is 0). */
static ember_status bind_gemma23(binder *b, const gemma_generation *g) {
    ember_model *m = b->m;
    float base_swa, factor;
    int64_t period, kv_dim;
    TRY(gemma23_hparams(b, g, &base_swa, &factor, &period));
    TRY(hp_mul(b, "key/value width (KV heads x head size)", m->n_head_kv, m->head_dim, &kv_dim));
    if (g->tied_only && ember_gguf_find_tensor(m->gguf, "output.weight"))
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "tensor 'output.weight': a %s head is the token embedding (llama.cpp reads no output.weight)",
                         b->arch);
    TRY(bind_common(b));
    float *scaled = NULL; /* linear RoPE scaling: every pair's frequency divided by the factor */
    if (factor != 1.0f) {
        TRY(bind_owned(b, m->n_rot / 2, &scaled));
        for (int64_t i = 0; i < m->n_rot / 2; i++) scaled[i] = factor;
    }
    m->rope_freqs = scaled;
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        L->sliding = m->window > 0 && (period == 0 || l % period < period - 1);
        const bool own_rope = L->sliding && g->swa_rope_own;
        bind_layer_geometry(L, l, m->n_ff, m->n_head_kv, m->head_dim);
        L->n_rot = m->n_rot;
        L->rope_base = own_rope ? base_swa : m->rope_base;
        L->rope_freqs = own_rope ? NULL : scaled;
        L->out_scale = 1.0f;
        TRY(bind_gemma_layer(b, l, L));
    }
    return EMBER_OK;
}

ember_status ember_gemma2_bind(binder *b) { return bind_gemma23(b, &GEMMA2); }
ember_status ember_gemma3_bind(binder *b) { return bind_gemma23(b, &GEMMA3); }
