/* tiny_model.c — fills a GGUF writer with a random-weight model of any family (its table below):
 * the metadata keys and tensor names llama.cpp uses, so the same file would load there too.
 * Computes nothing. */
#include "tiny_model.h"

#include "tiny_tokenizer.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 1024

void ember_tiny_model_defaults(ember_tiny_model_params *p) {
    *p = (ember_tiny_model_params){
        .family = "llama",
        .dtype = EMBER_TYPE_F32,
        .seed = 1,
        .n_layer = 6,
        .n_embd = 64,
        .n_head = 4,
        .n_head_kv = 0,
        .n_ff = 128,
        .n_vocab = 512,
        .n_ctx = 256,
        .head_dim = 0,
        .rope_base = 0,
        .tied = -1,
        .rope_freqs = -1,
        .tokenizer = true,
        .head_dim_swa = 0,
        .n_head_kv_full = 0,
        .rope_base_swa = 0,
        .sliding_window = 0,
        .swa_pattern = NULL,
        .shared_kv_layers = -1,
        .ple_dim = -1,
        .softcap = -1.0f,
        .attn_softcap = -1.0f,
        .rope_scale = 0,
        .sequential_residual = false,
        .n_expert = 0,
        .n_expert_used = 0,
        .n_ff_exp = 0,
    };
}

const char *const ember_tiny_model_shapes[] = {"qwen3-0.6b", "llama3.2-1b",       "gemma4-e2b", "gemma2-2b",
                                               "gemma3-1b",  "pythia-160m",       "pythia-1b",  "olmo2-1b",
                                               "phi3-mini",  "qwen3-30b-a3b-12l", NULL};

bool ember_tiny_model_shape(const char *name, ember_tiny_model_params *p) {
    ember_tiny_model_params s;
    ember_tiny_model_defaults(&s);
    s.dtype = EMBER_TYPE_Q8_0;
    s.n_ctx = 4096;
    s.tokenizer = false;
    if (name && strcmp(name, "qwen3-0.6b") == 0) {
        s.family = "qwen3";
        s.n_layer = 28, s.n_embd = 1024, s.n_head = 16, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = 3072;
        s.n_vocab = 151936;
    } else if (name && strcmp(name, "llama3.2-1b") == 0) {
        s.family = "llama";
        s.n_layer = 16, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 8, s.head_dim = 64, s.n_ff = 8192;
        s.n_vocab = 128256, s.rope_base = 500000.0f, s.rope_freqs = 1, s.tied = 1;
    } else if (name && strcmp(name, "gemma4-e2b") == 0) {
        s.family = "gemma4";
        s.n_layer = 35, s.n_embd = 1536, s.n_head = 8, s.n_head_kv = 1, s.n_head_kv_full = 1, s.head_dim = 512;
        s.head_dim_swa = 256, s.n_ff = 6144, s.n_vocab = 262144, s.sliding_window = 512;
        s.swa_pattern = "SSSSFSSSSFSSSSFSSSSFSSSSFSSSSFSSSSF", s.shared_kv_layers = 20, s.ple_dim = 256;
    } else if (name && strcmp(name, "gemma2-2b") == 0) {
        s.family = "gemma2";
        s.n_layer = 26, s.n_embd = 2304, s.n_head = 8, s.n_head_kv = 4, s.head_dim = 256, s.n_ff = 9216;
        s.n_vocab = 256000, s.n_ctx = 8192, s.sliding_window = 4096, s.tied = 1;
    } else if (name && strcmp(name, "gemma3-1b") == 0) {
        s.family = "gemma3";
        s.n_layer = 26, s.n_embd = 1152, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 256, s.n_ff = 6912;
        s.n_vocab = 262144, s.n_ctx = 32768, s.sliding_window = 512, s.tied = 1;
    } else if (name && strcmp(name, "pythia-160m") == 0) { /* EleutherAI/pythia-160m's config */
        s.family = "gptneox";
        s.n_layer = 12, s.n_embd = 768, s.n_head = 12, s.n_ff = 3072, s.n_vocab = 50304, s.n_ctx = 2048;
    } else if (name && strcmp(name, "pythia-1b") == 0) {
        s.family = "gptneox";
        s.n_layer = 16, s.n_embd = 2048, s.n_head = 8, s.n_ff = 8192, s.n_vocab = 50304, s.n_ctx = 2048;
    } else if (name && strcmp(name, "olmo2-1b") == 0) {
        s.family = "olmo2";
        s.n_layer = 16, s.n_embd = 2048, s.n_head = 16, s.n_head_kv = 16, s.n_ff = 8192, s.n_vocab = 100352;
    } else if (name && strcmp(name, "phi3-mini") == 0) { /* Phi-3-mini-4k: no LongRoPE factors */
        s.family = "phi3";
        s.n_layer = 32, s.n_embd = 3072, s.n_head = 32, s.n_head_kv = 32, s.n_ff = 8192, s.n_vocab = 32064;
        s.sliding_window = 2047;
    } else if (name && strcmp(name, "qwen3-30b-a3b-12l") == 0) {
        /* Qwen3-30B-A3B's layers (128 experts, 8 used, expert ff 768), 12 of its 48: ~8 GB in q8_0,
         * where the whole model (~32 GB) does not fit a 24 GB machine */
        s.family = "qwen3moe";
        s.n_layer = 12, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 4, s.head_dim = 128, s.n_ff = 6144;
        s.n_vocab = 151936, s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 768;
    } else {
        return false;
    }
    *p = s;
    return true;
}

/* The weight types the tool writes are the traits table's weight types (those with a to_float;
 * tools/gguf_writer.c encodes each): their values per block, 0 for any other type. */
static int64_t dtype_block(ember_type t) {
    const ember_type_traits *tr = ember_type_traits_get((uint32_t)t);
    return tr && tr->to_float ? tr->block_size : 0;
}

/* The --dtype spelling of a weight type: its traits name in lower case ("q4_k" for q4_K), into buf. */
static const char *dtype_spelling(ember_type t, char *buf, size_t cap) {
    const char *name = ember_type_name((uint32_t)t);
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) buf[i] = (char)tolower((unsigned char)name[i]);
    buf[i] = '\0';
    return buf;
}
#define DTYPE_CHARS 16

bool ember_tiny_model_parse_dtype(const char *s, ember_type *out) {
    char spelled[DTYPE_CHARS];
    for (uint32_t t = 0; s && t < EMBER_TYPE_COUNT; t++)
        if (dtype_block((ember_type)t) && strcmp(s, dtype_spelling((ember_type)t, spelled, sizeof spelled)) == 0) {
            *out = (ember_type)t;
            return true;
        }
    return false;
}

void ember_tiny_model_dtype_list(char *buf, size_t cap) {
    char spelled[DTYPE_CHARS];
    if (cap) buf[0] = '\0';
    for (uint32_t t = 0; cap && t < EMBER_TYPE_COUNT; t++) {
        if (!dtype_block((ember_type)t)) continue;
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s%s", used ? ", " : "",
                 dtype_spelling((ember_type)t, spelled, sizeof spelled));
    }
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

/* ---- the settings, with every "family's usual" resolved ---------------------------------------- */

typedef struct tiny_family tiny_family;

typedef struct {
    const tiny_family *fam;
    const char *arch;
    bool tied, rope_freqs;
    int64_t hd, n_head_kv; /* gemma4: full layers' head size; sliding layers' KV heads */
    float base;            /* gemma4: full layers' RoPE base */
    /* gemma4 (window, base_swa, softcap and sliding also gemma2/3) */
    int64_t hd_swa, n_head_kv_full, window, shared, ple;
    float base_swa, softcap;
    bool sliding[MAX_LAYERS];
    int64_t n_expert, n_expert_used, n_ff_exp; /* qwen3moe */
    float attn_softcap, rope_scale;            /* gemma2, gemma3 */
} shape;

