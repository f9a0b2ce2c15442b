/* tiny_model.c — fills a GGUF writer with a random-weight llama / qwen3 / qwen2 model: the metadata
 * keys and tensor names llama.cpp uses, so the same file would load there too. Computes nothing. */
#include "tiny_model.h"

#include "tiny_tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ember_tiny_model_defaults(ember_tiny_model_params *p) {
    *p = (ember_tiny_model_params){
        .family = "llama", .dtype = EMBER_TYPE_F32, .seed = 1,
        .n_layer = 6, .n_embd = 64, .n_head = 4, .n_head_kv = 2, .n_ff = 128, .n_vocab = 512, .n_ctx = 256,
        .head_dim = 0, .rope_base = 0, .tied = -1, .rope_freqs = false, .tokenizer = true,
    };
}

bool ember_tiny_model_parse_dtype(const char *s, ember_type *out) {
    static const struct { const char *name; ember_type t; } all[] = {
        {"f32", EMBER_TYPE_F32}, {"f16", EMBER_TYPE_F16}, {"bf16", EMBER_TYPE_BF16}, {"q8_0", EMBER_TYPE_Q8_0}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (s && strcmp(s, all[i].name) == 0) {
            *out = all[i].t;
            return true;
        }
    return false;
}

/* ---- deterministic values -------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The generator state of one tensor: the seed mixed with an FNV-1a hash of the name. */
static uint64_t tensor_stream(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    splitmix64(&x); /* decorrelate nearby seeds */
    return x;
}

/* Approximately N(0, 1) in [-6, 6]: twelve 24-bit uniforms summed exactly in integers. */
static double normal(uint64_t *state) {
    int64_t sum = 0;
    for (int i = 0; i < 12; i++) sum += (int64_t)(splitmix64(state) >> 40);
    return (double)(sum - 6 * ((int64_t)1 << 24)) * 0x1p-24;
}

/* ---- building -------------------------------------------------------------------------------- */

typedef struct {
    const ember_tiny_model_params *p;
    ember_gguf_writer *w;
    float *buf; /* (largest tensor) scratch for generated values */
} builder;

/* A tensor of values mean + std * N(0,1). Vectors (n_dims 1) are f32; matrices use the dtype. */
static void add_random(builder *b, const char *name, int64_t ne0, int64_t ne1, float mean, float std) {
    uint64_t st = tensor_stream(b->p->seed, name);
    int64_t n = ne0 * ne1;
    for (int64_t i = 0; i < n; i++) b->buf[i] = mean + std * (float)normal(&st);
    const int64_t ne[2] = {ne0, ne1};
    if (ne1 == 1) ember_gguf_writer_add_tensor(b->w, name, EMBER_TYPE_F32, 1, ne, b->buf);
    else ember_gguf_writer_add_tensor(b->w, name, b->p->dtype, 2, ne, b->buf);
}

/* LLaMA-3's frequency factors: 1 for short wavelengths, `factor` for long ones, smooth between. */
static void add_rope_freqs(builder *b, int64_t n_rot, float base) {
    const double factor = 8.0, low = 1.0, high = 4.0, old_ctx = 8192.0;
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < n_rot / 2; i++) {
        double wavelen = 2.0 * pi / pow(base, -2.0 * (double)i / (double)n_rot);
        double f;
        if (wavelen < old_ctx / high) {
            f = 1.0;
        } else if (wavelen > old_ctx / low) {
            f = factor;
        } else {
            double smooth = (old_ctx / wavelen - low) / (high - low);
            f = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        b->buf[i] = (float)f;
    }
    const int64_t ne[1] = {n_rot / 2};
    ember_gguf_writer_add_tensor(b->w, "rope_freqs.weight", EMBER_TYPE_F32, 1, ne, b->buf);
}

static uint32_t file_type(ember_type t) {
    switch (t) { /* llama.cpp's LLAMA_FTYPE numbers */
    case EMBER_TYPE_F32: return 0;
    case EMBER_TYPE_F16: return 1;
    case EMBER_TYPE_Q8_0: return 7;
    case EMBER_TYPE_BF16: return 32;
    }
    return 0;
}

static ember_status check_params(const ember_tiny_model_params *p, int64_t hd, ember_error *err) {
    const char *f = p->family ? p->family : "";
    if (strcmp(f, "llama") && strcmp(f, "qwen3") && strcmp(f, "qwen2"))
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: family '%s' is not one of llama, qwen3, qwen2", f);
    if (p->dtype != EMBER_TYPE_F32 && p->dtype != EMBER_TYPE_F16 && p->dtype != EMBER_TYPE_BF16 &&
        p->dtype != EMBER_TYPE_Q8_0)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: dtype %d is not one of f32, f16, bf16, q8_0", (int)p->dtype);
    if (p->n_layer < 1 || p->n_layer > 1024 || p->n_embd < 1 || p->n_embd > 65536 || p->n_ff < 1 ||
        p->n_ff > 262144 || p->n_vocab < 1 || p->n_vocab > 1000000 || p->n_ctx < 1 || p->n_ctx > (1 << 24) ||
        p->n_head < 1 || p->n_head_kv < 1 || p->n_head > 1024)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: a size is out of range");
    if (p->n_head % p->n_head_kv)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: %lld heads are not a multiple of %lld KV heads",
                               (long long)p->n_head, (long long)p->n_head_kv);
    if (!p->head_dim && p->n_embd % p->n_head)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: hidden %lld is not a multiple of %lld heads (give a head size)",
                               (long long)p->n_embd, (long long)p->n_head);
    if (hd < 2 || hd % 2 || hd > 1024)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: head size %lld must be even and in 2..1024", (long long)hd);
    if (p->dtype == EMBER_TYPE_Q8_0 && (p->n_embd % 32 || p->n_ff % 32 || (p->n_head * hd) % 32))
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny model: q8_0 needs hidden, ff and heads*head_size to be multiples of 32");
    if (p->tokenizer && p->n_vocab < EMBER_TINY_TOKENIZER_MIN_VOCAB)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: the embedded tokenizer needs a vocabulary of >= %d",
                               EMBER_TINY_TOKENIZER_MIN_VOCAB);
    if (p->rope_freqs && strcmp(f, "llama"))
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: rope_freqs is a llama feature");
    return EMBER_OK;
}

