/* ember.h — the engine's public C API: models, sessions, hooks, sampling, errors.
 * Knows nothing of Lua; the bindings and the C tests use only what is declared here. */
#ifndef EMBER_H
#define EMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The kernels' public types (weight types, errors) and kernel-set choice: the one layer below. */
#include "cpu.h"
#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EMBER_VERSION "0.1.0"

/* ---- errors ----------------------------------------------------------------------------------
 * ember_status, ember_error (a status plus a message in a caller-owned slot) and ember_error_set
 * are defined at the bottom of ember, in the kernels' types.h, so every layer reports failures the
 * same way. */

/* ---- kernels ---------------------------------------------------------------------------------
 * The kernel sets, CPU features, ember_kernels_best() and the EMBER_KERNELS parser: see cpu.h. */

/* ---- models ---------------------------------------------------------------------------------- */

typedef struct ember_model ember_model;
typedef struct ember_session ember_session;
typedef struct ember_gguf ember_gguf;

/* The element type of the KV cache (llama.cpp's -ctk/-ctv). f32 is the default and exact; f16 and
 * bf16 halve the cache's memory and the bytes a long-context decode step reads, at the cost of
 * rounding every cached key and value (round to nearest even). */
typedef enum { EMBER_KV_F32 = 0, EMBER_KV_F16, EMBER_KV_BF16 } ember_kv_type;
const char *ember_kv_type_name(ember_kv_type t); /* "f32" | "f16" | "bf16" */
/* Parses "f32" | "f16" | "bf16"; returns false for anything else. */
bool ember_kv_type_parse(const char *s, ember_kv_type *out);

typedef struct {
    const char *path;       /* GGUF file, required */
    const char *arch;       /* optional: refuse the file if its family differs */
    ember_kernels kernels;  /* EMBER_KERNELS_AUTO by default */
    int n_threads;          /* <= 0: the physical cores (ember_cpu_physical_cores) */
    bool allow_nonfinite;   /* sessions of this model keep going on NaN/Inf logits instead of failing
                              (their default; see ember_session_set_allow_nonfinite) */
    ember_kv_type kv_cache; /* the KV cache of every session of this model; EMBER_KV_F32 by default */
    /* Per-tensor overrides (src/engine/model_override.c): the tensors named come from the file
     * override_from instead (same architecture, same name and shape, any weight type), so the model
     * computes what a file holding those tensors in override_from's types would. Named by a
     * NULL-terminated list (override_tensors) or by a POSIX extended regular expression matched
     * against whole tensor names (override_regex); one of them when override_from is set. */
    const char *override_from;
    const char *const *override_tensors;
    const char *override_regex;
} ember_model_params;

/* The model families ember runs, one row each of the engine's family table (src/engine/families.c):
 * the one list of them. Messages, the bindings (core.FAMILIES) and the docs read it from here. */
typedef struct {
    const char *name;                 /* "llama": what ember_model_info.family reports */
    const char *const *architectures; /* the general.architecture values it reads, NULL-terminated */
    bool experimental;                /* not yet checked against llama.cpp on real weights */
} ember_family_info;
/* The number of families, and family i (0 .. count-1; NULL outside), in the table's order. */
int ember_family_count(void);
const ember_family_info *ember_family_get(int i);
/* Every architecture the families accept, in table order, as "a, b, c" into buf (cut at cap). */
void ember_family_architectures(char *buf, size_t cap);

typedef struct {
    const char *family;       /* the family's name (ember_family_info.name) */
    const char *architecture; /* general.architecture as written in the file */
    const char *name;         /* general.name, or NULL */
    int64_t n_layers, hidden_size, n_vocab, n_heads, n_kv_heads, head_dim, context_length;
    const char *dtype_summary; /* e.g. "q8_0 (norms f32)" */
    const char *kernels;       /* kernel set actually used */
    int n_threads;
    bool threads_default; /* n_threads is the default (the physical cores), not asked for */
    bool experimental;
    size_t repacked_bytes;               /* weights copied into the kernel set's layout at load (0: all read
                                  in place from the file mapping) */
    const char *kv_cache;                /* the sessions' KV cache type: "f32", "f16" or "bf16" */
    const char *final_norm;              /* the final norm's kind: "rms" (RMSNorm) or "layer" (LayerNorm with bias) */
    float norm_eps;                      /* the epsilon of the model's norms, as read from the file */
    const char *override_from;           /* the file the overridden tensors come from, or NULL */
    const char *const *override_tensors; /* their names (n_override), in the file's tensor order */
    int64_t n_override;
} ember_model_info;