typedef struct {
    const ember_tiny_model_params *p;
    ember_gguf_writer *w;
    float *buf;        /* scratch for generated values: the largest tensor and one spare row of n_embd */
    bool *used;        /* (entries of p->tensor_types) which named a matrix written */
    ember_type *types; /* (entries of p->tensor_types) their types */
} builder;

/* A family the tool writes: its usual settings and its writer. One row per family, the one list
 * of them (make-tiny-model's --family, ember.make_tiny_model's family option). The engine's own
 * table (src/engine/families.c) names the same families; tests/test_tiny_model.c checks both agree. */
struct tiny_family {
    const char *name;   /* general.architecture */
    const char *label;  /* general.name's family part; NULL: the name (phi3: llama.cpp gives a model whose
                         * name says "phi3" the real Phi-3 vocabulary's special-token attributes) */
    const char *pre;    /* the embedded tokenizer's pre-tokenizer (tokenizer.ggml.pre) */
    bool add_bos;       /* and whether it adds BOS */
    bool tied;          /* the usual head: tied to the embedding */
    float rope_base;    /* the usual RoPE base; 0: no RoPE (learned positions, rope_base refused) */
    bool rope_freqs;    /* may carry rope_freqs.weight ... */
    bool rope_freqs_on; /* ... and does by default */
    bool mha;           /* no grouped-query attention: the KV heads are the heads */
    bool gemma_layout;  /* takes the gemma4 settings (sliding layers, shared KV, per-layer inputs, softcap) */
    int swa_period;     /* gemma2/3: layer l slides unless l % period == period - 1; takes the window */
    bool softcaps;      /* gemma2: attention and final softcaps (required) */
    bool swa_rope_own;  /* gemma3: sliding layers' own RoPE base, linear scaling of the global ones */
    float norm_eps;     /* attention.layer_norm_rms_epsilon (llama block) */
    bool head_size_key; /* always writes attention.key_length/value_length (llama block) */
    bool qkv_bias;      /* Q/K/V biases (llama block) */
    bool qk_norm;       /* per-head Q/K norms (llama block) */
    bool olmo_norms;    /* olmo2: norms after attention and MLP instead of before, Q/K norms full width */
    bool window;        /* phi3: takes the sliding window (every layer) */
    bool moe;           /* qwen3moe: routed experts in place of the MLP */
    /* Resolves the layout-specific settings once the common ones are set (head sizes, ...). */
    ember_status (*resolve)(const ember_tiny_model_params *p, shape *s, ember_error *err);
    void (*metadata)(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
    void (*tensors)(builder *b, const shape *s);
};

static ember_status resolve_plain(const ember_tiny_model_params *p, shape *s, ember_error *err);
static ember_status resolve_gemma4(const ember_tiny_model_params *p, shape *s, ember_error *err);
static ember_status resolve_gpt2(const ember_tiny_model_params *p, shape *s, ember_error *err);
static ember_status resolve_gemma23(const ember_tiny_model_params *p, shape *s, ember_error *err);
static ember_status resolve_olmo2(const ember_tiny_model_params *p, shape *s, ember_error *err);
static void metadata_gemma23(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
static void tensors_gemma23(builder *b, const shape *s);
static ember_status resolve_gptneox(const ember_tiny_model_params *p, shape *s, ember_error *err);
static void metadata_llama(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
static void metadata_phi3(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
static void tensors_phi3(builder *b, const shape *s);
static ember_status resolve_moe(const ember_tiny_model_params *p, shape *s, ember_error *err);
static void add_experts(builder *b, const shape *s, int64_t l);
static void metadata_moe(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
static void metadata_gemma4(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
static void metadata_gpt2(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
static void metadata_gptneox(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s);
static void tensors_llama(builder *b, const shape *s);
static void tensors_gemma4(builder *b, const shape *s);
static void tensors_gpt2(builder *b, const shape *s);

/* The pre-tokenizers of the real families: LLaMA 3's, Qwen2/3's, GPT-2's (also for Gemma 4, whose
 * own SentencePiece-style vocabulary the tiny one does not imitate). LLaMA and Gemma add BOS. */
static const tiny_family tiny_families[] = {
    {.name = "llama",
     .pre = "llama-bpe",
     .add_bos = true,
     .rope_base = 10000.0f,
     .rope_freqs = true,
     .norm_eps = 1e-5f,
     .resolve = resolve_plain,
     .metadata = metadata_llama,
     .tensors = tensors_llama},
    {.name = "qwen3",
     .pre = "qwen2",
     .tied = true,
     .rope_base = 1000000.0f,
     .norm_eps = 1e-6f,
     .head_size_key = true,
     .qk_norm = true,
     .resolve = resolve_plain,
     .metadata = metadata_llama,
     .tensors = tensors_llama},
    {.name = "qwen2",
     .pre = "qwen2",
     .tied = true,
     .rope_base = 1000000.0f,
     .norm_eps = 1e-6f,
     .qkv_bias = true,
     .resolve = resolve_plain,
     .metadata = metadata_llama,
     .tensors = tensors_llama},
    {.name = "qwen3moe",
     .pre = "qwen2",
     .rope_base = 1000000.0f,
     .norm_eps = 1e-6f,
     .head_size_key = true,
     .qk_norm = true,
     .moe = true,
     .resolve = resolve_moe,
     .metadata = metadata_moe,
     .tensors = tensors_llama},
    {.name = "gemma4",
     .pre = "gpt-2",
     .add_bos = true,
     .tied = true,
     .rope_base = 1000000.0f,
     .rope_freqs = true,
     .rope_freqs_on = true,
     .gemma_layout = true,
     .resolve = resolve_gemma4,
     .metadata = metadata_gemma4,
     .tensors = tensors_gemma4},
    {.name = "gemma2",
     .pre = "gpt-2",
     .add_bos = true,
     .rope_base = 10000.0f,
     .norm_eps = 1e-6f,
     .head_size_key = true,
     .tied = true,
     .swa_period = 2,
     .softcaps = true,
     .resolve = resolve_gemma23,
     .metadata = metadata_gemma23,
     .tensors = tensors_gemma23},
    {.name = "gemma3",
     .pre = "gpt-2",
     .add_bos = true,
     .tied = true,
     .rope_base = 1000000.0f,
     .norm_eps = 1e-6f,
     .head_size_key = true,
     .qk_norm = true,
     .swa_period = 6,
     .swa_rope_own = true,
     .resolve = resolve_gemma23,
     .metadata = metadata_gemma23,
     .tensors = tensors_gemma23},
    {.name = "olmo2",
     .pre = "gpt-2",
     .rope_base = 500000.0f,
     .norm_eps = 1e-6f,
     .olmo_norms = true,
     .resolve = resolve_olmo2,
     .metadata = metadata_llama,
     .tensors = tensors_llama},
    /* Phi-3: the llama block with fused attn_qkv and ffn_up ([gate | up]), NEOX RoPE, LongRoPE's
     * factors with --rope-freqs, a sliding window on every layer with --window */
    {.name = "phi3",
     .label = "phi",
     .pre = "gpt-2",
     .add_bos = true,
     .rope_base = 10000.0f,
     .rope_freqs = true,
     .norm_eps = 1e-5f,
     .window = true,
     .resolve = resolve_olmo2,
     .metadata = metadata_phi3,
     .tensors = tensors_phi3},
    {.name = "gpt2",
     .pre = "gpt-2",
     .tied = true,
     .mha = true,
     .resolve = resolve_gpt2,
     .metadata = metadata_gpt2,
     .tensors = tensors_gpt2},
    /* Pythia: the GPT-2 block's tensors without learned positions, RoPE on a quarter of each head,
     * its own output head, the parallel residual */
    {.name = "gptneox",
     .pre = "gpt-2",
     .rope_base = 10000.0f,
     .mha = true,
     .resolve = resolve_gptneox,
     .metadata = metadata_gptneox,
     .tensors = tensors_gpt2},
};
#define N_TINY_FAMILIES ((int)(sizeof tiny_families / sizeof tiny_families[0]))

const char *ember_tiny_model_family(int i) { return i >= 0 && i < N_TINY_FAMILIES ? tiny_families[i].name : NULL; }

/* Joins the names of the families that pass `keep` (NULL: all) with ", " (" and " before the last
 * when `and` is given) into buf. */
static void family_list(char *buf, size_t cap, bool (*keep)(const tiny_family *), const char *and) {
    const char *names[N_TINY_FAMILIES];
    int n = 0;
    for (int i = 0; i < N_TINY_FAMILIES; i++)
        if (!keep || keep(&tiny_families[i])) names[n++] = tiny_families[i].name;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *sep = i == 0 ? "" : and&&i == n - 1 ? and : ", ";
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s%s", sep, names[i]);
    }
}

void ember_tiny_model_family_list(char *buf, size_t cap) {
    if (cap) family_list(buf, cap, NULL, NULL);
}

static bool takes_rope_freqs(const tiny_family *f) { return f->rope_freqs; }

static const tiny_family *find_family(const char *name) {
    for (int i = 0; name && i < N_TINY_FAMILIES; i++)
        if (strcmp(name, tiny_families[i].name) == 0) return &tiny_families[i];
    return NULL;
}

/* With kv_from = n_layer - shared (0 <= shared < n_layer), layers from kv_from on read the cache of
 * layer kv_from - 2 (sliding) or kv_from - 1 (full), which must exist and be of the same kind (and so,
 * here, of the same KV shape). Returns the first layer for which that fails, or -1. */
static int64_t bad_shared_layer(const shape *s, int64_t n_layer, int64_t shared) {
    const int64_t kv_from = n_layer - shared;
    for (int64_t l = kv_from; l < n_layer; l++) {
        int64_t src = kv_from - (s->sliding[l] ? 2 : 1);
        if (src < 0 || s->sliding[src] != s->sliding[l]) return l;
    }
    return -1;
}

static ember_status check_sizes(const ember_tiny_model_params *p, ember_error *err) {
    if (p->n_layer < 1 || p->n_layer > MAX_LAYERS || p->n_embd < 1 || p->n_embd > 65536 || p->n_ff < 1 ||
        p->n_ff > 262144 || p->n_vocab < 1 || p->n_vocab > 1000000 || p->n_ctx < 1 || p->n_ctx > (1 << 24) ||
        p->n_head < 1 || p->n_head > 1024 || p->n_head_kv < 0 || p->n_head_kv > 1024 || p->head_dim < 0 ||
        p->head_dim_swa < 0 || p->n_head_kv_full < 0 || p->n_head_kv_full > 1024 || p->sliding_window < 0 ||
        p->sliding_window > (1 << 24) || p->shared_kv_layers < -1 || p->ple_dim < -1 || p->ple_dim > 65536)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: a size is out of range");
    return EMBER_OK;
}

/* The settings only some families take, refused elsewhere. */
static ember_status check_family_settings(const ember_tiny_model_params *p, const tiny_family *fam, ember_error *err) {
    const bool gemma23 = fam->swa_period > 0;
    if (!fam->gemma_layout && (p->head_dim_swa || p->n_head_kv_full || p->swa_pattern || p->shared_kv_layers != -1 ||
                               p->ple_dim != -1 || (!gemma23 && !fam->window && p->sliding_window) ||
                               (!gemma23 && p->softcap >= 0) || (!fam->swa_rope_own && p->rope_base_swa != 0)))
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny model: sliding window, pattern, shared-KV layers, per-layer inputs, softcap and "
                               "the sliding layers' head size, KV heads and RoPE base are gemma4 settings, not %s ones "
                               "(gemma2 and gemma3 take the window and softcap, gemma3 the sliding layers' RoPE base)",
                               fam->name);
    if (p->attn_softcap >= 0 && !(fam->softcaps && gemma23))
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: the attention softcap is a gemma2 setting");
    if ((p->n_expert || p->n_expert_used || p->n_ff_exp) && !fam->moe)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: experts are a qwen3moe setting");
    if (p->rope_scale != 0 && !fam->swa_rope_own)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: linear RoPE scaling is a gemma3 setting");
    if (p->rope_attn_factor != 0 && fam->metadata != metadata_phi3)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: the LongRoPE attention factor is a phi3 setting");
    if (p->sequential_residual && fam->metadata != metadata_gptneox)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: the sequential residual is a gptneox setting");
    if (p->rope_freqs > 0 && !fam->rope_freqs) {
        char list[128];
        family_list(list, sizeof list, takes_rope_freqs, " and ");
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: rope_freqs is a %s feature", list);
    }
    if (fam->rope_base == 0 && p->rope_base != 0)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: %s has no RoPE (learned positions)", fam->name);
    return EMBER_OK;
}

static ember_status resolve(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    const tiny_family *fam = find_family(p->family);
    memset(s, 0, sizeof *s);
    if (!fam) {
        char list[128];
        ember_tiny_model_family_list(list, sizeof list);
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: family '%s' is not one of %s",
                               p->family ? p->family : "", list);
    }
    s->fam = fam;
    s->arch = fam->name;
    if (dtype_block(p->dtype) == 0) {
        char list[128];
        ember_tiny_model_dtype_list(list, sizeof list);
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: dtype %d is not one of %s", (int)p->dtype, list);
    }
    ember_status st = check_sizes(p, err);
    if (st == EMBER_OK) st = check_family_settings(p, fam, err);
    if (st != EMBER_OK) return st;
    s->tied = p->tied < 0 ? fam->tied : p->tied != 0;
    s->rope_freqs = p->rope_freqs < 0 ? fam->rope_freqs_on : p->rope_freqs != 0;
    s->n_head_kv = p->n_head_kv ? p->n_head_kv : fam->mha ? p->n_head : 2;
    s->base = p->rope_base > 0 ? p->rope_base : fam->rope_base;
    return fam->resolve(p, s, err);
}

/* One head size for every layer: hidden / heads unless given. */
static ember_status resolve_plain(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    if (!p->head_dim && p->n_embd % p->n_head != 0)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny model: hidden %lld is not a multiple of %lld heads (give a head size)",
                               (long long)p->n_embd, (long long)p->n_head);
    s->hd = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
    return EMBER_OK;
}

/* OLMo 2 and Phi-3: one head size, hidden / heads (llama.cpp's graphs assume it), and a separate
 * head; phi3's sliding window as given (0: none). */
static ember_status resolve_olmo2(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    ember_status st = resolve_plain(p, s, err);
    if (st != EMBER_OK) return st;
    if (s->hd * p->n_head != p->n_embd)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: %s's head size is hidden / heads", s->fam->name);
    if (s->tied) return ember_error_set(err, EMBER_ERR_ARG, "tiny model: %s's head is never tied", s->fam->name);
    s->window = p->sliding_window;
    return EMBER_OK;
}

/* Qwen3-MoE: the qwen3 settings and the experts (4, 2 used, ff / 2 wide by default). */
static ember_status resolve_moe(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    ember_status st = resolve_plain(p, s, err);
    if (st != EMBER_OK) return st;
    s->n_expert = p->n_expert ? p->n_expert : 4;
    s->n_expert_used = p->n_expert_used ? p->n_expert_used : 2;
    s->n_ff_exp = p->n_ff_exp ? p->n_ff_exp : p->n_ff / 2;
    if (s->n_expert < 1 || s->n_expert > 1024 || s->n_expert_used < 1 || s->n_expert_used > s->n_expert ||
        s->n_ff_exp < 1 || s->n_ff_exp > 65536)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny model: %lld experts, %lld used, expert ff %lld (1..1024 experts, 1..experts "
                               "used, expert ff 1..65536)",
                               (long long)s->n_expert, (long long)s->n_expert_used, (long long)s->n_ff_exp);
    const int64_t blk = dtype_block(p->dtype);
    if (blk > 1 && s->n_ff_exp % blk)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: the expert ff %lld must be a multiple of %lld",
                               (long long)s->n_ff_exp, (long long)blk);
    return EMBER_OK;
}

/* GPT-2 (and GPT-NeoX): one head size, hidden / heads, and as many KV heads as heads. */
static ember_status resolve_gpt2(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    ember_status st = resolve_plain(p, s, err);
    if (st != EMBER_OK) return st;
    if (s->n_head_kv != p->n_head)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny model: %s has no grouped-query attention (KV heads %lld != heads %lld)",
                               s->fam->name, (long long)s->n_head_kv, (long long)p->n_head);
    if (p->n_embd % p->n_head != 0 || s->hd != p->n_embd / p->n_head)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: %s's head size is hidden / heads", s->fam->name);
    return EMBER_OK;
}

/* GPT-NeoX: as GPT-2, and always its own output head (llama.cpp requires output.weight). */
static ember_status resolve_gptneox(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    ember_status st = resolve_gpt2(p, s, err);
    if (st != EMBER_OK) return st;
    if (s->tied) return ember_error_set(err, EMBER_ERR_ARG, "tiny model: gptneox files have their own output head");
    if (s->hd < 8) return ember_error_set(err, EMBER_ERR_ARG, "tiny model: gptneox needs a head size of at least 8");
    return EMBER_OK;
}

/* Gemma 4's sliding/full pattern: the given one, else every 4th layer and the last full. */
static ember_status resolve_gemma4_pattern(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    if (!p->swa_pattern) {
        for (int64_t l = 0; l < p->n_layer; l++) s->sliding[l] = (l + 1) % 4 != 0 && l != p->n_layer - 1;
        return EMBER_OK;
    }
    if ((int64_t)strlen(p->swa_pattern) != p->n_layer)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny model: the sliding-window pattern '%.64s' has %zu entries for %lld layers",
                               p->swa_pattern, strlen(p->swa_pattern), (long long)p->n_layer);
    for (int64_t l = 0; l < p->n_layer; l++) {
        char c = p->swa_pattern[l];
        if (c != 'S' && c != 's' && c != 'F' && c != 'f')
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "tiny model: the sliding-window pattern '%.64s' may hold only S (sliding) and F "
                                   "(full)",
                                   p->swa_pattern);
        s->sliding[l] = c == 'S' || c == 's';
    }
    return EMBER_OK;
}