ember_status ember_tiny_model_build(const ember_tiny_model_params *p, ember_gguf_writer *w, ember_error *err) {
    const int64_t hd = p->head_dim ? p->head_dim : (p->n_head > 0 ? p->n_embd / p->n_head : 0);
    ember_status st = check_params(p, hd, err);
    if (st != EMBER_OK) return st;
    const char *arch = p->family;
    const bool llama = strcmp(arch, "llama") == 0, qwen3 = strcmp(arch, "qwen3") == 0,
               qwen2 = strcmp(arch, "qwen2") == 0;
    const bool tied = p->tied < 0 ? !llama : p->tied != 0;
    const float base = p->rope_base > 0 ? p->rope_base : llama ? 10000.0f : 1000000.0f;
    const int64_t q_dim = p->n_head * hd, kv_dim = p->n_head_kv * hd;

    /* ---- metadata, in llama.cpp's order ---- */
    char key[160], name[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    ember_gguf_writer_set_string(w, "general.architecture", arch);
    static const char *dtype_names[] = {[EMBER_TYPE_F32] = "f32", [EMBER_TYPE_F16] = "f16",
                                        [EMBER_TYPE_Q8_0] = "q8_0", [EMBER_TYPE_BF16] = "bf16"};
    snprintf(name, sizeof name, "tiny-%s-%s-seed%llu", arch, dtype_names[p->dtype], (unsigned long long)p->seed);
    ember_gguf_writer_set_string(w, "general.name", name);
    ember_gguf_writer_set_u32(w, "general.alignment", 32);
    ember_gguf_writer_set_u32(w, "general.file_type", file_type(p->dtype));
    if (p->dtype == EMBER_TYPE_Q8_0) ember_gguf_writer_set_u32(w, "general.quantization_version", 2);
    ember_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)p->n_vocab);
    ember_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx);
    ember_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd);
    ember_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)p->n_layer);
    ember_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff);
    ember_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head);
    ember_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    /* Qwen3 files always say their head size (it is not hidden/heads in the real models). */
    if (qwen3 || hd != p->n_embd / p->n_head) {
        ember_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hd);
        ember_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    }
    ember_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
    ember_gguf_writer_set_f32(w, KEY("rope.freq_base"), base);
    ember_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), llama ? 1e-5f : 1e-6f);
