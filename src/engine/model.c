/* model.c — turns a validated GGUF file into a model: family, hyper-parameters, bound tensors.
 * Must not compute anything; every missing or misshapen tensor is an error that names it. */
#include "model_bind.h"
#include "escape.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ember_status bind_fail(binder *b, ember_status code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ember_error_set(b->err, code, "%s: %s", b->m->gguf->path, msg);
}

/* "<arch>.<suffix>" as an integer; `required` makes absence an error. */
ember_status hp_int(binder *b, const char *suffix, int64_t *out, bool required, int64_t def) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", b->arch, suffix);
    const gguf_kv *kv = ember_gguf_find(b->m->gguf, key);
    if (!kv) {
        if (required) return bind_fail(b, EMBER_ERR_FORMAT, "missing metadata key '%s'", key);
        *out = def;
        return EMBER_OK;
    }
    if (!ember_gguf_get_int(b->m->gguf, key, out))
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s' is not an integer", key);
    if (*out < 0 || *out > ((int64_t)1 << 32))
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s' has an absurd value %lld", key, (long long)*out);
    return EMBER_OK;
}

/* A dimension (width, head count, head size): bounded by the largest extent of any tensor in the
 * file, so nothing sized from it can exceed what the file's tensors back. */
ember_status hp_dim(binder *b, const char *suffix, int64_t *out, bool required, int64_t def) {
    TRY(hp_int(b, suffix, out, required, def));
    if (*out > b->m->gguf->max_extent)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "metadata key '%s.%s' = %lld is larger than any tensor dimension in the file (%lld)", b->arch,
                         suffix, (long long)*out, (long long)b->m->gguf->max_extent);
    return EMBER_OK;
}

ember_status hp_block_count(binder *b, int64_t *out) {
    TRY(hp_int(b, "block_count", out, true, 0));
    if (*out > b->m->gguf->n_blocks)
        return bind_fail(
            b, EMBER_ERR_FORMAT,
            "metadata key '%s.block_count' = %lld, but the file has tensors for %lld layers (blk.0 .. blk.%lld)",
            b->arch, (long long)*out, (long long)b->m->gguf->n_blocks, (long long)b->m->gguf->n_blocks - 1);
    return EMBER_OK;
}

ember_status hp_mul(binder *b, const char *what, int64_t x, int64_t y, int64_t *out) {
    if (!ember_shape_count((const int64_t[]){x, y}, 2, (int64_t)1 << 40, out))
        return bind_fail(b, EMBER_ERR_FORMAT, "%s = %lld x %lld is out of range", what, (long long)x, (long long)y);
    return EMBER_OK;
}

ember_status hp_rope_dims(binder *b, int64_t head_dim, int64_t *n_rot) {
    TRY(hp_dim(b, "rope.dimension_count", n_rot, false, head_dim));
    if (*n_rot > head_dim || *n_rot % 2 || *n_rot < 2)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "%s.rope.dimension_count %lld does not fit head size %lld (it must be an even count from 2 "
                         "to the head size)",
                         b->arch, (long long)*n_rot, (long long)head_dim);
    return EMBER_OK;
}

ember_status hp_head_size(binder *b, int64_t *head_dim) {
    ember_model *m = b->m;
    TRY(hp_dim(b, "attention.key_length", head_dim, false, m->n_embd / m->n_head));
    int64_t v_len;
    TRY(hp_dim(b, "attention.value_length", &v_len, false, *head_dim));
    if (v_len != *head_dim || *head_dim < 2 || *head_dim % 2)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED, "head size %lld (value length %lld) is not supported",
                         (long long)*head_dim, (long long)v_len);
    return EMBER_OK;
}

void bind_layer_geometry(ember_layer *L, int64_t l, int64_t n_ff, int64_t n_head_kv, int64_t head_dim) {
    L->n_ff = n_ff;
    L->n_head_kv = n_head_kv;
    L->head_dim = head_dim;
    L->kv_dim = n_head_kv * head_dim;
    L->kv_source = l;
}

ember_status hp_float_positive(binder *b, const char *suffix, float *out, float def) {
    TRY(hp_float(b, suffix, out, def));
    if (!isfinite(*out) || !(*out > 0.0f))
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s.%s' = %g must be a finite number > 0", b->arch, suffix,
                         (double)*out);
    return EMBER_OK;
}

