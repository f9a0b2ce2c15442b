/* model.h — internal model and session structures shared by model.c, session.c and the family
 * forward passes. Everything here points into the GGUF mapping or into session-owned buffers. */
#ifndef EMBER_MODEL_H
#define EMBER_MODEL_H

#include "ember.h"
#include "gguf.h"
#include "hooks.h"
#include "kernels.h"

typedef struct {
    const float *attn_norm;            /* (n_embd) */
    const float *attn_norm_b;          /* (n_embd) LayerNorm bias, gpt2 only */
    ember_matrix wq, wk, wv, wo;       /* (n_head*head_dim, n_embd) ... (n_embd, n_head*head_dim) */
    ember_matrix wqkv;                 /* fused (3*n_embd, n_embd), gpt2 only */
    const float *bq, *bk, *bv, *bo;    /* biases or NULL */
    const float *bqkv;                 /* fused bias, gpt2 only */
    const float *q_norm, *k_norm;      /* (head_dim) per-head RMSNorm weights, qwen3 only */
    const float *ffn_norm;             /* (n_embd) */
    const float *ffn_norm_b;           /* (n_embd) gpt2 only */
    ember_matrix w_gate, w_up, w_down; /* (n_ff, n_embd), (n_ff, n_embd), (n_embd, n_ff) */
    const float *b_up, *b_down;        /* gpt2 only */
    int64_t n_ff;                      /* this layer's MLP width */
    int64_t n_head_kv;                 /* this layer's KV heads */
    int64_t head_dim;                  /* this layer's head size */
    int64_t kv_dim;                    /* n_head_kv * head_dim: width of this layer's K and V rows */
    int64_t kv_source;                 /* layer whose cache this layer reads (itself unless shared) */
    /* the Gemma block (gemma2, gemma3, gemma4) */
    bool sliding;  /* local attention over the last `window` positions */
    int64_t n_rot; /* rotated dims of this layer's heads */
    float rope_base;
    const float *rope_freqs;                                 /* (n_rot/2) or NULL: divisors of each pair's frequency */
    const float *post_attn_norm, *post_ffw_norm, *post_norm; /* (n_embd) */
    ember_matrix inp_gate, proj;                             /* (ple_dim, n_embd), (n_embd, ple_dim) */
    float out_scale;                                         /* layer_output_scale, 1 when absent */
    /* a mixture-of-experts layer (qwen3moe): the router and each expert's SwiGLU, or NULL (dense) */
    ember_matrix gate_inp;                      /* (n_expert, n_embd) router */
    ember_matrix *exp_gate, *exp_up, *exp_down; /* (n_expert) each: (n_ff_exp, n_embd), ..., (n_embd, n_ff_exp) */
} ember_layer;

struct ember_session;
struct binder;
struct ember_backward;
struct ember_tape;

/* One sequence of an evaluation: its session (its own KV cache, and its position s->pos where its
 * new rows start) and the rows row .. row + n - 1 of the pass that are its new tokens. */
typedef struct {
    struct ember_session *s;
    int64_t row, n;
} ember_pass_seq;

/* What a family forward evaluates: n rows of token ids, sequence after sequence. The host session's
 * workspace holds every row, and its trace, tape and flags (all_logits, head_off) are the pass's;
 * a single-sequence pass (session.c) is its one sequence's own session. */
typedef struct ember_pass {
    struct ember_session *host;
    const int32_t *ids;
    int64_t n;
    int64_t n_seq;
    const ember_pass_seq *seq;
    const ember_sequence *sequences; /* (n_seq) what the hooks' context says of them */
} ember_pass;

typedef ember_status (*ember_forward_fn)(const ember_pass *p, const ember_hooks *hooks, ember_error *err);

/* The norm a family's final norm (and so the logit lens, unembed.c) applies. */
typedef enum { EMBER_NORM_RMS = 0, EMBER_NORM_LAYER } ember_norm_kind;