ember_status ember_model_load(const ember_model_params *params, ember_model **out, ember_error *err);
void ember_model_free(ember_model *model);
const ember_model_info *ember_model_get_info(const ember_model *model);
/* The model's GGUF file (for the embedded tokenizer and provenance); owned by the model. */
const ember_gguf *ember_model_gguf(const ember_model *model);
/* Bytes of weights one decode step reads (as stored in the file): every tensor except the tables
 * that are only gathered a row at a time (the token embedding when a separate output head exists,
 * gemma4's per-layer token embedding, gpt2's position embedding). Divides a read bandwidth into a
 * decode ceiling. */
uint64_t ember_model_weight_bytes_per_token(const ember_model *model);

/* The logit lens (src/engine/unembed.c): x (rows, hidden_size), residual-stream rows before the
 * final norm -> out (rows, n_vocab) = the family's final norm, the LM head and its post-processing
 * (Gemma 4: final logit softcap), on the model's kernels. Calls no hook; allocates one normed copy
 * of x for the call. The last layer's residual gives the forward pass's logits bit for bit. */
ember_status ember_model_unembed(const ember_model *model, const float *x, int64_t rows, float *out, ember_error *err);
/* A stored tensor by GGUF name, with or without ".weight" (src/engine/weights.c): its shape as
 * n_out rows of n_in values (a vector is one row), and its values dequantized to f32 into out
 * (n_out * n_in floats). Nothing is kept. An unknown name is EMBER_ERR_ARG naming it and the file. */
ember_status ember_model_weight_shape(const ember_model *model, const char *name, int64_t *n_out, int64_t *n_in,
                                      ember_error *err);
ember_status ember_model_weight_f32(const ember_model *model, const char *name, float *out, ember_error *err);
/* Rows rows[0..n-1] (0-based) of the stored tensor `name`, dequantized into out (n * n_in floats):
 * a few rows of a large table (the LM head's rows of some tokens). A row out of range is
 * EMBER_ERR_ARG naming it; nothing is written then. */
ember_status ember_model_weight_rows_f32(const ember_model *model, const char *name, const int64_t *rows, int64_t n,
                                         float *out, ember_error *err);
/* The tensors stored in the model's file, in the file's order (src/engine/weights.c): the name, the
 * GGUF type's name ("q8_0", "f32", ...) and the dims, ne[0] the fastest (a row's width). */
typedef struct {
    const char *name; /* owned by the model */
    const char *type;
    int n_dims;     /* 1 .. 4 */
    int64_t ne[4];  /* unused dims are 1 */
    uint64_t bytes; /* stored size */
} ember_tensor_desc;
int64_t ember_model_tensor_count(const ember_model *model);
/* Fills *out with tensor i (0 .. count-1) and returns true; false outside the range. */
bool ember_model_tensor_desc(const ember_model *model, int64_t i, ember_tensor_desc *out);
/* True when both models hold a tensor called `name` of the same type, shape and bytes (as bound:
 * an overridden tensor is its source's). */
bool ember_model_tensor_same(const ember_model *a, const ember_model *b, const char *name);
/* Components of the residual stream through the final norm with the scale of a reference frozen
 * (src/engine/unembed.c): x (rows, hidden_size) -> out (rows, hidden_size), row r normalised as
 * its reference row ref[r] (ref_rows == rows) or ref[0] (ref_rows == 1) is, times the norm's weight
 * and without its bias: RMSNorm x / rms(ref), LayerNorm (x - mean(x)) / std(ref). Components that
 * sum to ref give rows that sum to norm(ref) minus the bias (the norm is linear once its scale is
 * fixed), what a direct logit attribution takes apart. */
ember_status ember_model_final_norm_frozen(const ember_model *model, const float *x, int64_t rows, const float *ref,
                                           int64_t ref_rows, float *out, ember_error *err);

/* ---- hooks ----------------------------------------------------------------------------------- */

/* The tensor points of one evaluation, in execution order: the per-layer stages, then the
 * logits stages. Each is one row of the stage table (src/engine/stages.c, ember_stage_get), which
 * says what its view holds; docs/hooks.md gives the shapes. sae_features is called only where an
 * SAE is spliced in (ember_sae_sites), right after the stage it reads. */
typedef enum {
    EMBER_STAGE_BEFORE_LAYER = 0,
    EMBER_STAGE_ATTENTION_PATTERN,
    EMBER_STAGE_ATTENTION_HEADS,
    EMBER_STAGE_AFTER_ATTENTION,
    EMBER_STAGE_MOE_ROUTER, /* mixture-of-experts layers only (the row's families) */
    EMBER_STAGE_MLP_ACTIVATION,
    EMBER_STAGE_AFTER_MLP,
    EMBER_STAGE_AFTER_LAYER,
    EMBER_STAGE_SAE_FEATURES,
    EMBER_STAGE_BEFORE_LOGITS,
    EMBER_STAGE_AFTER_LOGITS,
    EMBER_STAGE_COUNT
} ember_stage;

