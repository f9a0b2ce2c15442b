/* model.c — turns a validated GGUF file into a model: family, hyper-parameters, bound tensors.
 * Must not compute anything; every missing or misshapen tensor is an error that names it. */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    ember_model *m;
    const char *arch; /* metadata key prefix */
    ember_error *err;
} binder;

static const char *family_name(ember_family f) {
    switch (f) {
    case EMBER_FAMILY_LLAMA: return "llama";
    case EMBER_FAMILY_QWEN3: return "qwen3";
    case EMBER_FAMILY_QWEN2: return "qwen2";
    case EMBER_FAMILY_GEMMA4: return "gemma4";
    case EMBER_FAMILY_GPT2: return "gpt2";
    }
    return "unknown";
}

static bool family_parse(const char *s, ember_family *f) {
    static const ember_family all[] = {EMBER_FAMILY_LLAMA, EMBER_FAMILY_QWEN3, EMBER_FAMILY_QWEN2,
                                       EMBER_FAMILY_GEMMA4, EMBER_FAMILY_GPT2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, family_name(all[i])) == 0) {
            *f = all[i];
            return true;
        }
    return false;
}

static ember_status bind_fail(binder *b, ember_status code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ember_error_set(b->err, code, "%s: %s", b->m->gguf->path, msg);
}

/* "<arch>.<suffix>" as an integer; `required` makes absence an error. */
static ember_status hp_int(binder *b, const char *suffix, int64_t *out, bool required, int64_t def) {
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

static ember_status hp_float(binder *b, const char *suffix, float *out, float def) {
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

/* A 1-D f32 vector of n values; f16/bf16 vectors are converted once into an owned copy. */
static ember_status bind_vec(binder *b, const char *name, int64_t n, bool required, const float **out) {
    *out = NULL;
    const gguf_tensor *t = ember_gguf_find_tensor(b->m->gguf, name);
    if (!t) return required ? bind_fail(b, EMBER_ERR_FORMAT, "missing tensor '%s'", name) : EMBER_OK;
    int64_t count = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (count != n)
        return bind_fail(b, EMBER_ERR_FORMAT, "tensor '%s' has %lld values, expected %lld", name, (long long)count,
                         (long long)n);
    if (t->type == EMBER_TYPE_F32) {
        *out = t->data;
        return EMBER_OK;
    }
    if (t->type == EMBER_TYPE_Q8_0)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED, "tensor '%s' is a vector stored as q8_0", name);
    ember_model *m = b->m;
    if (m->n_owned == m->cap_owned) {
        int64_t cap = m->cap_owned ? 2 * m->cap_owned : 16;
        float **p = realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
        m->owned = p;
        m->cap_owned = cap;
    }
    float *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
    ember_matrix row = {.type = t->type, .data = t->data, .n_in = n, .n_out = 1, .row_bytes = t->size};
    ember_matrix_row_f32(&row, 0, copy);
    m->owned[m->n_owned++] = copy;
    *out = copy;
    return EMBER_OK;
}

/* A matrix of n_out rows of n_in values (GGUF dims {n_in, n_out}). */
static ember_status bind_mat(binder *b, const char *name, int64_t n_in, int64_t n_out, bool required,
                             ember_matrix *out) {
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

#define TRY(expr)                                                                                                 \
    do {                                                                                                          \
        ember_status st_ = (expr);                                                                                \
        if (st_ != EMBER_OK) return st_;                                                                          \
    } while (0)

static ember_status bind_llama_like(binder *b) {
    ember_model *m = b->m;
    TRY(hp_int(b, "block_count", &m->n_layer, true, 0));
    TRY(hp_int(b, "embedding_length", &m->n_embd, true, 0));
    TRY(hp_int(b, "feed_forward_length", &m->n_ff, true, 0));
    TRY(hp_int(b, "attention.head_count", &m->n_head, true, 0));
    TRY(hp_int(b, "attention.head_count_kv", &m->n_head_kv, false, m->n_head));
    TRY(hp_int(b, "context_length", &m->n_ctx_train, false, 2048));
    if (m->n_layer < 1 || m->n_embd < 1 || m->n_head < 1 || m->n_head_kv < 1 || m->n_head % m->n_head_kv)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "inconsistent hyper-parameters: %lld layers, width %lld, %lld heads, %lld KV heads",
                         (long long)m->n_layer, (long long)m->n_embd, (long long)m->n_head, (long long)m->n_head_kv);
    TRY(hp_int(b, "attention.key_length", &m->head_dim, false, m->n_embd / m->n_head));
    int64_t v_len;
    TRY(hp_int(b, "attention.value_length", &v_len, false, m->head_dim));
    if (v_len != m->head_dim || m->head_dim < 2 || m->head_dim % 2)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED, "head size %lld (value length %lld) is not supported",
                         (long long)m->head_dim, (long long)v_len);
    TRY(hp_int(b, "rope.dimension_count", &m->n_rot, false, m->head_dim));
    if (m->n_rot > m->head_dim || m->n_rot % 2)
        return bind_fail(b, EMBER_ERR_FORMAT, "rope.dimension_count %lld does not fit head size %lld",
                         (long long)m->n_rot, (long long)m->head_dim);
    TRY(hp_float(b, "rope.freq_base", &m->rope_base, 10000.0f));
    TRY(hp_float(b, "attention.layer_norm_rms_epsilon", &m->norm_eps, 1e-5f));
    m->rope_neox = m->family != EMBER_FAMILY_LLAMA;
    m->attn_scale = 1.0f / sqrtf((float)m->head_dim);

    const gguf_tensor *emb = ember_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return bind_fail(b, EMBER_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    m->n_vocab = emb->ne[1];
    TRY(bind_mat(b, "token_embd.weight", m->n_embd, m->n_vocab, true, &m->tok_embd));
    TRY(bind_mat(b, "output.weight", m->n_embd, m->n_vocab, false, &m->output));
    if (!m->output.data) m->output = m->tok_embd; /* tied head */
    TRY(bind_vec(b, "output_norm.weight", m->n_embd, true, &m->output_norm));
    TRY(bind_vec(b, "rope_freqs.weight", m->n_rot / 2, false, &m->rope_freqs));

    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) return bind_fail(b, EMBER_ERR_NOMEM, "out of memory");
    int64_t q_dim = m->n_head * m->head_dim, kv_dim = m->n_head_kv * m->head_dim;
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
        L->n_ff = m->n_ff;
        L->n_head_kv = m->n_head_kv;
        L->head_dim = m->head_dim;
        L->kv_dim = kv_dim;
        L->kv_source = l;
        TRY(bind_vec(b, NAME("attn_norm.weight"), m->n_embd, true, &L->attn_norm));
        TRY(bind_mat(b, NAME("attn_q.weight"), m->n_embd, q_dim, true, &L->wq));
        TRY(bind_mat(b, NAME("attn_k.weight"), m->n_embd, kv_dim, true, &L->wk));
        TRY(bind_mat(b, NAME("attn_v.weight"), m->n_embd, kv_dim, true, &L->wv));
        TRY(bind_mat(b, NAME("attn_output.weight"), q_dim, m->n_embd, true, &L->wo));
        bool qkv_bias = m->family == EMBER_FAMILY_QWEN2;
        TRY(bind_vec(b, NAME("attn_q.bias"), q_dim, qkv_bias, &L->bq));
        TRY(bind_vec(b, NAME("attn_k.bias"), kv_dim, qkv_bias, &L->bk));
        TRY(bind_vec(b, NAME("attn_v.bias"), kv_dim, qkv_bias, &L->bv));
        bool qk_norm = m->family == EMBER_FAMILY_QWEN3;
        TRY(bind_vec(b, NAME("attn_q_norm.weight"), m->head_dim, qk_norm, &L->q_norm));
        TRY(bind_vec(b, NAME("attn_k_norm.weight"), m->head_dim, qk_norm, &L->k_norm));
        TRY(bind_vec(b, NAME("ffn_norm.weight"), m->n_embd, true, &L->ffn_norm));
        TRY(bind_mat(b, NAME("ffn_gate.weight"), m->n_embd, m->n_ff, true, &L->w_gate));
        TRY(bind_mat(b, NAME("ffn_up.weight"), m->n_embd, m->n_ff, true, &L->w_up));
        TRY(bind_mat(b, NAME("ffn_down.weight"), m->n_ff, m->n_embd, true, &L->w_down));
#undef NAME
    }
    m->forward = ember_llama_forward;
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