ember_status hp_float(binder *b, const char *suffix, float *out, float def) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", b->arch, suffix);
    double v;
    if (!ember_gguf_find(b->m->gguf, key)) {
        *out = def;
        return EMBER_OK;
    }
    if (!ember_gguf_get_float(b->m->gguf, key, &v))
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s' is not a number", key);
    *out = (float)v;
    return EMBER_OK;
}

ember_status hp_require(binder *b, const char *suffix) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", b->arch, suffix);
    return ember_gguf_find(b->m->gguf, key) ? EMBER_OK
                                            : bind_fail(b, EMBER_ERR_FORMAT, "missing metadata key '%s'", key);
}

/* llama.cpp's rope.scaling.type defaults to "linear", whose factor (rope.scaling.factor, else the
 * older rope.scale_linear) is 1 when absent; "none" never scales. Other types are refused. */
ember_status hp_rope_scaling(binder *b, float *factor) {
    char key[256];
    snprintf(key, sizeof key, "%s.rope.scaling.type", b->arch);
    *factor = 1.0f;
    const gguf_kv *kv = ember_gguf_find(b->m->gguf, key);
    if (kv && kv->value.type != GGUF_TYPE_STRING)
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s' is not a string", key);
    if (kv && gguf_str_eq(kv->value.v.str, "none")) return EMBER_OK;
    if (kv && !gguf_str_eq(kv->value.v.str, "linear")) {
        char q[128];
        return bind_fail(b, EMBER_ERR_UNSUPPORTED, "metadata key '%s' = '%s': only linear RoPE scaling is supported",
                         key, ember_escape(q, sizeof q, kv->value.v.str.ptr, (size_t)kv->value.v.str.len, 32));
    }
    snprintf(key, sizeof key, "%s.rope.scaling.factor", b->arch);
    const char *suffix = ember_gguf_find(b->m->gguf, key) ? "rope.scaling.factor" : "rope.scale_linear";
    float f;
    TRY(hp_float(b, suffix, &f, 0.0f));
    if (f == 0.0f) return EMBER_OK; /* llama.cpp: a factor of 0 means none */
    if (!isfinite(f) || f < 0.0f)
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s.%s' = %g must be a finite number > 0", b->arch, suffix,
                         (double)f);
    *factor = f;
    return EMBER_OK;
}

/* A 1-D f32 vector of n values; f16/bf16 vectors are converted once into an owned copy. */
ember_status bind_vec(binder *b, const char *name, int64_t n, bool required, const float **out) {
    *out = NULL;
    const gguf_tensor *t = ember_gguf_find_tensor(b->m->gguf, name);
    if (!t) return required ? bind_fail(b, EMBER_ERR_FORMAT, "missing tensor '%s'", name) : EMBER_OK;
    const int64_t count = t->n_elements;
    if (count != n)
        return bind_fail(b, EMBER_ERR_FORMAT, "tensor '%s' has %lld values, expected %lld", name, (long long)count,
                         (long long)n);
    if (t->type == EMBER_TYPE_F32) {
        *out = t->data;
        return EMBER_OK;
    }
    if (ember_type_traits_get(t->type)->block_size != 1) /* a quantized vector: ember keeps norms exact */
        return bind_fail(b, EMBER_ERR_UNSUPPORTED, "tensor '%s' is a vector stored as %s", name,
                         ember_type_name((uint32_t)t->type));
    float *copy;
    TRY(bind_owned(b, n, &copy));
    ember_type_traits_get(t->type)->to_float(t->data, copy, n); /* exact: f16/bf16 to f32 */
    *out = copy;
    return EMBER_OK;
}

ember_status bind_owned(binder *b, int64_t n, float **out) {
    ember_model *m = b->m;
    if (m->n_owned == m->cap_owned) {
        int64_t cap = m->cap_owned ? 2 * m->cap_owned : 16;
        float **p = realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
        m->owned = p;
        m->cap_owned = cap;
    }
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
    m->owned[m->n_owned++] = v;
    *out = v;
    return EMBER_OK;
}