/* A family: one row of the table in families.c, the one list of them. Adding a family is one row
 * here plus its forward file (docs/architecture.md, "Adding a family"). */
typedef struct {
    ember_family_info info;                 /* public: name, architectures, experimental */
    ember_status (*bind)(struct binder *b); /* hyper-parameters and tensors (model_bind.h) */
    ember_forward_fn forward;               /* the forward pass over a session's next tokens */
    ember_norm_kind final_norm;             /* output_norm's kind: RMSNorm, or LayerNorm with bias */
    /* The switches of the llama block (family_llama.c), which several families share: */
    bool rope_neox; /* split-half RoPE pairs (i, i+n_rot/2) instead of adjacent ones */
    bool qkv_bias;  /* Q, K and V projections have (required) biases */
    bool qk_norm;   /* per-head RMSNorm of Q and K before RoPE (required weights; also the Gemma block's) */
    bool moe;       /* routed experts (*_exps tensors) in place of the MLP; other rows refuse such files */
    /* The switch of the Gemma block (family_gemma4.c), which gemma2, gemma3 and gemma4 share: */
    bool v_norm; /* V heads RMS-normed without a weight, and V = the raw K projection where attn_v is
                  * absent (gemma4); else attn_v is required and V is used as projected */
    /* The backward pass (backward.h, docs/attribution.md) and the tape slots it needs of the
     * forward; NULL: the family has no gradients yet (ember_session_gradients says so). */
    ember_status (*backward)(struct ember_backward *b, ember_error *err);
    uint32_t (*tape_slots)(const struct ember_model *m);
} ember_family;

/* The family whose row accepts `architecture` (general.architecture), NULL when none does. */
const ember_family *ember_family_for_architecture(const char *architecture);

struct ember_model {
    ember_gguf *gguf;
    ember_gguf *override_gguf; /* the file overridden tensors come from (model_override.c), or NULL */
    char **override_names;     /* (n_override) the tensors whose table entries now point into it */
    int64_t n_override;
    ember_model_info info;
    const ember_family *family;  /* its row of the family table (families.c) */
    const ember_kernel_ops *ops; /* = ember_compute_ops(compute) */
    ember_compute *compute;      /* kernel table, thread pool, activation scratch (kernels/compute.c) */
    ember_type kv_type;          /* element type of the sessions' KV caches: F32, F16 or BF16 */

    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    int64_t n_rot; /* rotated dims per head */
    float rope_base;
    bool rope_neox;         /* split-half pairs (i, i+n_rot/2) instead of adjacent pairs */
    bool parallel_residual; /* gptneox: x + attn(ln1(x)) + mlp(ln2(x)) instead of one after the other */
    float norm_eps;
    float attn_scale;   /* multiplies q.k */
    float attn_softcap; /* > 0: attention scores capped to attn_softcap * tanh(s / attn_softcap) (gemma2) */

    ember_matrix tok_embd;        /* (n_vocab, n_embd) */
    ember_matrix pos_embd;        /* (n_ctx_train, n_embd) gpt2 only */
    ember_matrix output;          /* (n_vocab, n_embd); the embedding when tied */
    const float *output_norm;     /* (n_embd) */
    const float *output_norm_b;   /* (n_embd) gpt2 only */
    const float *rope_freqs;      /* (n_rot/2) LLaMA-3 scaling factors (phi3: LongRoPE's short ones) or NULL */
    const float *rope_freqs_long; /* phi3: LongRoPE's long factors, used by sessions longer than rope_ctx_orig */
    int64_t rope_ctx_orig;        /* phi3: rope.scaling.original_context_length (default: the trained context) */
    ember_layer *layers;          /* (n_layer) */
    /* gemma4 only */
    ember_matrix ple_tok_embd;  /* (n_vocab, n_layer*ple_dim) per-layer token embeddings */
    ember_matrix ple_proj;      /* (n_layer*ple_dim, n_embd) per_layer_model_proj */
    const float *ple_proj_norm; /* (ple_dim) */
    int64_t ple_dim;
    /* the Gemma block */
    int64_t window; /* sliding layers' window (keys p - window + 1 .. p) */
    /* mixture of experts (qwen3moe): expert_count, expert_used_count, each expert's MLP width */
    int64_t n_expert, n_expert_used, n_ff_exp;
    ember_matrix *experts; /* (3 * n_layer * n_expert) the layers' exp_gate/exp_up/exp_down point here */
    float softcap;         /* final logit softcap, 0 = none */