/* Gemma 4's shared-KV layers: the given count, else 2 when the pattern allows it. */
static ember_status resolve_gemma4_shared(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    if (p->shared_kv_layers < 0) {
        s->shared = p->n_layer > 2 && bad_shared_layer(s, p->n_layer, 2) < 0 ? 2 : 0;
        return EMBER_OK;
    }
    s->shared = p->shared_kv_layers;
    if (s->shared >= p->n_layer)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny model: %lld shared-KV layers leave none of the %lld layers to make a KV cache",
                               (long long)s->shared, (long long)p->n_layer);
    int64_t bad = bad_shared_layer(s, p->n_layer, s->shared);
    if (bad < 0) return EMBER_OK;
    const int64_t src = p->n_layer - s->shared - (s->sliding[bad] ? 2 : 1);
    return ember_error_set(err, EMBER_ERR_ARG,
                           "tiny model: with %lld shared-KV layers of %lld, %s layer %lld would read the cache of "
                           "layer %lld, %s (layer kv_from-2 must be sliding and kv_from-1 full)",
                           (long long)s->shared, (long long)p->n_layer, s->sliding[bad] ? "sliding" : "full",
                           (long long)bad, (long long)src,
                           src < 0           ? "which does not exist"
                           : s->sliding[src] ? "a sliding one"
                                             : "a full one");
}