/* A matrix of n_out rows of n_in values (GGUF dims {n_in, n_out}). */
ember_status bind_mat(binder *b, const char *name, int64_t n_in, int64_t n_out, bool required, ember_matrix *out) {
    memset(out, 0, sizeof *out);
    const gguf_tensor *t = ember_gguf_find_tensor(b->m->gguf, name);
    if (!t) return required ? bind_fail(b, EMBER_ERR_FORMAT, "missing tensor '%s'", name) : EMBER_OK;
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != 1 || t->ne[3] != 1)
        return bind_fail(b, EMBER_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                         name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                         (long long)n_in, (long long)n_out);
    out->type = t->type;
    out->data = t->data;
    out->n_in = n_in;
    out->n_out = n_out;
    out->row_bytes = ember_type_row_size(t->type, n_in);
    return EMBER_OK;
}

ember_status bind_experts(binder *b, const char *name, int64_t n_in, int64_t n_out, int64_t n_expert,
                          ember_matrix *out) {
    const gguf_tensor *t = ember_gguf_find_tensor(b->m->gguf, name);
    if (!t) return bind_fail(b, EMBER_ERR_FORMAT, "missing tensor '%s'", name);
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_expert || t->ne[3] != 1)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                         (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                         (long long)n_in, (long long)n_out, (long long)n_expert);
    const ember_matrix whole = {.type = t->type,
                                .data = t->data,
                                .n_in = n_in,
                                .n_out = n_out * n_expert,
                                .row_bytes = ember_type_row_size(t->type, n_in)};
    for (int64_t e = 0; e < n_expert; e++) bind_mat_rows(&whole, e * n_out, n_out, &out[e]);
    return EMBER_OK;
}

void bind_mat_rows(const ember_matrix *whole, int64_t row0, int64_t n_rows, ember_matrix *out) {
    *out = *whole;
    out->data = (const char *)whole->data + (size_t)row0 * whole->row_bytes;
    out->n_out = n_rows;
}

/* The hyper-parameters every family requires, read first and in this order, so a file that lacks
 * several names the same key whatever its family. */
ember_status bind_common_hparams(binder *b) {
    ember_model *m = b->m;
    TRY(hp_block_count(b, &m->n_layer));
    TRY(hp_dim(b, "embedding_length", &m->n_embd, true, 0));
    return hp_dim(b, "attention.head_count", &m->n_head, true, 0);
}

/* What every family binds alike once its hyper-parameters hold: the vocabulary size (token_embd's
 * rows), the token embedding, the LM head (tied to the embedding when the file has no
 * output.weight), the final norm's weight, and the zeroed table of n_layer layers. */
ember_status bind_common(binder *b) {
    ember_model *m = b->m;
    const gguf_tensor *emb = ember_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return bind_fail(b, EMBER_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    m->n_vocab = emb->ne[1];
    TRY(bind_mat(b, "token_embd.weight", m->n_embd, m->n_vocab, true, &m->tok_embd));
    TRY(bind_mat(b, "output.weight", m->n_embd, m->n_vocab, false, &m->output));
    if (!m->output.data) m->output = m->tok_embd; /* tied head */
    TRY(bind_vec(b, "output_norm.weight", m->n_embd, true, &m->output_norm));
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
    return EMBER_OK;
}

/* "q8_0 (f32 norms)", from the types of the 2-D tensors. */
static char *dtype_summary(const ember_gguf *g) {
    bool seen[64] = {0};
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].n_dims >= 2 && g->tensors[i].type < 64) seen[g->tensors[i].type] = true;
    char buf[128] = "";
    for (int t = 0; t < 64; t++)
        if (seen[t]) {
            if (buf[0]) strncat(buf, "+", sizeof buf - strlen(buf) - 1);
            strncat(buf, ember_type_name((uint32_t)t), sizeof buf - strlen(buf) - 1);
        }
    return strdup(buf[0] ? buf : "none");
}

/* Expert tensors in a file of a dense family (the MoE rows of the family table bind their own). */
static ember_status refuse_experts(binder *b) {
    char q[256];
    if (b->m->family->moe) return EMBER_OK;
    for (uint64_t i = 0; i < b->m->gguf->n_tensors; i++)
        if (strstr(b->m->gguf->tensors[i].name, "_exps"))
            return bind_fail(
                b, EMBER_ERR_UNSUPPORTED, "tensor '%s' belongs to a mixture-of-experts model, which ember does not run",
                ember_escape(q, sizeof q, b->m->gguf->tensors[i].name, strlen(b->m->gguf->tensors[i].name), 48));
    return EMBER_OK;
}