/* A stage view's rows: the evaluation's tokens, the last token only, or one block of the tokens
 * per attention head (head h's rows are h*tokens .. h*tokens + tokens-1). */
typedef enum { EMBER_ROWS_TOKENS = 0, EMBER_ROWS_LAST, EMBER_ROWS_HEADS_X_TOKENS } ember_stage_rows;
/* A stage view's columns: the hidden size, the layer's MLP width, the layer's heads x head size,
 * the vocabulary, the keys so far (sequence_length), the spliced SAE's features (d_sae), or the
 * layer's experts (an MoE router's logits). */
typedef enum {
    EMBER_WIDTH_HIDDEN = 0,
    EMBER_WIDTH_N_FF,
    EMBER_WIDTH_HEADS_X_HEAD_DIM,
    EMBER_WIDTH_VOCAB,
    EMBER_WIDTH_PATTERN,
    EMBER_WIDTH_D_SAE,
    EMBER_WIDTH_N_EXPERTS
} ember_stage_width;
/* How a per-head view splits into heads (ember_view.n_heads blocks): not at all, by rows, by columns. */
typedef enum { EMBER_HEADS_NONE = 0, EMBER_HEADS_ROWS, EMBER_HEADS_COLUMNS } ember_stage_heads;

/* One row of the stage table: the one place a stage's facts live. */
typedef struct {
    const char *name;  /* the hook name: "before_layer", ... */
    int order;         /* its place in an evaluation: a stage of a higher order is called later
                          (within a layer for the layer stages, which all come before the others) */
    bool in_layer;     /* called once per layer, with ctx.layer_index >= 0 */
    bool inside_block; /* inside a layer's attention or MLP block: not the residual stream, so
                          selections that mean "the residual stream" (capture's and
                          activation-stats' defaults) leave it out unless it is named */
    ember_stage_rows rows;
    ember_stage_width width;
    ember_stage_heads heads;
    const char *const *families; /* the families that have the stage, NULL-terminated; NULL: all */
    bool sae_only;               /* called only where an SAE is spliced in, right after the stage it reads (with
                      that stage's layer index: -1 at before_logits) */
    /* TransformerLens's names for the stage (HookedTransformer's cache keys, utils.get_act_name), read
     * by ember.act_name and the experiment checks; all NULL for a stage it has no hook for. */
    const char *tl_hook;           /* the hook: "hook_resid_post" (after "blocks.L." when in_layer) */
    const char *tl_short;          /* get_act_name's short name: "resid_post" */
    const char *const *tl_aliases; /* the other short names get_act_name takes, NULL-terminated; NULL: none */
} ember_stage_info;

/* The row of stage s, NULL outside 0..EMBER_STAGE_COUNT-1. */
const ember_stage_info *ember_stage_get(ember_stage s);
/* The stage's hook name ("before_layer", ...), NULL outside 0..EMBER_STAGE_COUNT-1. The one list
 * of stage names: the bindings and lib/ember read it from here. */
const char *ember_stage_name(ember_stage s);
/* EMBER_STAGE_COUNT, for callers that iterate the stages without the enum (e.g. across a build). */
int ember_stage_count(void);
/* ember_stage_get(s)->inside_block (false outside the table). */
bool ember_stage_inside_block(ember_stage s);
/* ember_stage_get(s)->sae_only: the stages that exist only where an SAE is spliced in
 * (sae_features): no forward pass reaches them by itself, and selections of "every stage" leave
 * them out unless named. */
bool ember_stage_sae(ember_stage s);
/* The spellings core.STAGES uses: "tokens" | "last" | "heads*tokens"; "hidden" | "n_ff" |
 * "heads*head_dim" | "vocab" | "pattern" | "d_sae" | "n_experts"; "none" | "rows" | "columns". */
const char *ember_stage_rows_name(ember_stage_rows r);
const char *ember_stage_width_name(ember_stage_width w);
const char *ember_stage_heads_name(ember_stage_heads h);

typedef enum { EMBER_PHASE_PREFILL = 0, EMBER_PHASE_DECODE } ember_phase;