    bool allow_nonfinite; /* default of its sessions */
    float **owned;        /* f32 copies of small 1-D tensors stored as f16/bf16, and made-up vectors (bind_owned) */
    int64_t n_owned, cap_owned;
    char *architecture, *name, *dtype_summary;
};

/* Per-evaluation scratch, grown to the largest batch seen and then reused: no allocation in the
 * steady state. Shapes are for a batch of n tokens. */
typedef struct {
    int64_t cap_tokens;
    float *x;         /* (n, n_embd) residual stream */
    float *xn;        /* (n, n_embd) normed input of a sub-block */
    float *qkv;       /* (n, 3*n_embd) fused projection, gpt2 only */
    float *q;         /* (n, n_head*head_dim) */
    float *k, *v;     /* (n, kv_dim) */
    float *att;       /* (n, n_head*head_dim) attention output before the O projection */
    float *attn;      /* (n, n_embd) attention contribution */
    float *gate, *up; /* (n, n_ff); an MoE layer's gate: (n, n_expert_used * n_ff_exp) */
    float *mlp;       /* (n, n_embd) MLP contribution */
    /* mixture of experts: router logits (n, n_expert); one expert's rows in and out (n, n_embd), its
     * gate and up (n, n_ff_exp); the choice (n, n_expert_used): weights, and ids and their rows as
     * int32 (moe_ids, moe_rows: floats' storage, never read as floats) */
    float *router, *moe_in, *moe_out, *moe_g, *moe_u, *moe_w, *moe_ids, *moe_rows;
    float *ple;          /* (n, n_layer*ple_dim) gemma4 per-layer inputs */
    float *ple_gate;     /* (n, ple_dim) */
    float *ple_row;      /* (n_layer*ple_dim) one token's per-layer embedding row */
    float *scores;       /* ember_attention_scratch_floats(n_threads, n_ctx, n_head, max head size) */
    float *pattern;      /* (n_head * n, pos + n) one layer's attention pattern; allocated only when the
                        * attention_pattern stage is hooked (ember_session_reserve_pattern) */
    int64_t cap_pattern; /* floats pattern holds */
    float *last;         /* (n_embd) final-normed hidden of the last token */
    float *logits;       /* (n_vocab) */
    float *all_logits;   /* (all_cap, n_vocab) every row's logits, only while the session asks */
    int64_t all_cap;     /* rows all_logits holds */
} ember_workspace;

struct ember_session {
    ember_model *model;
    int64_t n_ctx, pos;
    int64_t prefill_slice;     /* tokens per forward pass of an unobserved prompt (session.c) */
    bool head_off;             /* the pass in progress is a slice before the last: no logits head */
    void **k_cache, **v_cache; /* (n_layer) -> (n_head_kv, n_ctx, head_dim) in model->kv_type (head-major),
                                  or NULL for shared-KV layers */
    ember_workspace ws;
    ember_phase phase; /* of the evaluation in progress */
    bool has_logits;
    bool allow_nonfinite;    /* skip the check of the logits (ember_session_set_allow_nonfinite) */
    int64_t head_bad;        /* the first non-finite logit the LM head computed this evaluation, -1 if none */
    float head_bad_value;    /* its value, before any softcap or hook */
    bool all_logits;         /* the logits head also fills ws.all_logits for every evaluated row */
    int64_t n_all;           /* rows of ws.all_logits from the last evaluation (0: not asked) */
    ember_trace *trace;      /* the trace every evaluation writes to, NULL when off (trace.c) */
    struct ember_tape *tape; /* what the forward keeps for a backward pass (backward.h), NULL when none */
};