static ember_status resolve_gemma4(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    if (!p->head_dim_swa && p->n_embd % p->n_head != 0)
        return ember_error_set(
            err, EMBER_ERR_ARG,
            "tiny model: hidden %lld is not a multiple of %lld heads (give the sliding layers' head size)",
            (long long)p->n_embd, (long long)p->n_head);
    s->hd_swa = p->head_dim_swa ? p->head_dim_swa : p->n_embd / p->n_head;
    s->hd = p->head_dim ? p->head_dim : 2 * s->hd_swa;
    s->n_head_kv_full = p->n_head_kv_full ? p->n_head_kv_full : s->n_head_kv % 2 ? s->n_head_kv : s->n_head_kv / 2;
    s->base_swa = p->rope_base_swa > 0 ? p->rope_base_swa : 10000.0f;
    s->window = p->sliding_window ? p->sliding_window : 8;
    s->ple = p->ple_dim < 0 ? 32 : p->ple_dim;
    s->softcap = p->softcap < 0 ? 30.0f : p->softcap;
    ember_status st = resolve_gemma4_pattern(p, s, err);
    return st != EMBER_OK ? st : resolve_gemma4_shared(p, s, err);
}

static ember_status check_heads(int64_t n_head, int64_t n_kv, const char *which, ember_error *err) {
    if (n_kv < 1 || n_head % n_kv)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: %lld heads are not a multiple of %lld KV heads%s",
                               (long long)n_head, (long long)n_kv, which);
    return EMBER_OK;
}

static ember_status check_head_size(int64_t hd, const char *which, ember_error *err) {
    if (hd < 2 || hd % 2 || hd > 1024)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: %shead size %lld must be even and in 2..1024", which,
                               (long long)hd);
    return EMBER_OK;
}

static ember_status check_params(const ember_tiny_model_params *p, const shape *s, ember_error *err) {
    ember_status st;
    const bool gemma = s->fam->gemma_layout;
    if ((st = check_heads(p->n_head, s->n_head_kv, gemma ? " (sliding layers)" : "", err))) return st;
    if ((st = check_head_size(s->hd, gemma ? "full layers' " : "", err))) return st;
    if (gemma) {
        if ((st = check_heads(p->n_head, s->n_head_kv_full, " (full layers)", err))) return st;
        if ((st = check_head_size(s->hd_swa, "sliding layers' ", err))) return st;
    }
    const int64_t blk = dtype_block(p->dtype);
    char spelled[DTYPE_CHARS];
    if (blk > 1) {
        bool ok = p->n_embd % blk == 0 && p->n_ff % blk == 0 && (p->n_head * s->hd) % blk == 0;
        if (gemma) ok = ok && (p->n_head * s->hd_swa) % blk == 0 && s->ple % blk == 0;
        if (!ok)
            return ember_error_set(err, EMBER_ERR_ARG,
                                   gemma
                                       ? "tiny model: %s needs hidden, ff, heads*head_size (both kinds) and the "
                                         "per-layer input width to be multiples of %lld"
                                       : "tiny model: %s needs hidden, ff and heads*head_size to be multiples of %lld",
                                   dtype_spelling(p->dtype, spelled, sizeof spelled), (long long)blk);
    }
    if (p->tokenizer && p->n_vocab < EMBER_TINY_TOKENIZER_MIN_VOCAB)
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: the embedded tokenizer needs a vocabulary of >= %d",
                               EMBER_TINY_TOKENIZER_MIN_VOCAB);
    return EMBER_OK;
}

/* ---- building -------------------------------------------------------------------------------- */

/* The type of the matrix `name`: its tensor_types entry's, else the dtype. */
static ember_type matrix_type(builder *b, const char *name) {
    const size_t len = strlen(name);
    for (int i = 0; b->p->tensor_types && b->p->tensor_types[i]; i++) {
        const char *e = b->p->tensor_types[i];
        if (strncmp(e, name, len) == 0 && e[len] == '=') {
            b->used[i] = true;
            return b->types[i];
        }
    }
    return b->p->dtype;
}

/* Each tensor_types entry is NAME=TYPE with a known TYPE: their types into b->types. */
static ember_status parse_tensor_types(builder *b, int n, ember_error *err) {
    for (int i = 0; i < n; i++) {
        const char *e = b->p->tensor_types[i], *eq = strchr(e, '=');
        if (!eq || eq == e || !ember_tiny_model_parse_dtype(eq + 1, &b->types[i])) {
            char list[128];
            ember_tiny_model_dtype_list(list, sizeof list);
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "tiny model: tensor type '%s' is not NAME=TYPE with TYPE one of %s", e, list);
        }
    }
    return EMBER_OK;
}