/* A borrowed, contiguous, row-major f32 activation [rows, cols] owned by the session. */
typedef struct {
    float *data; /* (rows, cols) */
    int64_t rows, cols;
    /* Attention heads the view holds, 0 when the stage is not per head: attention_pattern's rows
     * split into n_heads blocks of rows/n_heads (one per head), attention_heads' columns into
     * n_heads blocks of cols/n_heads. */
    int64_t n_heads;
    /* A hook that writes the view sets this (the Lua bindings do on every write, sub-views
     * included). The engine reads it after attention_pattern: an unwritten pattern leaves the
     * layer's attention to the fused kernel (bit for bit what a run without the hook computes),
     * a written one is mixed with V as it stands. The other stages work in place and ignore it. */
    bool written;
} ember_view;

/* One sequence of an evaluation: its index in the batch (0 for a session's own evaluation), its
 * rows first_row .. first_row + length - 1 of the views, the position of its first new token. */
typedef struct {
    int64_t index, first_row, length, start_position;
} ember_sequence;

/* Where an evaluation is; layer_index is -1 for the logits stages. */
typedef struct {
    ember_phase phase;
    int64_t start_position; /* absolute position of the first input token */
    int64_t input_token_count;
    int64_t sequence_length; /* start_position + input_token_count */
    int64_t layer_index;
    /* Whether the session is tracing this evaluation (ember_session_set_trace). Read-only to
     * hooks: a hook can neither start, stop nor write the trace stream. */
    bool tracing;
    /* sae_features: which SAE of the pass's ember_sae_sites (1-based); 0 at every other stage. */
    int sae_site;
    /* A mixture-of-experts layer's routing, at its mlp_activation and after_mlp (0 / NULL at every
     * other stage and in dense layers): row t's n_experts_used chosen experts (expert_ids, in
     * descending router probability) and their weights (expert_weights, summing to 1), each
     * (input_token_count, n_experts_used) row-major. */
    int64_t n_experts_used;
    const int32_t *expert_ids;
    const float *expert_weights;
    /* The sequences whose rows the views hold, in row order (one for a session's own evaluation;
     * a batch's, ember_batch_eval). The logits stages have one row per sequence. In a batch,
     * start_position and sequence_length are the first sequence's. */
    const ember_sequence *sequences;
    int64_t n_sequences;
} ember_eval_ctx;

typedef struct ember_sae_sites ember_sae_sites;

/* Return EMBER_OK to continue; anything else aborts the evaluation (fill err). */
typedef ember_status (*ember_tensor_hook)(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *view,
                                          ember_error *err);

/* A NULL table (or a NULL entry) is the disabled path for that stage: nothing is called. */
typedef struct {
    void *user;
    ember_tensor_hook on_tensor[EMBER_STAGE_COUNT];
    /* SAEs spliced into the pass (ember_sae_sites_new), or NULL. At a stage an SAE reads, the
     * stage's own hook runs first, then the SAE encodes the view, on_tensor[sae_features] sees
     * the features, and the SAE writes back where it writes (ember_sae_site). */
    ember_sae_sites *saes;
} ember_hooks;

/* ---- sessions -------------------------------------------------------------------------------- */

/* n_ctx <= 0: the model's context length (capped at 4096). */
ember_status ember_session_new(ember_model *model, int64_t n_ctx, ember_session **out, ember_error *err);
void ember_session_free(ember_session *s);
/* Evaluates ids at positions position..position+n-1; logits of the last one become current. */
ember_status ember_session_prefill(ember_session *s, const int32_t *ids, int64_t n, const ember_hooks *hooks,
                                   ember_error *err);
ember_status ember_session_decode(ember_session *s, int32_t id, const ember_hooks *hooks, ember_error *err);
const float *ember_session_logits(const ember_session *s); /* (n_vocab) */
/* While on, each evaluation also keeps the logits of every row it evaluated (the final norm and
 * the LM head run on all rows; the logits hooks still see only the last row, and the last row
 * is bit for bit ember_session_logits). Off by default: one row's head is the cheap path. */
void ember_session_set_all_logits(ember_session *s, bool on);
/* (n_rows, n_vocab) of the last evaluation made while on, else NULL with *n_rows = 0. */
const float *ember_session_all_logits(const ember_session *s, int64_t *n_rows);
int64_t ember_session_position(const ember_session *s);
int64_t ember_session_context(const ember_session *s);
void ember_session_reset(ember_session *s);
/* Moves the position back to 0 <= position <= the current one, keeping the KV cache of positions
 * 0..position-1: evaluating from there is bit for bit the run that evaluated those positions and
 * then these. The logits are void until the next evaluation. */
ember_status ember_session_rewind(ember_session *s, int64_t position, ember_error *err);
const ember_model *ember_session_model(const ember_session *s);
/* Every evaluation checks its logits once: a NaN or +inf (or every logit at -inf; a single -inf is
 * a banned token) fails it with EMBER_ERR_NONFINITE
 * naming the first stage and layer where a non-finite value appeared (found by a second pass that
 * runs only then). allow = true skips the check, for research runs that want the NaNs. */