/* The hooks' context of a pass: its rows, from its first sequence's position. */
static inline ember_eval_ctx ember_forward_ctx(const ember_pass *p) {
    const struct ember_session *s = p->host, *first = p->seq[0].s;
    return (ember_eval_ctx){.phase = s->phase,
                            .start_position = first->pos,
                            .input_token_count = p->n,
                            .sequence_length = first->pos + p->n,
                            .layer_index = -1,
                            .tracing = s->trace != NULL,
                            .sequences = p->sequences,
                            .n_sequences = p->n_seq};
}

/* The prologue every forward shares (pass.c): the embedding rows of the pass's ids into ws.x, times
 * scale (1: none), plus each sequence's learned position rows where the model has them (gpt2: a
 * position beyond them is an error), and the "embed" trace step. */
ember_status ember_pass_embed(const ember_pass *p, float scale, ember_error *err);
/* The start of layer l: the before_layer stage over ws.x and the tape's copy of it. */
ember_status ember_pass_layer_start(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                    ember_error *err);
/* Per-head RMSNorm (norm may be NULL) then RoPE of n_rot dims of every row of x (the pass's rows of
 * n_heads heads of hd values), each sequence's rows at its own positions (rows.c). */
void ember_pass_norm_rope(const ember_pass *p, float *x, int64_t n_heads, int64_t hd, const float *norm, float eps,
                          int64_t n_rot, float base, bool neox, const float *freq_factors);
/* The keys and values of the pass's rows into layer l's caches, each sequence's into its own
 * session's cache at its positions (ember_kv_store). */
void ember_pass_kv_store(const ember_pass *p, int64_t l, const float *k, const float *v, int64_t row_stride);

/* Grows the workspace to hold n tokens. */
ember_status ember_workspace_reserve(struct ember_session *s, int64_t n, ember_error *err);
/* Bytes of the workspace per token (session.c), and of one session's KV cache and attention
 * scratch for n_ctx positions (what ember_session_new checks against the memory available). */
int64_t ember_workspace_token_bytes(const ember_model *m);
uint64_t ember_session_bytes(const ember_model *m, int64_t n_ctx);
/* A session's context: *n_ctx <= 0 becomes the model's default; out of range is an error. */
ember_status ember_session_context_of(const ember_model *m, int64_t *n_ctx, ember_error *err);
/* The evaluation's checks of its tokens (count, context, vocabulary), the message prefixed by who. */
ember_status ember_check_tokens(const struct ember_session *s, const int32_t *ids, int64_t n, const char *who,
                                ember_error *err);
/* The first NaN or +inf logit of n (or 0 when every one is -inf), else -1. */
int64_t ember_logits_first_nonfinite(const float *x, int64_t n);

/* Writes the keys and values of n tokens at positions pos..pos+n-1 into layer l's cache, converted
 * to the cache's type (round to nearest even). Row t of k and v starts at t * row_stride. */
void ember_kv_store(struct ember_session *s, int64_t l, int64_t pos, int64_t n, const float *k, const float *v,
                    int64_t row_stride);
/* The kernels' description of layer L's attention of n tokens from pos0 over the cache it reads
 * (L->kv_source), q (n, n_head*hd) into att: the one place the cache's layout meets the kernels. */
ember_attention_args ember_attention_layer_args(const struct ember_session *s, const ember_layer *L, float scale,
                                                int64_t window, const float *q, float *att, int64_t pos0, int64_t n);
/* Causal attention of n new tokens (positions pos0..pos0+n-1) over the cache layer L reads
 * (L->kv_source), threaded by the compute context. window > 0: a query at p sees keys
 * p-window+1..p only. q: (n, n_head*hd), att: (n, n_head*hd). */