/* Fills b->buf with n values mean + std * N(0,1) from the tensor's own stream. */
static void fill_random(builder *b, const char *name, int64_t n, float mean, float std) {
    uint64_t st = tensor_stream(b->p->seed, name);
    for (int64_t i = 0; i < n; i++) b->buf[i] = mean + std * (float)normal(&st);
}

/* Adds b->buf as a tensor: vectors (ne1 == 1) are f32; matrices use the dtype. */
static void add_buf(builder *b, const char *name, int64_t ne0, int64_t ne1) {
    const int64_t ne[2] = {ne0, ne1};
    if (ne1 == 1) ember_gguf_writer_add_tensor(b->w, name, EMBER_TYPE_F32, 1, ne, b->buf);
    else ember_gguf_writer_add_tensor(b->w, name, matrix_type(b, name), 2, ne, b->buf);
}

/* A tensor of values mean + std * N(0,1). */
static void add_random(builder *b, const char *name, int64_t ne0, int64_t ne1, float mean, float std) {
    fill_random(b, name, ne0 * ne1, mean, std);
    add_buf(b, name, ne0, ne1);
}

/* LLaMA-3's frequency factors: 1 for short wavelengths, `factor` for long ones, smooth between. */
static void add_rope_freqs_llama3(builder *b, int64_t n_rot, float base) {
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

/* Proportional RoPE as Gemma 4's full layers use it: a quarter of the pairs (the fastest ones, at
 * least one) rotate as usual; the others get a factor so large that their angle stays 0. */
static void add_rope_freqs_partial(builder *b, int64_t n_rot) {
    const int64_t pairs = n_rot / 2, rotating = pairs / 4 > 0 ? pairs / 4 : 1;
    for (int64_t i = 0; i < pairs; i++) b->buf[i] = i < rotating ? 1.0f : 1e30f;
    const int64_t ne[1] = {pairs};
    ember_gguf_writer_add_tensor(b->w, "rope_freqs.weight", EMBER_TYPE_F32, 1, ne, b->buf);
}

static uint32_t file_type(ember_type t) {
    switch (t) { /* llama.cpp's LLAMA_FTYPE numbers (the K-quants: the _S mixes, the closest to one type) */
    case EMBER_TYPE_F32: return 0;
    case EMBER_TYPE_F16: return 1;
    case EMBER_TYPE_Q4_0: return 2;
    case EMBER_TYPE_Q4_1: return 3;
    case EMBER_TYPE_Q8_0: return 7;
    case EMBER_TYPE_Q5_0: return 8;
    case EMBER_TYPE_Q5_1: return 9;
    case EMBER_TYPE_Q2_K: return 10;
    case EMBER_TYPE_Q3_K: return 11;
    case EMBER_TYPE_Q4_K: return 14;
    case EMBER_TYPE_Q5_K: return 16;
    case EMBER_TYPE_Q6_K: return 18;
    case EMBER_TYPE_BF16: return 32;
    default: return 0;
    }
}

/* general.* and the size keys every family has, in llama.cpp's order. */
static void add_common_metadata(const ember_tiny_model_params *p, const shape *s, ember_gguf_writer *w) {
    char key[160], name[96], spelled[DTYPE_CHARS];
    ember_gguf_writer_set_string(w, "general.architecture", s->arch);
    snprintf(name, sizeof name, "tiny-%s-%s-seed%llu", s->fam->label ? s->fam->label : s->arch,
             dtype_spelling(p->dtype, spelled, sizeof spelled), (unsigned long long)p->seed);
    ember_gguf_writer_set_string(w, "general.name", name);
    ember_gguf_writer_set_u32(w, "general.alignment", 32);
    ember_gguf_writer_set_u32(w, "general.file_type", file_type(p->dtype));
    if (dtype_block(p->dtype) > 1) ember_gguf_writer_set_u32(w, "general.quantization_version", 2);
    snprintf(key, sizeof key, "%s.vocab_size", s->arch);
    ember_gguf_writer_set_u32(w, key, (uint32_t)p->n_vocab);
    snprintf(key, sizeof key, "%s.context_length", s->arch);
    ember_gguf_writer_set_u32(w, key, (uint32_t)p->n_ctx);
    snprintf(key, sizeof key, "%s.embedding_length", s->arch);
    ember_gguf_writer_set_u32(w, key, (uint32_t)p->n_embd);
    snprintf(key, sizeof key, "%s.block_count", s->arch);
    ember_gguf_writer_set_u32(w, key, (uint32_t)p->n_layer);
}

/* ---- llama / qwen3 / qwen2 ---- */

static void metadata_llama(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s) {
    char key[160];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
    ember_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff);
    ember_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head);
    ember_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    /* Qwen3 files always say their head size (it is not hidden/heads in the real models). */
    if (s->fam->head_size_key || s->hd != p->n_embd / p->n_head) {
        ember_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)s->hd);
        ember_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)s->hd);
    }
    ember_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)s->hd);
    ember_gguf_writer_set_f32(w, KEY("rope.freq_base"), s->base);
    ember_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->fam->norm_eps);
#undef KEY
}

static void tensors_llama(builder *b, const shape *s) {
    const ember_tiny_model_params *p = b->p;
    const int64_t hd = s->hd, q_dim = p->n_head * hd, kv_dim = s->n_head_kv * hd;
    const float s_embd = 1.0f / sqrtf((float)p->n_embd), s_q = 1.0f / sqrtf((float)q_dim),
                s_ff = 1.0f / sqrtf((float)p->n_ff);
    char name[96];
    add_random(b, "token_embd.weight", p->n_embd, p->n_vocab, 0.0f, 0.35f);
    if (s->rope_freqs) add_rope_freqs_llama3(b, hd, s->base);
    for (int64_t l = 0; l < p->n_layer; l++) {
#define T(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
        const bool olmo = s->fam->olmo_norms;
        if (!olmo) add_random(b, T("attn_norm.weight"), p->n_embd, 1, 1.0f, 0.1f);
        add_random(b, T("attn_q.weight"), p->n_embd, q_dim, 0.0f, s_embd);
        if (s->fam->qkv_bias) add_random(b, T("attn_q.bias"), q_dim, 1, 0.0f, 0.1f);
        add_random(b, T("attn_k.weight"), p->n_embd, kv_dim, 0.0f, s_embd);
        if (s->fam->qkv_bias) add_random(b, T("attn_k.bias"), kv_dim, 1, 0.0f, 0.1f);
        add_random(b, T("attn_v.weight"), p->n_embd, kv_dim, 0.0f, s_embd);
        if (s->fam->qkv_bias) add_random(b, T("attn_v.bias"), kv_dim, 1, 0.0f, 0.1f);
        add_random(b, T("attn_output.weight"), q_dim, p->n_embd, 0.0f, s_q);
        if (s->fam->qk_norm || olmo) {
            add_random(b, T("attn_q_norm.weight"), olmo ? q_dim : hd, 1, 1.0f, 0.1f);
            add_random(b, T("attn_k_norm.weight"), olmo ? kv_dim : hd, 1, 1.0f, 0.1f);
        }
        if (olmo) add_random(b, T("post_attention_norm.weight"), p->n_embd, 1, 1.0f, 0.1f);
        else add_random(b, T("ffn_norm.weight"), p->n_embd, 1, 1.0f, 0.1f);
        if (s->fam->moe) {
            add_experts(b, s, l);
            continue;
        }
        add_random(b, T("ffn_gate.weight"), p->n_embd, p->n_ff, 0.0f, s_embd);
        add_random(b, T("ffn_up.weight"), p->n_embd, p->n_ff, 0.0f, s_embd);
        add_random(b, T("ffn_down.weight"), p->n_ff, p->n_embd, 0.0f, s_ff);
        if (olmo) add_random(b, T("post_ffw_norm.weight"), p->n_embd, 1, 1.0f, 0.1f);
#undef T
    }
    add_random(b, "output_norm.weight", p->n_embd, 1, 1.0f, 0.1f);
    if (!s->tied) add_random(b, "output.weight", p->n_embd, p->n_vocab, 0.0f, 0.35f);
}