/* Every matrix the forward pass multiplies by: the kernels' activation scratch sized for it (so no
 * evaluation allocates), and the weights repacked into the kernel set's layout where it has one
 * (kernels/compute.c; the mapped source pages are then released). Embedding tables used only for
 * row lookups (token_embd when tied, per_layer_token_embd, position_embd) stay as mapped. */
static ember_status prepare_matrix(ember_model *m, ember_matrix *w, ember_error *err) {
    if (!w->data) return EMBER_OK;
    ember_status st = ember_compute_reserve(m->compute, w->type, w->n_in, err);
    if (st == EMBER_ERR_UNSUPPORTED) { /* the kernels' message names the set and type; add the file */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return ember_error_set(err, st, "%s: %s", m->gguf->path, msg);
    }
    return st != EMBER_OK ? st : ember_compute_pack(m->compute, w, true, err);
}

/* Repacked copies are laid out in packing order, which follows a decode step round the cycle: the
 * output head (the end of one step, before the next step's layers), gemma4's per-layer input
 * projection, then the layers. The output head goes first also because it is often the token
 * embedding itself (tied): its source pages, touched by the copy, are released before the rest is
 * packed, which keeps the peak resident size at about one copy of the weights. */
static ember_status prepare_weights(ember_model *m, ember_error *err) {
    TRY(prepare_matrix(m, &m->output, err));
    TRY(prepare_matrix(m, &m->ple_proj, err));
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        ember_matrix *mats[] = {&L->wq,     &L->wk,   &L->wv,     &L->wqkv,     &L->wo,
                                &L->w_gate, &L->w_up, &L->w_down, &L->inp_gate, &L->proj};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) TRY(prepare_matrix(m, mats[i], err));
        TRY(prepare_matrix(m, &L->gate_inp, err));
        for (int64_t e = 0; L->exp_gate && e < m->n_expert; e++) {
            TRY(prepare_matrix(m, &L->exp_gate[e], err));
            TRY(prepare_matrix(m, &L->exp_up[e], err));
            TRY(prepare_matrix(m, &L->exp_down[e], err));
        }
    }
    return EMBER_OK;
}

/* general.architecture: present, a string, one of the family table's (m->family), and the --arch
 * the caller asked for, if any. */
static ember_status read_architecture(binder *b, const ember_model_params *p) {
    ember_model *m = b->m;
    const gguf_kv *arch_kv = ember_gguf_find(m->gguf, "general.architecture");
    if (!arch_kv)
        return bind_fail(b, EMBER_ERR_FORMAT, "missing metadata key 'general.architecture' (not a model file?)");
    if (arch_kv->value.type != GGUF_TYPE_STRING)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "metadata key 'general.architecture' has the wrong type (%s, expected string)",
                         gguf_value_type_name(arch_kv->value.type));
    m->architecture = ember_gguf_get_string(m->gguf, "general.architecture");
    if (!m->architecture) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
    if (!(m->family = ember_family_for_architecture(m->architecture))) {
        char q[256], supported[256];
        ember_family_architectures(supported, sizeof supported);
        return bind_fail(b, EMBER_ERR_UNSUPPORTED, "architecture '%s' is not supported (%s are)",
                         ember_escape(q, sizeof q, arch_kv->value.v.str.ptr, (size_t)arch_kv->value.v.str.len, 64),
                         supported);
    }
    if (p->arch && p->arch[0] && strcmp(p->arch, m->architecture) != 0) {
        char q[256];
        return bind_fail(b, EMBER_ERR_ARG, "--arch %s was given but the file is a '%s' model",
                         ember_escape(q, sizeof q, p->arch, strlen(p->arch), 64), m->architecture);
    }
    return EMBER_OK;
}