void ember_session_set_allow_nonfinite(ember_session *s, bool allow);

/* ---- batches (src/engine/batch.c; docs/hooks.md "Batches") -------------------------------------
 * n_seq sessions of one model evaluated together: one evaluation packs the new rows of every
 * sequence into one set of products, each sequence with its own positions, KV cache, causal mask
 * and sliding window, no padding. A sequence's logits and activations are bit for bit what its
 * session computes alone (tests/test_batch.c). */
typedef struct ember_batch ember_batch;

/* Bytes a batch of n_seq sequences of n_ctx positions holds at its peak over an evaluation of
 * `rows` new tokens in all: n_seq x (KV cache + attention scratch of one session) + the workspace
 * of `rows` rows + one logits row per sequence (ember_batch_new refuses what does not fit). */
uint64_t ember_batch_bytes(const ember_model *m, int64_t n_seq, int64_t n_ctx, int64_t rows);
/* n_seq sessions of n_ctx positions each (n_ctx <= 0: as ember_session_new). Refused before any
 * allocation when n_seq sessions' KV caches do not fit the memory available, naming the bytes. */
ember_status ember_batch_new(ember_model *m, int64_t n_seq, int64_t n_ctx, ember_batch **out, ember_error *err);
void ember_batch_free(ember_batch *b);
int64_t ember_batch_size(const ember_batch *b);
/* Session i of the batch (owned by it): its position, logits and all-logits are read as any
 * session's, and it may be evaluated alone too. */
ember_session *ember_batch_session(ember_batch *b, int64_t i);

/* One sequence of a batched evaluation: session `index` of the batch, n new token ids. */
typedef struct {
    int64_t index;
    const int32_t *ids;
    int64_t n;
} ember_batch_item;

/* Evaluates the items (distinct sessions, each at least one token, within its context) in one pass:
 * the hooks' views hold every item's rows in item order (ctx->sequences); each session's logits
 * become its last row's. Refused: a session with a tape (gradients are single-sequence), a traced
 * session, an attention_pattern hook (its rows differ in width per sequence). On an error no
 * session's position moves. Messages number the sequences from 1 (index 0 is "sequence 1"). */
ember_status ember_batch_eval(ember_batch *b, ember_phase phase, const ember_batch_item *items, int64_t n_items,
                              const ember_hooks *hooks, ember_error *err);

/* ---- gradients (src/engine/gradients.c; docs/attribution.md) ----------------------------------
 * The gradient of a scalar metric of the last position's logits with respect to the activations of
 * one evaluation of a prompt: a forward pass that keeps what the backward needs (bit for bit the
 * forward a prefill computes), then the backward through the LM head, the final norm, every layer
 * and the embeddings, with the model's weights in their own types (the transposed products,
 * kernels.h). No weight gradients. The metric is on the logits after the family's post-processing
 * (Gemma 4's softcap). */
typedef enum {
    EMBER_METRIC_LOGIT = 0,  /* logit of a */
    EMBER_METRIC_LOGIT_DIFF, /* logit of a - logit of b */
    EMBER_METRIC_LOGPROB,    /* log softmax of a */
    EMBER_METRIC_PROB,       /* softmax of a */
    EMBER_METRIC_KL,         /* KL(reference || softmax(logits)) */
} ember_metric_kind;

typedef struct {
    ember_metric_kind kind;
    int32_t a, b;           /* the tokens it reads (b: logit-diff only) */
    const float *reference; /* KL: the reference distribution, n_vocab probabilities summing to 1 */
} ember_metric;

typedef struct {
    ember_metric metric;
    /* The gradients to keep: at these stages (any but sae_features), of the embedding rows (the
     * token embeddings as looked up, before any scaling or position), and with `values` the
     * forward's own value at the same stages too (what a read-only hook would have seen). */
    bool stages[EMBER_STAGE_COUNT];
    bool embeddings;
    bool values;
    /* Frozen modes (docs/attribution.md): the attention probabilities, or every norm's scale
     * (1 / rms, 1 / std), held at their forward values, so no gradient flows through them. */
    bool freeze_attention, freeze_norm;
} ember_grad_request;

typedef struct ember_gradients ember_gradients;

/* Resets s and evaluates ids (n tokens, from position 0) with a backward pass: *out holds the
 * gradients asked for (ember_gradients_free). s keeps the prompt's cache and logits afterwards, as
 * a prefill leaves them. Errors: a metric token outside the vocabulary, an unknown metric, a stage
 * without gradients (sae_features), a family without a backward pass, memory. */