/* ---- qwen3moe ---- */

static void metadata_moe(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s) {
    metadata_llama(w, p, s);
    ember_gguf_writer_set_u32(w, "qwen3moe.expert_count", (uint32_t)s->n_expert);
    ember_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", (uint32_t)s->n_expert_used);
    ember_gguf_writer_set_u32(w, "qwen3moe.expert_feed_forward_length", (uint32_t)s->n_ff_exp);
}

/* The router and the stacked experts of layer l (llama.cpp's layout: expert e is the e-th slab). */
static void add_experts(builder *b, const shape *s, int64_t l) {
    const ember_tiny_model_params *p = b->p;
    const int64_t d = p->n_embd, f = s->n_ff_exp, E = s->n_expert;
    char name[96];
#define T(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
    /* the router stays f32, as in converted files (llama-quantize never quantizes it) */
    fill_random(b, T("ffn_gate_inp.weight"), d * E, 0.0f, 3.0f / sqrtf((float)d));
    ember_gguf_writer_add_tensor(b->w, name, EMBER_TYPE_F32, 2, (const int64_t[]){d, E}, b->buf);
    const struct {
        const char *suffix;
        int64_t ne0, ne1;
        float std;
    } stacks[] = {{"ffn_gate_exps.weight", d, f, 1.0f / sqrtf((float)d)},
                  {"ffn_up_exps.weight", d, f, 1.0f / sqrtf((float)d)},
                  {"ffn_down_exps.weight", f, d, 1.0f / sqrtf((float)f)}};
    for (size_t i = 0; i < sizeof stacks / sizeof stacks[0]; i++) {
        snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, stacks[i].suffix);
        const int64_t ne[3] = {stacks[i].ne0, stacks[i].ne1, E};
        fill_random(b, name, ne[0] * ne[1] * E, 0.0f, stacks[i].std);
        ember_gguf_writer_add_tensor(b->w, name, p->dtype, 3, ne, b->buf);
    }
#undef T
}

/* ---- phi3 ---- */

/* The llama keys; with LongRoPE factors an original context of a sixteenth of the context, so that
 * a session longer than that uses the long factors (llama.cpp's choice, and ember's); the window. */
static void metadata_phi3(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s) {
    metadata_llama(w, p, s);
    const int64_t orig = p->n_ctx / 16 > 0 ? p->n_ctx / 16 : 1;
    if (s->rope_freqs) ember_gguf_writer_set_u32(w, "phi3.rope.scaling.original_context_length", (uint32_t)orig);
    if (p->rope_attn_factor != 0) ember_gguf_writer_set_f32(w, "phi3.rope.scaling.attn_factor", p->rope_attn_factor);
    if (s->window > 0) ember_gguf_writer_set_u32(w, "phi3.attention.sliding_window", (uint32_t)s->window);
}

/* LongRoPE's factors, divisors of each pair's frequency: short ones from 1 to 1.5, long ones rising
 * from 1 to 16 with the wavelength (as the real ones do). */
static void add_rope_factors(builder *b, int64_t n_rot) {
    const int64_t pairs = n_rot / 2, ne[1] = {pairs};
    for (int64_t i = 0; i < pairs; i++) b->buf[i] = 1.0f + 0.5f * (float)i / (float)pairs;
    ember_gguf_writer_add_tensor(b->w, "rope_factors_short.weight", EMBER_TYPE_F32, 1, ne, b->buf);
    for (int64_t i = 0; i < pairs; i++) b->buf[i] = 1.0f + 15.0f * (float)(i * i) / (float)(pairs * pairs);
    ember_gguf_writer_add_tensor(b->w, "rope_factors_long.weight", EMBER_TYPE_F32, 1, ne, b->buf);
}

static void tensors_phi3(builder *b, const shape *s) {
    const ember_tiny_model_params *p = b->p;
    const int64_t d = p->n_embd, kv_dim = s->n_head_kv * s->hd;
    const float s_embd = 1.0f / sqrtf((float)d), s_ff = 1.0f / sqrtf((float)p->n_ff);
    char name[96];
    add_random(b, "token_embd.weight", d, p->n_vocab, 0.0f, 0.35f);
    if (s->rope_freqs) add_rope_factors(b, s->hd);
    for (int64_t l = 0; l < p->n_layer; l++) {
#define T(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
        add_random(b, T("attn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("attn_qkv.weight"), d, d + 2 * kv_dim, 0.0f, s_embd);
        add_random(b, T("attn_output.weight"), d, d, 0.0f, s_embd);
        add_random(b, T("ffn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("ffn_up.weight"), d, 2 * p->n_ff, 0.0f, s_embd);
        add_random(b, T("ffn_down.weight"), p->n_ff, d, 0.0f, s_ff);
#undef T
    }
    add_random(b, "output_norm.weight", d, 1, 1.0f, 0.1f);
    add_random(b, "output.weight", d, p->n_vocab, 0.0f, 0.35f);
}

/* ---- gemma4 ---- */

/* The layers from kv_from on read an earlier layer's KV cache and have a double-width MLP (as the
 * KV-sharing layers of the small Gemma models do). */
static int64_t gemma4_ff(const ember_tiny_model_params *p, const shape *s, int64_t l) {
    return l >= p->n_layer - s->shared ? 2 * p->n_ff : p->n_ff;
}

static void metadata_gemma4(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s) {
    char key[160];
    uint32_t ff[MAX_LAYERS], kv_heads[MAX_LAYERS];
    uint8_t pattern[MAX_LAYERS];
    for (int64_t l = 0; l < p->n_layer; l++) {
        ff[l] = (uint32_t)gemma4_ff(p, s, l);
        kv_heads[l] = (uint32_t)(s->sliding[l] ? s->n_head_kv : s->n_head_kv_full);
        pattern[l] = s->sliding[l];
    }
    const uint64_t n = (uint64_t)p->n_layer;
#define KEY(suffix) (snprintf(key, sizeof key, "gemma4." suffix), key)
    ember_gguf_writer_set_array(w, KEY("feed_forward_length"), GGUF_TYPE_UINT32, ff, n);
    ember_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head);
    ember_gguf_writer_set_array(w, KEY("attention.head_count_kv"), GGUF_TYPE_UINT32, kv_heads, n);
    ember_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)s->hd);
    ember_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)s->hd);
    ember_gguf_writer_set_u32(w, KEY("attention.key_length_swa"), (uint32_t)s->hd_swa);
    ember_gguf_writer_set_u32(w, KEY("attention.value_length_swa"), (uint32_t)s->hd_swa);
    ember_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)s->hd);
    ember_gguf_writer_set_u32(w, KEY("rope.dimension_count_swa"), (uint32_t)s->hd_swa);
    ember_gguf_writer_set_f32(w, KEY("rope.freq_base"), s->base);
    ember_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), s->base_swa);
    ember_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    ember_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)s->window);
    ember_gguf_writer_set_array(w, KEY("attention.sliding_window_pattern"), GGUF_TYPE_BOOL, pattern, n);
    ember_gguf_writer_set_u32(w, KEY("attention.shared_kv_layers"), (uint32_t)s->shared);
    if (s->ple > 0) ember_gguf_writer_set_u32(w, KEY("embedding_length_per_layer_input"), (uint32_t)s->ple);
    if (s->softcap > 0) ember_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), s->softcap);
#undef KEY
}