ember_status ember_model_load(const ember_model_params *p, ember_model **out, ember_error *err) {
    *out = NULL;
    if (!p || !p->path) return ember_error_set(err, EMBER_ERR_ARG, "ember_model_load: no model path given");
    ember_model *m = calloc(1, sizeof *m);
    if (!m) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_model_load: out of memory");
    ember_status st = ember_gguf_open(p->path, &m->gguf, err);
    if (st != EMBER_OK) {
        free(m);
        return st;
    }
    binder b = {.m = m, .err = err};
    m->allow_nonfinite = p->allow_nonfinite;
    if ((st = read_architecture(&b, p)) != EMBER_OK) goto fail;
    b.arch = m->architecture;
    if ((st = ember_model_override(m, p, err)) != EMBER_OK) goto fail;
    if ((st = refuse_experts(&b)) != EMBER_OK) goto fail;
    if ((st = m->family->bind(&b)) != EMBER_OK) goto fail;

    static const ember_type kv_types[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16};
    if ((unsigned)p->kv_cache > EMBER_KV_BF16) {
        st = ember_error_set(err, EMBER_ERR_ARG, "%s: unknown KV cache type %d", p->path, (int)p->kv_cache);
        goto fail;
    }
    m->kv_type = kv_types[p->kv_cache];
    /* default: the physical cores (a hyper-thread pair shares one core's units) */
    const int n_threads = p->n_threads > 0 ? p->n_threads : ember_cpu_physical_cores();
    if ((st = ember_compute_new(p->kernels, n_threads, &m->compute, err)) != EMBER_OK) goto fail;
    ember_gguf_advise_willneed(m->gguf); /* readahead for the repacking copy or the first evaluation */
    if (m->override_gguf) ember_gguf_advise_willneed(m->override_gguf);
    if ((st = prepare_weights(m, err)) != EMBER_OK) goto fail;
    m->ops = ember_compute_ops(m->compute);
    ember_kernels chosen = ember_compute_kernels(m->compute);
    m->name = ember_gguf_get_string(m->gguf, "general.name");
    m->dtype_summary = dtype_summary(m->gguf);
    m->info = (ember_model_info){
        .family = m->family->info.name,
        .architecture = m->architecture,
        .name = m->name,
        .n_layers = m->n_layer,
        .hidden_size = m->n_embd,
        .n_vocab = m->n_vocab,
        .n_heads = m->n_head,
        .n_kv_heads = m->n_head_kv,
        .head_dim = m->head_dim,
        .context_length = m->n_ctx_train,
        .dtype_summary = m->dtype_summary,
        .kernels = ember_kernels_name(chosen),
        .n_threads = n_threads,
        .threads_default = p->n_threads <= 0,
        .experimental = m->family->info.experimental,
        .repacked_bytes = ember_compute_packed_bytes(m->compute),
        .kv_cache = ember_kv_type_name(p->kv_cache),
        .final_norm = m->family->final_norm == EMBER_NORM_LAYER ? "layer" : "rms",
        .norm_eps = m->norm_eps,
        .override_from = m->override_gguf ? m->override_gguf->path : NULL,
        .override_tensors = (const char *const *)m->override_names,
        .n_override = m->n_override,
    };
    *out = m;
    return EMBER_OK;
fail:
    ember_model_free(m);
    return st;
}

void ember_model_free(ember_model *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->experts);
    free(m->architecture);
    free(m->name);
    free(m->dtype_summary);
    ember_compute_free(m->compute);
    ember_model_override_free(m);
    ember_gguf_close(m->gguf);
    free(m);
}

const ember_model_info *ember_model_get_info(const ember_model *m) { return &m->info; }

const char *ember_kv_type_name(ember_kv_type t) {
    return t == EMBER_KV_F16 ? "f16" : t == EMBER_KV_BF16 ? "bf16" : "f32";
}

bool ember_kv_type_parse(const char *s, ember_kv_type *out) {
    static const ember_kv_type all[] = {EMBER_KV_F32, EMBER_KV_F16, EMBER_KV_BF16};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, ember_kv_type_name(all[i])) == 0) {
            *out = all[i];
            return true;
        }
    return false;
}
const ember_gguf *ember_model_gguf(const ember_model *m) { return m->gguf; }

uint64_t ember_model_weight_bytes_per_token(const ember_model *m) {
    const ember_gguf *g = m->gguf;
    const bool has_output = ember_gguf_find_tensor(g, "output.weight") != NULL;
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *name = g->tensors[i].name;
        if (strcmp(name, "per_layer_token_embd.weight") == 0 || strcmp(name, "position_embd.weight") == 0) continue;
        if (strcmp(name, "token_embd.weight") == 0 && has_output) continue;
        bytes += g->tensors[i].size;
    }
    return bytes;
}