void ember_attention(struct ember_session *s, const ember_layer *L, float scale, int64_t window, const float *q,
                     float *att, int64_t pos0, int64_t n);
/* A layer's attention from w->q over the cache L reads into w->att, with its two hook stages:
 * attention_pattern (only when hooked: the pattern is then computed into w->pattern, shown, and,
 * if the hook wrote it, mixed with the values as the hook left it) and attention_heads (w->att
 * before the output projection). Unhooked, or with a pattern only read, it is ember_attention. */
ember_status ember_attention_stages(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                    const ember_layer *L, float scale, int64_t window, ember_error *err);
/* y[t, i] += b[i] for n rows of width values (b may be NULL). */
void ember_add_bias(float *y, const float *b, int64_t n, int64_t width);
/* The end every family shares, over the residual rows ws.x: the final norm of the family's kind
 * (output_norm, RMSNorm or LayerNorm with bias) of the last row into ws.last (and of rows
 * 0..n-2 into ws.xn when the session asks for all logits) and its trace step, then
 * before_logits, the LM head, the optional final softcap (Gemma 4), after_logits. The earlier
 * rows go through the same head without hooks (the logits stages see the last row only). */
ember_status ember_logits_head(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, ember_error *err);
/* Row r of an embedding table as f32 (the kernels' get_row), its mapped pages then released
 * (embedding.c). */
void ember_embedding_row(const ember_model *m, const ember_matrix *table, int64_t r, float *out);
/* Per-tensor overrides (model_override.c): opens p->override_from, checks it and the names asked
 * against the model's file (same architecture; every name present in both with the same shape; a
 * regex that matches something) and points those entries of m->gguf's tensor table at the other
 * file's tensors. Called before anything is bound; does nothing when p->override_from is NULL. */
ember_status ember_model_override(ember_model *m, const ember_model_params *p, ember_error *err);
/* The file whose mapping holds p: the model's, or the override file's. */
const ember_gguf *ember_model_gguf_holding(const ember_model *m, const void *p);
/* ember_gguf_check_unchanged of every file the model reads. */
ember_status ember_model_check_unchanged(const ember_model *m, ember_error *err);
void ember_model_override_free(ember_model *m);
/* x[i] += d[i] */
void ember_add_into(float *x, const float *d, int64_t count);

ember_status ember_llama_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err);
ember_status ember_gpt2_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err);
ember_status ember_olmo2_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err);
/* The Gemma block (family_gemma4.c): gemma2, gemma3 and gemma4. */
ember_status ember_gemma4_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err);
ember_status ember_qwen3moe_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err);
/* qwen3moe's routing of one row (family_qwen3moe.c, the one rule the forward and the backward
 * follow): the k most probable of E experts under softmax(logits) (descending; a tie goes to the
 * lower index), and their probabilities over their sum (clamped below at 2^-14 as llama.cpp does). */
void ember_moe_route_row(const float *logits, int64_t E, int64_t k, int32_t *ids, float *weights);
/* The slots (t * k + j) of an n x k choice that picked expert e, ascending, into rows; their count
 * (the order both the forward and the backward walk an expert's rows in). */
int64_t ember_moe_expert_slots(const int32_t *ids, int64_t n, int64_t k, int32_t e, int32_t *rows);
/* The RoPE frequency factors of a session of the llama block: LongRoPE's long ones (phi3) when its
 * context is longer than the original one, as llama.cpp picks them; else the file's (rope_freqs, or
 * LongRoPE's short ones). The forward's and the backward's one choice (family_llama.c). */
const float *ember_llama_rope_factors(const ember_session *s);
/* The llama block's attention of layer l (family_llama.c): norm, Q/K/V (biases, QK-norm, RoPE with
 * the session's factors), the cache, attention with its stages, O projection, after_attention, the
 * residual add. Shared by qwen3moe. */
ember_status ember_llama_attention(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                   ember_error *err);
ember_status ember_gptneox_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err);

#endif