static void tensors_gemma4(builder *b, const shape *s) {
    const ember_tiny_model_params *p = b->p;
    const int64_t d = p->n_embd, ple = s->ple, kv_from = p->n_layer - s->shared;
    const float s_embd = 1.0f / sqrtf((float)d);
    char name[96];
    add_random(b, "token_embd.weight", d, p->n_vocab, 0.0f, 0.35f);
    if (ple > 0) {
        add_random(b, "per_layer_token_embd.weight", p->n_layer * ple, p->n_vocab, 0.0f, 1.0f / sqrtf((float)ple));
        add_random(b, "per_layer_model_proj.weight", d, p->n_layer * ple, 0.0f, s_embd);
        add_random(b, "per_layer_proj_norm.weight", ple, 1, 1.0f, 0.1f);
    }
    if (s->rope_freqs) add_rope_freqs_partial(b, s->hd);
    for (int64_t l = 0; l < p->n_layer; l++) {
        const bool sliding = s->sliding[l];
        const int64_t hd = sliding ? s->hd_swa : s->hd, q_dim = p->n_head * hd,
                      kv_dim = (sliding ? s->n_head_kv : s->n_head_kv_full) * hd, ff = gemma4_ff(p, s, l);
#define T(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
        add_random(b, T("attn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("attn_q.weight"), d, q_dim, 0.0f, s_embd);
        if (l < kv_from) { /* shared-KV layers have no K/V of their own */
            add_random(b, T("attn_k.weight"), d, kv_dim, 0.0f, s_embd);
            if (sliding) add_random(b, T("attn_v.weight"), d, kv_dim, 0.0f, s_embd); /* full: V = K */
            add_random(b, T("attn_k_norm.weight"), hd, 1, 0.5f, 0.05f);
        }
        /* The attention scale is 1: queries and keys of RMS 0.5 give scores of std sqrt(hd)/4,
         * about 1, as 1/sqrt(hd) does for unit ones. */
        add_random(b, T("attn_q_norm.weight"), hd, 1, 0.5f, 0.05f);
        add_random(b, T("attn_output.weight"), q_dim, d, 0.0f, 1.0f / sqrtf((float)q_dim));
        add_random(b, T("post_attention_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("ffn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("ffn_gate.weight"), d, ff, 0.0f, s_embd);
        add_random(b, T("ffn_up.weight"), d, ff, 0.0f, s_embd);
        add_random(b, T("ffn_down.weight"), ff, d, 0.0f, 1.0f / sqrtf((float)ff));
        add_random(b, T("post_ffw_norm.weight"), d, 1, 1.0f, 0.1f);
        if (ple > 0) {
            add_random(b, T("inp_gate.weight"), d, ple, 0.0f, s_embd);
            add_random(b, T("proj.weight"), ple, d, 0.0f, 1.0f / sqrtf((float)ple));
            add_random(b, T("post_norm.weight"), d, 1, 1.0f, 0.1f);
        }
        /* Around 0.5, so the scaled input embedding fades through the layers: with the tied head
         * it would otherwise make each token predict itself. */
        add_random(b, T("layer_output_scale.weight"), 1, 1, 0.5f, 0.1f);
#undef T
    }
    add_random(b, "output_norm.weight", d, 1, 1.0f, 0.1f);
    if (!s->tied) add_random(b, "output.weight", d, p->n_vocab, 0.0f, 0.35f);
}

/* ---- gemma2 / gemma3 ---- */

/* One head size (hidden / heads unless given) for all layers; the sliding ones every layer but each
 * period's last; window 8, and the gemma2 softcaps (which llama.cpp always applies: > 0). */
static ember_status resolve_gemma23(const ember_tiny_model_params *p, shape *s, ember_error *err) {
    ember_status st = resolve_plain(p, s, err);
    if (st != EMBER_OK) return st;
    const int64_t period = s->fam->swa_period;
    s->window = p->sliding_window ? p->sliding_window : 8;
    for (int64_t l = 0; l < p->n_layer; l++) s->sliding[l] = l % period < period - 1;
    s->base_swa = p->rope_base_swa > 0 ? p->rope_base_swa : 10000.0f;
    s->rope_scale = p->rope_scale;
    s->softcap = p->softcap < 0 ? 0.0f : p->softcap; /* gemma3: a final softcap only when asked for */
    if (s->fam->softcaps) {
        s->softcap = p->softcap < 0 ? 30.0f : p->softcap;
        s->attn_softcap = p->attn_softcap < 0 ? 50.0f : p->attn_softcap;
        if (s->softcap <= 0 || s->attn_softcap <= 0)
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "tiny model: gemma2's softcaps must be > 0 (llama.cpp always "
                                   "applies both)");
    }
    if (p->rope_scale < 0 || (p->rope_scale > 0 && p->rope_scale < 1))
        return ember_error_set(err, EMBER_ERR_ARG, "tiny model: the RoPE scaling factor %g must be 0 (none) or >= 1",
                               (double)p->rope_scale);
    return EMBER_OK;
}

/* The keys llama.cpp's converter writes for Gemma 2 / Gemma 3 (no rope.dimension_count: the head
 * size; Gemma 2 no rope.freq_base: 10000). */
static void metadata_gemma23(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s) {
    char key[160];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
    ember_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff);
    ember_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head);
    ember_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), s->fam->norm_eps);
    ember_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)s->hd);
    ember_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)s->hd);
    if (s->fam->softcaps) ember_gguf_writer_set_f32(w, KEY("attn_logit_softcapping"), s->attn_softcap);
    if (s->softcap > 0) ember_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), s->softcap);
    if (s->base != 10000.0f || s->fam->swa_rope_own) ember_gguf_writer_set_f32(w, KEY("rope.freq_base"), s->base);
    if (s->fam->swa_rope_own && s->base_swa != 10000.0f)
        ember_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), s->base_swa);
    ember_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)s->window);
    ember_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    if (s->rope_scale > 0) {
        ember_gguf_writer_set_string(w, KEY("rope.scaling.type"), "linear");
        ember_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), s->rope_scale);
    }
#undef KEY
}

