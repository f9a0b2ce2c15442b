/* family_phi3.c — the Phi-3 family's hyper-parameters and tensors as llama.cpp reads them: the llama
 * block (family_llama.c's forward, NEOX RoPE) over a fused [q | k | v] projection and a fused
 * [gate | up] MLP input, bound as row ranges of the file's tensors; LongRoPE's short and long
 * frequency factors; a sliding window on every layer where the file sets one. Computes nothing. */
#include "model_bind.h"

#include <math.h>
#include <stdio.h>

/* The keys llama.cpp's phi3 reads besides the llama ones, and what its graph assumes: Q is as wide
 * as the residual (the fused views start K at n_embd), no other RoPE scaling than LongRoPE's. */
static ember_status phi3_hparams(binder *b) {
    ember_model *m = b->m;
    TRY(hp_require(b, "attention.layer_norm_rms_epsilon"));
    TRY(ember_llama_hparams(b));
    if (m->head_dim * m->n_head != m->n_embd)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "metadata key '%s.attention.key_length': head size %lld, but phi3's fused QKV needs "
                         "heads x head size = width (%lld heads, width %lld)",
                         b->arch, (long long)m->head_dim, (long long)m->n_head, (long long)m->n_embd);
    float factor;
    TRY(hp_rope_scaling(b, &factor));
    if (factor != 1.0f)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED,
                         "metadata key '%s.rope.scaling.factor' = %g: phi3 scales RoPE only by its LongRoPE factors",
                         b->arch, (double)factor);
    /* LongRoPE's attention factor multiplies the cosines and sines of the rotation (llama.cpp's
     * mscale), so each of q and k by it over the rotated dims: with every dim rotated, q.k by its
     * square, which is where it goes here. */
    float attn_factor;
    TRY(hp_float(b, "rope.scaling.attn_factor", &attn_factor, 1.0f));
    if (!(attn_factor > 0.0f) || !isfinite(attn_factor))
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s.rope.scaling.attn_factor' = %g must be positive",
                         b->arch, (double)attn_factor);
    if (attn_factor != 1.0f && m->n_rot != m->head_dim)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED,
                         "metadata key '%s.rope.scaling.attn_factor' = %g with %lld of %lld dims rotated: the factor "
                         "scales only the rotated dims, which phi3 here supports only when every dim is rotated",
                         b->arch, (double)attn_factor, (long long)m->n_rot, (long long)m->head_dim);
    m->attn_scale *= attn_factor * attn_factor;
    TRY(hp_int(b, "attention.sliding_window", &m->window, false, 0));
    if (m->window < 0)
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s.attention.sliding_window' = %lld must be >= 0", b->arch,
                         (long long)m->window);
    TRY(hp_int(b, "rope.scaling.original_context_length", &m->rope_ctx_orig, false, m->n_ctx_train));
    if (!ember_gguf_find_tensor(m->gguf, "output.weight"))
        return bind_fail(b, EMBER_ERR_FORMAT, "tensor 'output.weight' is missing: a %s head is never tied", b->arch);
    return EMBER_OK;
}

/* LongRoPE: both factor tensors or neither (llama.cpp picks one by the context, so a lone one would
 * leave some contexts without factors). */
static ember_status bind_rope_factors(binder *b) {
    ember_model *m = b->m;
    TRY(bind_vec(b, "rope_factors_short.weight", m->n_rot / 2, false, &m->rope_freqs));
    TRY(bind_vec(b, "rope_factors_long.weight", m->n_rot / 2, false, &m->rope_freqs_long));
    if (!m->rope_freqs != !m->rope_freqs_long)
        return bind_fail(b, EMBER_ERR_FORMAT, "tensor '%s' is missing: LongRoPE needs both the short and long factors",
                         m->rope_freqs ? "rope_factors_long.weight" : "rope_factors_short.weight");
    return EMBER_OK;
}

/* One layer: the fused tensors split into the llama block's matrices (rows of the same bytes). */
static ember_status bind_phi3_layer(binder *b, int64_t l, ember_layer *L) {
    const ember_model *m = b->m;
    const int64_t d = m->n_embd, kv_dim = L->kv_dim;
    char n[128];
    ember_matrix qkv, gate_up;
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
    TRY(bind_vec(b, NAME("attn_norm.weight"), d, true, &L->attn_norm));
    TRY(bind_mat(b, NAME("attn_qkv.weight"), d, d + 2 * kv_dim, true, &qkv));
    TRY(bind_mat(b, NAME("attn_output.weight"), d, d, true, &L->wo));
    TRY(bind_vec(b, NAME("ffn_norm.weight"), d, true, &L->ffn_norm));
    TRY(bind_mat(b, NAME("ffn_up.weight"), d, 2 * m->n_ff, true, &gate_up));
    TRY(bind_mat(b, NAME("ffn_down.weight"), m->n_ff, d, true, &L->w_down));
#undef NAME
    bind_mat_rows(&qkv, 0, d, &L->wq);
    bind_mat_rows(&qkv, d, kv_dim, &L->wk);
    bind_mat_rows(&qkv, d + kv_dim, kv_dim, &L->wv);
    bind_mat_rows(&gate_up, 0, m->n_ff, &L->w_gate);
    bind_mat_rows(&gate_up, m->n_ff, m->n_ff, &L->w_up);
    return EMBER_OK;
}

/* Hyper-parameters and tensors of phi3 (llama.cpp's names and layouts). */
ember_status ember_phi3_bind(binder *b) {
    ember_model *m = b->m;
    TRY(phi3_hparams(b));
    TRY(bind_common(b));
    TRY(bind_rope_factors(b));
    int64_t kv_dim, gate_up;
    TRY(hp_mul(b, "key/value width (KV heads x head size)", m->n_head_kv, m->head_dim, &kv_dim));
    TRY(hp_mul(b, "fused gate and up width (2 x feed_forward_length)", 2, m->n_ff, &gate_up));
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        bind_layer_geometry(L, l, m->n_ff, m->n_head_kv, m->head_dim);
        L->sliding = m->window > 0;
        TRY(bind_phi3_layer(b, l, L));
    }
    return EMBER_OK;
}