#undef KEY
    if (p->tokenizer) {
        /* The pre-tokenizers of the real families (LLaMA 3 and Qwen2/3); LLaMA adds BOS, Qwen does not. */
        st = ember_tiny_tokenizer_build(w, p->n_vocab, llama ? "llama-bpe" : "qwen2", llama, err);
        if (st != EMBER_OK) return st;
    }

    /* ---- tensors ---- */
    int64_t biggest = p->n_vocab * p->n_embd;
    int64_t sizes[] = {q_dim * p->n_embd, p->n_ff * p->n_embd};
    for (size_t i = 0; i < 2; i++) biggest = sizes[i] > biggest ? sizes[i] : biggest;
    builder b = {.p = p, .w = w, .buf = malloc((size_t)biggest * sizeof(float))};
    if (!b.buf) return ember_error_set(err, EMBER_ERR_NOMEM, "tiny model: out of memory");
    const float s_embd = 1.0f / sqrtf((float)p->n_embd), s_q = 1.0f / sqrtf((float)q_dim),
                s_ff = 1.0f / sqrtf((float)p->n_ff);
    add_random(&b, "token_embd.weight", p->n_embd, p->n_vocab, 0.0f, 0.35f);
    if (p->rope_freqs) add_rope_freqs(&b, hd, base);
    for (int64_t l = 0; l < p->n_layer; l++) {
#define T(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
        add_random(&b, T("attn_norm.weight"), p->n_embd, 1, 1.0f, 0.1f);
        add_random(&b, T("attn_q.weight"), p->n_embd, q_dim, 0.0f, s_embd);
        if (qwen2) add_random(&b, T("attn_q.bias"), q_dim, 1, 0.0f, 0.1f);
        add_random(&b, T("attn_k.weight"), p->n_embd, kv_dim, 0.0f, s_embd);
        if (qwen2) add_random(&b, T("attn_k.bias"), kv_dim, 1, 0.0f, 0.1f);
        add_random(&b, T("attn_v.weight"), p->n_embd, kv_dim, 0.0f, s_embd);
        if (qwen2) add_random(&b, T("attn_v.bias"), kv_dim, 1, 0.0f, 0.1f);
        add_random(&b, T("attn_output.weight"), q_dim, p->n_embd, 0.0f, s_q);
        if (qwen3) {
            add_random(&b, T("attn_q_norm.weight"), hd, 1, 1.0f, 0.1f);
            add_random(&b, T("attn_k_norm.weight"), hd, 1, 1.0f, 0.1f);
        }
        add_random(&b, T("ffn_norm.weight"), p->n_embd, 1, 1.0f, 0.1f);
        add_random(&b, T("ffn_gate.weight"), p->n_embd, p->n_ff, 0.0f, s_embd);
        add_random(&b, T("ffn_up.weight"), p->n_embd, p->n_ff, 0.0f, s_embd);
        add_random(&b, T("ffn_down.weight"), p->n_ff, p->n_embd, 0.0f, s_ff);
#undef T
    }
    add_random(&b, "output_norm.weight", p->n_embd, 1, 1.0f, 0.1f);
    if (!tied) add_random(&b, "output.weight", p->n_embd, p->n_vocab, 0.0f, 0.35f);
    free(b.buf);
    return ember_gguf_writer_status(w, err);
}

ember_status ember_tiny_model_write(const ember_tiny_model_params *p, const char *path, ember_error *err) {
    ember_gguf_writer *w = ember_gguf_writer_new();
    if (!w) return ember_error_set(err, EMBER_ERR_NOMEM, "tiny model: out of memory");
    ember_status st = ember_tiny_model_build(p, w, err);
    if (st == EMBER_OK) st = ember_gguf_writer_write(w, path, err);
    ember_gguf_writer_free(w);
    return st;
}