static void tensors_gemma23(builder *b, const shape *s) {
    const ember_tiny_model_params *p = b->p;
    const int64_t d = p->n_embd, hd = s->hd, q_dim = p->n_head * hd, kv_dim = s->n_head_kv * hd;
    const float s_embd = 1.0f / sqrtf((float)d);
    const bool qk_norm = s->fam->qk_norm; /* gemma3 */
    char name[96];
    /* The head is the embedding, and the input is it times sqrt(hidden): a smaller embedding and
     * post-norms of about 2 keep a token's own logit from dominating (each block adds std ~2). */
    add_random(b, "token_embd.weight", d, p->n_vocab, 0.0f, 0.08f);
    for (int64_t l = 0; l < p->n_layer; l++) {
#define T(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
        add_random(b, T("attn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("attn_q.weight"), d, q_dim, 0.0f, s_embd);
        add_random(b, T("attn_k.weight"), d, kv_dim, 0.0f, s_embd);
        add_random(b, T("attn_v.weight"), d, kv_dim, 0.0f, s_embd);
        add_random(b, T("attn_output.weight"), q_dim, d, 0.0f, 1.0f / sqrtf((float)q_dim));
        if (qk_norm) {
            add_random(b, T("attn_q_norm.weight"), hd, 1, 1.0f, 0.1f);
            add_random(b, T("attn_k_norm.weight"), hd, 1, 1.0f, 0.1f);
        }
        add_random(b, T("post_attention_norm.weight"), d, 1, 2.0f, 0.2f);
        add_random(b, T("ffn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("ffn_gate.weight"), d, p->n_ff, 0.0f, s_embd);
        add_random(b, T("ffn_up.weight"), d, p->n_ff, 0.0f, s_embd);
        add_random(b, T("ffn_down.weight"), p->n_ff, d, 0.0f, 1.0f / sqrtf((float)p->n_ff));
        add_random(b, T("post_ffw_norm.weight"), d, 1, 2.0f, 0.2f);
#undef T
    }
    add_random(b, "output_norm.weight", d, 1, 1.0f, 0.1f);
    if (!s->tied) add_random(b, "output.weight", d, p->n_vocab, 0.0f, 0.35f);
}

/* ---- gpt2 ---- */

static void metadata_gpt2(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s) {
    (void)s;
    ember_gguf_writer_set_u32(w, "gpt2.feed_forward_length", (uint32_t)p->n_ff);
    ember_gguf_writer_set_u32(w, "gpt2.attention.head_count", (uint32_t)p->n_head);
    ember_gguf_writer_set_f32(w, "gpt2.attention.layer_norm_epsilon", 1e-5f);
}

static void tensors_gpt2(builder *b, const shape *s) {
    const ember_tiny_model_params *p = b->p;
    const int64_t d = p->n_embd, ff = p->n_ff;
    const float s_embd = 1.0f / sqrtf((float)d);
    const double gelu_mean = 0.28209479177387814; /* 1 / (2 sqrt(pi)) */
    char name[96];
    add_random(b, "token_embd.weight", d, p->n_vocab, 0.0f, 0.35f);
    if (s->fam->rope_base == 0) add_random(b, "position_embd.weight", d, p->n_ctx, 0.0f, 0.1f); /* gpt2 */
    for (int64_t l = 0; l < p->n_layer; l++) {
#define T(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
        add_random(b, T("attn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("attn_norm.bias"), d, 1, 0.0f, 0.1f);
        /* Q and K rows twice as wide as V's (attention scores of std ~4, not ~1): each position
         * attends to a few others rather than to the average of the context, which otherwise
         * swamps the current token and settles greedy output on one token. */
        fill_random(b, T("attn_qkv.weight"), 3 * d * d, 0.0f, s_embd);
        for (int64_t i = 0; i < 2 * d * d; i++) b->buf[i] *= 2.0f;
        add_buf(b, name, d, 3 * d);
        add_random(b, T("attn_qkv.bias"), 3 * d, 1, 0.0f, 0.1f);
        add_random(b, T("attn_output.weight"), d, d, 0.0f, s_embd);
        add_random(b, T("attn_output.bias"), d, 1, 0.0f, 0.1f);
        add_random(b, T("ffn_norm.weight"), d, 1, 1.0f, 0.1f);
        add_random(b, T("ffn_norm.bias"), d, 1, 0.0f, 0.1f);
        add_random(b, T("ffn_up.weight"), d, ff, 0.0f, s_embd);
        add_random(b, T("ffn_up.bias"), ff, 1, 0.0f, 0.1f);
        /* The bias cancels GELU's mean output (E[gelu(z)] = 1/(2 sqrt(pi)) for z ~ N(0, 1)): without it
         * every token's MLP adds the same offset and greedy output settles on one token. */
        add_random(b, T("ffn_down.weight"), ff, d, 0.0f, 1.0f / sqrtf((float)ff));
        float *bias = b->buf + ff * d; /* the spare row after the weights */
        for (int64_t i = 0; i < d; i++) {
            double sum = 0;
            for (int64_t j = 0; j < ff; j++) sum += b->buf[i * ff + j];
            bias[i] = (float)(-gelu_mean * sum);
        }
        const int64_t ne[1] = {d};
        ember_gguf_writer_add_tensor(b->w, T("ffn_down.bias"), EMBER_TYPE_F32, 1, ne, bias);
#undef T
    }
    add_random(b, "output_norm.weight", d, 1, 1.0f, 0.1f);
    add_random(b, "output_norm.bias", d, 1, 0.0f, 0.1f);
    if (!s->tied) add_random(b, "output.weight", d, p->n_vocab, 0.0f, 0.35f);
}

/* ---- gptneox (the tensors are gpt2's, above) ---- */

/* Pythia's: RoPE on a quarter of each head (rotary_pct 0.25, even), the parallel residual (unless
 * sequential_residual: use_parallel_residual = false, as GPT-NeoX configs may set). */
static void metadata_gptneox(ember_gguf_writer *w, const ember_tiny_model_params *p, const shape *s) {
    ember_gguf_writer_set_u32(w, "gptneox.feed_forward_length", (uint32_t)p->n_ff);
    ember_gguf_writer_set_u32(w, "gptneox.attention.head_count", (uint32_t)p->n_head);
    ember_gguf_writer_set_u32(w, "gptneox.rope.dimension_count", (uint32_t)(s->hd / 4 / 2 * 2));
    ember_gguf_writer_set_f32(w, "gptneox.rope.freq_base", s->base);
    ember_gguf_writer_set_f32(w, "gptneox.attention.layer_norm_epsilon", 1e-5f);
    ember_gguf_writer_set_bool(w, "gptneox.use_parallel_residual", !p->sequential_residual);
}

/* ---- all families ---- */

/* Values in the largest tensor the model has. */
static int64_t largest_tensor(const ember_tiny_model_params *p, const shape *s) {
    const int64_t d = p->n_embd;
    int64_t sizes[] = {
        p->n_vocab * d,                   /* token_embd, output */
        p->n_head * s->hd * d,            /* attn_q, attn_output */
        p->n_head * s->hd_swa * d,        /* gemma4's sliding layers */
        2 * p->n_ff * d,                  /* MLP (gemma4's double width) */
        3 * d * d,                        /* gpt2's attn_qkv */
        p->n_ctx * d,                     /* gpt2's position_embd */
        p->n_vocab * p->n_layer * s->ple, /* gemma4's per_layer_token_embd */
        d * p->n_layer * s->ple,          /* gemma4's per_layer_model_proj */
        s->hd,                            /* rope_freqs */
        s->n_expert * s->n_ff_exp * d,    /* qwen3moe's stacked experts */
    };
    int64_t biggest = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) biggest = sizes[i] > biggest ? sizes[i] : biggest;
    return biggest;
}

/* The tensors of the model into w, with the tensor_types entries checked and each one used. */
static ember_status build_tensors(const ember_tiny_model_params *p, const shape *s, ember_gguf_writer *w,
                                  ember_error *err) {
    int n = 0;
    while (p->tensor_types && p->tensor_types[n]) n++;
    builder b = {.p = p,
                 .w = w,
                 .buf = malloc((size_t)(largest_tensor(p, s) + p->n_embd) * sizeof(float)),
                 .used = calloc((size_t)n + 1, sizeof(bool)),
                 .types = calloc((size_t)n + 1, sizeof(ember_type))};
    ember_status st = !b.buf || !b.used || !b.types ? ember_error_set(err, EMBER_ERR_NOMEM, "tiny model: out of memory")
                                                    : parse_tensor_types(&b, n, err);
    if (st == EMBER_OK) {
        s->fam->tensors(&b, s);
        st = ember_gguf_writer_status(w, err);
    }
    for (int i = 0; st == EMBER_OK && i < n; i++)
        if (!b.used[i])
            st = ember_error_set(err, EMBER_ERR_ARG, "tiny model: tensor type '%s' names no 2-D weight of the model",
                                 p->tensor_types[i]);
    free(b.buf);
    free(b.used);
    free(b.types);
    return st;
}

ember_status ember_tiny_model_build(const ember_tiny_model_params *p, ember_gguf_writer *w, ember_error *err) {
    shape *s = malloc(sizeof *s);
    if (!s) return ember_error_set(err, EMBER_ERR_NOMEM, "tiny model: out of memory");
    ember_status st = resolve(p, s, err);
    if (st == EMBER_OK) st = check_params(p, s, err);
    if (st != EMBER_OK) {
        free(s);
        return st;
    }

    add_common_metadata(p, s, w);
    s->fam->metadata(w, p, s);
    if (p->tokenizer) {
        st = ember_tiny_tokenizer_build(w, p->n_vocab, s->fam->pre, s->fam->add_bos, err);
        if (st != EMBER_OK) {
            free(s);
            return st;
        }
    }

    st = build_tensors(p, s, w, err);
    free(s);
    return st;
}

ember_status ember_tiny_model_write(const ember_tiny_model_params *p, const char *path, ember_error *err) {
    ember_gguf_writer *w = ember_gguf_writer_new();
    if (!w) return ember_error_set(err, EMBER_ERR_NOMEM, "tiny model: out of memory");
    ember_status st = ember_tiny_model_build(p, w, err);
    if (st == EMBER_OK) st = ember_gguf_writer_write(w, path, err);
    ember_gguf_writer_free(w);
    return st;
}