ember_status ember_session_gradients(ember_session *s, const int32_t *ids, int64_t n, const ember_grad_request *req,
                                     ember_gradients **out, ember_error *err);
void ember_gradients_free(ember_gradients *g);
/* The metric's value at the evaluated prompt. */
double ember_gradients_metric(const ember_gradients *g);
/* The gradient kept at (stage, layer) (layer -1 for before_logits and after_logits), rows x cols
 * row-major with the stage's view shape (docs/hooks.md); NULL when not kept. */
const float *ember_gradients_get(const ember_gradients *g, ember_stage stage, int64_t layer, int64_t *rows,
                                 int64_t *cols);
/* The forward's value at (stage, layer), when the request asked for values; else NULL. */
const float *ember_gradients_value(const ember_gradients *g, ember_stage stage, int64_t layer, int64_t *rows,
                                   int64_t *cols);
/* The embedding rows' gradient (n, hidden_size), NULL when not asked for. */
const float *ember_gradients_embeddings(const ember_gradients *g, int64_t *rows, int64_t *cols);

/* ---- tracing (src/engine/trace.c; docs/inspection.md) ------------------------------------------
 * A trace writes one JSON line per executed step of every evaluation of the sessions it is set on:
 * eval_start, one "op" line per op of the forward pass (layer, op name, phase, output shape, the
 * kernel variant that computed it, the value fingerprint of its output), eval_end (with the
 * evaluation's time). Field order is fixed. The normalized fingerprint is FNV-1a 64 over every
 * line with its timing fields left out: identical for identical runs, different when any traced
 * value, shape, kernel variant or op differs. Off (NULL) the forward pass pays one pointer test per
 * op. */
typedef struct ember_trace ember_trace;
/* out stays the caller's (not closed by ember_trace_free). */
ember_status ember_trace_new(FILE *out, ember_trace **t, ember_error *err);
void ember_trace_free(ember_trace *t);
uint64_t ember_trace_fingerprint(const ember_trace *t);
int64_t ember_trace_event_count(const ember_trace *t);
int64_t ember_trace_eval_count(const ember_trace *t);
/* Restricts t to the op lines of some layers and ops; the eval lines are always written. layers:
 * mask[l] for layers 0..n_mask-1 (NULL: every layer; a layer beyond the mask is not traced); the
 * model-level ops (layer -1: embed, output, ...) are not layer-filtered. ops: n_ops op names (NULL:
 * every op). An op left out is neither written nor fingerprinted (it costs one test). */
ember_status ember_trace_set_filter(ember_trace *t, const bool *layer_mask, int64_t n_mask, const char *const *ops,
                                    int n_ops, ember_error *err);
/* EMBER_ERR_IO when a write to the stream failed since the trace began. */
ember_status ember_trace_status(const ember_trace *t, ember_error *err);
/* Traces every later evaluation of s into t (NULL: stop). t must outlive its use by s. */
void ember_session_set_trace(ember_session *s, ember_trace *t);

/* ---- sparse autoencoders and transcoders (src/engine/sae.c; docs/sae.md) ----------------------
 * An SAE's weights in the engine's layout, and its encode and decode as threaded products on a
 * compute context (the model's, or the SAE's own). For each input row x (d_in values):
 *   x_in = (x - sub) * mul              the normalisation of the row (sub, mul below), then
 *   x_in -= b_dec                       when apply_b_dec_to_input (never for a transcoder)
 *   pre  = x_in W_enc + b_enc           a product in the SAE's dtype (f32 activations, f32 sums)
 *   f    = act(pre)                     standard: relu; jumprelu: pre > threshold ? relu(pre) : 0;
 *                                       topk: relu of the k largest, lowest index first on ties,
 *                                       0 elsewhere; gated: (pre_gate > 0) * relu(h e^r_mag + b_mag)
 *                                       with h = x_in W_enc, pre_gate = h + b_gate
 *   out  = ((f * scaling) W_dec + b_dec) * dmul + dadd     the decode (d_out values)
 * Normalisations: none (sub 0, mul 1, dmul 1, dadd 0); scale (expected_average_only_in: mul =
 * scale_in, dmul = 1 / scale_out); constant_norm_rescale (mul = sqrt(d_in) / |x|, dmul = 1 / mul;
 * a zero row keeps mul = 1); layer_norm (sub = mean(x), mul = 1 / (std + 1e-5) with the unbiased
 * std of x - sub, dmul = std, dadd = mean). A transcoder (d_out may differ from d_in) never
 * subtracts b_dec and denormalises only when denormalize_output says so. The rows are
 * independent and each element is computed by the same code whatever the thread count, so the
 * results are identical for every thread count. */
typedef struct ember_sae ember_sae;