static ember_status refuse_experts(binder *b) {
    for (uint64_t i = 0; i < b->m->gguf->n_tensors; i++)
        if (strstr(b->m->gguf->tensors[i].name, "_exps"))
            return bind_fail(b, EMBER_ERR_UNSUPPORTED, "tensor '%s' belongs to a mixture-of-experts model, which ember does not run",
                             b->m->gguf->tensors[i].name);
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
    m->architecture = ember_gguf_get_string(m->gguf, "general.architecture");
    if (!m->architecture) {
        st = bind_fail(&b, EMBER_ERR_FORMAT, "missing metadata key 'general.architecture' (not a model file?)");
        goto fail;
    }
    if (!family_parse(m->architecture, &m->family)) {
        st = bind_fail(&b, EMBER_ERR_UNSUPPORTED,
                       "architecture '%s' is not supported (llama, qwen3, qwen2, gemma4, gpt2 are)", m->architecture);
        goto fail;
    }
    if (p->arch && p->arch[0] && strcmp(p->arch, m->architecture) != 0) {
        st = bind_fail(&b, EMBER_ERR_ARG, "--arch %s was given but the file is a '%s' model", p->arch, m->architecture);
        goto fail;
    }
    b.arch = m->architecture;
    if ((st = refuse_experts(&b)) != EMBER_OK) goto fail;
    switch (m->family) {
    case EMBER_FAMILY_LLAMA:
    case EMBER_FAMILY_QWEN3:
    case EMBER_FAMILY_QWEN2: st = bind_llama_like(&b); break;
    default:
        st = bind_fail(&b, EMBER_ERR_UNSUPPORTED, "the '%s' family is not implemented yet", m->architecture);
    }
    if (st != EMBER_OK) goto fail;

    ember_kernels chosen;
    m->ops = ember_kernels_select(p->kernels, &chosen);
    m->name = ember_gguf_get_string(m->gguf, "general.name");
    m->dtype_summary = dtype_summary(m->gguf);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    m->info = (ember_model_info){
        .family = family_name(m->family),
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
        .n_threads = p->n_threads > 0 ? p->n_threads : (int)(cores > 0 ? cores : 1),
        .experimental = m->family == EMBER_FAMILY_QWEN2,
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
    free(m->architecture);
    free(m->name);
    free(m->dtype_summary);
    ember_gguf_close(m->gguf);
    free(m);
}

const ember_model_info *ember_model_get_info(const ember_model *m) { return &m->info; }
const ember_gguf *ember_model_gguf(const ember_model *m) { return m->gguf; }