typedef enum { EMBER_SAE_STANDARD = 0, EMBER_SAE_JUMPRELU, EMBER_SAE_TOPK, EMBER_SAE_GATED } ember_sae_arch;
typedef enum {
    EMBER_SAE_NORM_NONE = 0,
    EMBER_SAE_NORM_SCALE,                 /* expected_average_only_in: fixed factors */
    EMBER_SAE_NORM_CONSTANT_NORM_RESCALE, /* every row to norm sqrt(d_in) */
    EMBER_SAE_NORM_LAYER_NORM             /* every row to mean 0, std 1 */
} ember_sae_norm;

/* One tensor of an SAE file as it lies in memory: rows x cols values of `type` (F32, F16 or BF16),
 * row-major, little-endian, any alignment. data NULL: absent. A vector is one row. */
typedef struct {
    ember_type type;
    const void *data;
    int64_t rows, cols;
} ember_sae_tensor;

typedef struct {
    int64_t d_in, d_sae, d_out; /* d_out = d_in for an SAE */
    ember_type dtype;           /* the weights' type in the products: F32, F16 or BF16 */
    ember_sae_arch arch;
    int64_t k; /* topk: features kept per row, 1..d_sae */
    bool apply_b_dec_to_input;
    bool denormalize_output; /* decode undoes the input's normalisation (an SAE: true) */
    ember_sae_norm norm;
    double scale_in, scale_out; /* EMBER_SAE_NORM_SCALE */
    /* The encoder as (d_in, d_sae) (SAELens W_enc), or as (d_sae, d_in) when enc_by_feature
     * (a PyTorch Linear weight, Llama Scope's encoder.weight). */
    ember_sae_tensor w_enc;
    bool enc_by_feature;
    /* The decoder as (d_sae, d_out) (SAELens W_dec), or as (d_out, d_sae) when dec_by_output. */
    ember_sae_tensor w_dec;
    bool dec_by_output;
    ember_sae_tensor b_enc, b_dec; /* (d_sae), (d_out); b_enc absent for gated (else 0 when absent) */
    ember_sae_tensor threshold;    /* jumprelu: (d_sae), or absent and threshold_all for every feature */
    double threshold_all;
    ember_sae_tensor b_gate, b_mag, r_mag; /* gated, (d_sae) each */
    ember_sae_tensor scaling;              /* optional (d_sae): features scaled before decoding */
    /* The compute context when no model is given: kernel set and threads (<= 0: physical cores). */
    ember_kernels kernels;
    int n_threads;
} ember_sae_params;

/* Builds the SAE: the weights converted to dtype in the engine's layout (copied: p's buffers may
 * be freed afterwards). model non-NULL: the products run on the model's compute context and the
 * model must outlive the SAE; NULL: the SAE starts its own (p->kernels, p->n_threads). Errors name
 * the parameter or tensor (shape, type, a value out of range). */
ember_status ember_sae_new(const ember_model *model, const ember_sae_params *p, ember_sae **out, ember_error *err);
void ember_sae_free(ember_sae *sae);
/* The kernel set the SAE's products run on ("reference", "avx2", "avx512"). */
const char *ember_sae_kernels(const ember_sae *sae);
/* f (rows, d_sae) = the features of x (rows, d_in). The SAE's scratch grows to the largest rows it
 * has seen (one call at a time per SAE). */
ember_status ember_sae_encode(ember_sae *sae, const float *x, int64_t rows, float *f, ember_error *err);
/* out (rows, d_out) = the decode of f (rows, d_sae). x (rows, d_in): the inputs f came from, needed
 * by the normalisations that depend on the row (constant_norm_rescale, layer_norm; NULL there is
 * EMBER_ERR_ARG naming the normalisation); ignored by the others. */
ember_status ember_sae_decode(ember_sae *sae, const float *f, const float *x, int64_t rows, float *out,
                              ember_error *err);
/* Feature i's decoder direction (d_out values, its W_dec row as f32, scaling applied). */
ember_status ember_sae_direction(const ember_sae *sae, int64_t feature, float *out, ember_error *err);
int64_t ember_sae_d_in(const ember_sae *sae);
int64_t ember_sae_d_sae(const ember_sae *sae);
int64_t ember_sae_d_out(const ember_sae *sae);

/* Splicing SAEs into forward passes. A site reads the view of (stage, layer), columns col0 ..
 * col0 + d_in - 1 (a head's slice of attention_heads; else 0 and the whole width), encodes it,
 * shows the features at sae_features, and writes at (stage_out, layer_out) (the same stage for an
 * SAE; a transcoder's output stage, later in the pass) the columns col0_out .. + d_out - 1:
 *   EMBER_SAE_SPLICE_ERROR           x + (decode(f_edited) - decode(f_clean)): the error term is
 *                                    kept, so where nothing edited the features (sae_features
 *                                    unhooked or not written, or a row written back unchanged)
 *                                    not a bit of the pass changes. The difference is computed as
 *                                    the decoder's linear part on f_edited - f_clean (the decode
 *                                    is affine in f), on the rows where they differ.
 *   EMBER_SAE_SPLICE_RECONSTRUCTION  decode(f) in place of x (what the SAE loses shows downstream).
 * A site's buffers grow to the largest evaluation it has seen, then are reused. */
typedef enum { EMBER_SAE_SPLICE_ERROR = 0, EMBER_SAE_SPLICE_RECONSTRUCTION } ember_sae_splice;
typedef struct {
    ember_sae *sae; /* not owned; must outlive the sites */
    ember_stage stage;
    int64_t layer; /* -1 for before_logits */
    int64_t col0;
    bool sliced; /* the SAE reads a slice from col0 (else the view is exactly d_in wide) */
    ember_stage stage_out;
    int64_t layer_out;
    int64_t col0_out;
    bool sliced_out; /* likewise for the d_out columns it writes */
    ember_sae_splice splice;
} ember_sae_site;

/* n sites (checked: stages an SAE can read and write, the output not before the input). */
ember_status ember_sae_sites_new(const ember_sae_site *sites, int n, ember_sae_sites **out, ember_error *err);
void ember_sae_sites_free(ember_sae_sites *s);
int ember_sae_sites_count(const ember_sae_sites *s);
/* Counters since the sites were made, per site i: evaluations it spliced, and rows it changed
 * (written with a nonzero difference, or replaced by the reconstruction). */
int64_t ember_sae_sites_calls(const ember_sae_sites *s, int i);
int64_t ember_sae_sites_changed_rows(const ember_sae_sites *s, int i);

/* ---- sampling -------------------------------------------------------------------------------- */

typedef struct {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    uint64_t seed;
} ember_sampler_params;

typedef struct ember_sampler ember_sampler;

ember_status ember_sampler_new(const ember_sampler_params *p, int64_t n_vocab, ember_sampler **out, ember_error *err);
void ember_sampler_free(ember_sampler *s);
/* Returns the chosen id; greedy ties go to the lowest id. */
int32_t ember_sampler_sample(ember_sampler *s, const float *logits);
/* Greedy argmax over n values, lowest index on ties. */
int64_t ember_argmax(const float *x, int64_t n);

/* ---- provenance ------------------------------------------------------------------------------ */

/* SHA-256 (mbedTLS) as 64 lowercase hex chars + NUL. */
void ember_sha256_hex(const void *data, size_t len, char out[65]);
ember_status ember_sha256_file_hex(const char *path, char out[65], ember_error *err);
/* A SHA-256 digest's 32 bytes as 64 lowercase hex chars + NUL: the one spelling of every digest. */
void ember_sha256_digest_hex(const unsigned char digest[32], char out[65]);

/* The model file's digest for provenance (model_digest.c). A cache directory holds one entry per
 * file, keyed by device, inode, size and modification time in nanoseconds: an entry is used only
 * when every key field matches the file as opened, and a corrupt entry is a miss, never an error.
 * A miss is hashed on a background thread at the lowest CPU priority, so it takes only time the
 * evaluation leaves idle; ember_digest_wait hashes whatever is left at the caller's priority. */
typedef enum { EMBER_DIGEST_FRESH = 0, EMBER_DIGEST_CACHED } ember_digest_source;
typedef struct ember_digest ember_digest;

const char *ember_digest_source_name(ember_digest_source s); /* "fresh" | "cached" */
/* The default cache directory: $XDG_CACHE_HOME/ember (absolute only), else $HOME/.cache/ember.
 * False when neither gives one (then nothing is cached). */
bool ember_digest_cache_dir(char *buf, size_t n);
/* Opens path and starts its digest. cache_dir NULL: the default. fresh: never read the cache (the
 * new digest is still written to it). Returns without waiting for the hash. */
ember_status ember_digest_start(const char *path, const char *cache_dir, bool fresh, ember_digest **out,
                                ember_error *err);
/* The digest (64 hex + NUL) and where it came from; blocks until hashed. Repeatable. Fails when
 * the file could not be read or changed (size or modification time) while it was being hashed. */
ember_status ember_digest_wait(ember_digest *d, char hex[65], ember_digest_source *source, ember_error *err);
/* Stops the background thread (between chunks) and frees; NULL is ignored. */
void ember_digest_free(ember_digest *d);

#ifdef __cplusplus
}
#endif
#endif
