/* make_tiny_model_main.c — the `make-tiny-model` command: writes a deterministic random-weight model.
 * Only argument parsing lives here; tiny_model.c builds the file. */
#include "ember_tiny_model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Creates the directories leading to the file `path` (like mkdir -p of its dirname), so that
 * --out DIR/x.gguf works for a DIR that is not there yet. Returns false with a message printed. */
static bool make_parent_dirs(const char *path) {
    char *dir = strdup(path);
    if (!dir) return false;
    char *slash = strrchr(dir, '/');
    bool ok = true;
    if (slash && slash != dir) {
        *slash = '\0';
        for (char *p = dir + 1; ok; p++) {
            if (*p != '/' && *p != '\0') continue;
            char c = *p;
            *p = '\0';
            if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
                fprintf(stderr, "make-tiny-model: --out %s: cannot create directory '%s': %s\n", path, dir,
                        strerror(errno));
                ok = false;
            }
            *p = c;
            if (c == '\0') break;
        }
    }
    free(dir);
    return ok;
}

/* The names of a NULL-ended list joined by '|' into buf (the usage line's alternatives). */
static void join_names(char *buf, size_t cap, const char *(*name)(int i)) {
    buf[0] = '\0';
    for (int i = 0; name(i); i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s%s", i ? "|" : "", name(i));
    }
}

static const char *shape_name(int i) { return ember_tiny_model_shapes[i]; }

static void usage(FILE *f) {
    char families[256], shapes[256];
    join_names(families, sizeof families, ember_tiny_model_family);
    join_names(shapes, sizeof shapes, shape_name);
    fprintf(f, "usage: make-tiny-model --family %s --dtype T --out FILE\n", families);
    fprintf(f, "       make-tiny-model --shape %s --out FILE [--dtype T] [...]\n", shapes);
    fprintf(f, "                       [--seed N] [--layers N] [--hidden N] [--heads N] [--kv-heads N]\n"
               "                       [--head-dim N] [--ff N] [--vocab N] [--context N] [--rope-base X]\n"
               "                       [--rope-freqs | --no-rope-freqs] [--tied | --untied] [--[no-]tokenizer]\n"
               "                       [--tensor-type NAME=TYPE]... (that 2-D weight in TYPE instead of --dtype)\n"
               "  gemma4 only:         [--window N] [--swa-pattern SSSFSF] [--shared-kv N] [--ple N]\n"
               "                       [--head-dim-swa N] [--kv-heads-full N] [--rope-base-swa X] [--softcap X]\n"
               "  gemma2 only:         [--window N] [--softcap X] [--attn-softcap X]\n"
               "  phi3 only:           [--window N] [--rope-attn-factor X]\n"
               "  qwen3moe only:       [--experts N] [--experts-used K] [--expert-ff N]\n"
               "  gemma3 only:         [--window N] [--softcap X] [--rope-base-swa X] [--rope-scale X]\n"
               "  gptneox only:        [--sequential-residual] (use_parallel_residual = false)\n"
               "Writes a random-weight model in llama.cpp's GGUF layout, with a small embedded byte-level\n"
               "BPE tokenizer. Defaults: 6 layers, hidden 64, 4 heads, 2 KV heads (gpt2: as many as heads),\n"
               "ff 128, vocab 512, context 256, seed 1. gemma4 defaults: pattern SSSFSF (S sliding, F full;\n"
               "every 4th and the last layer full), window 8, the last 2 layers share KV caches (double-width\n"
               "MLP), per-layer inputs 32 wide, head size 16 sliding / 32 full (--head-dim is the full\n"
               "layers'), half the KV heads on full layers, RoPE base 10000 sliding / 1000000 full,\n"
               "proportional rope_freqs, softcap 30 (0: none). gemma2 defaults: every other layer sliding\n"
               "(window 8), softcaps 50 (attention) and 30 (final), tied head; gemma3: five sliding layers\n"
               "to one global (window 8), RoPE base 10000 sliding / 1000000 global, no final softcap unless\n"
               "given, --rope-scale: linear scaling of the global layers. olmo2: norms after attention and\n"
               "MLP, full-width Q/K norms, RoPE base 500000, separate head. phi3: fused QKV and gate-up,\n"
               "separate head, --rope-freqs: LongRoPE factors (original context: context / 16), --window N:\n"
               "every layer sliding, --rope-attn-factor X: LongRoPE's attention factor. qwen3moe: 4\n"
               "experts, 2 used, expert ff = ff / 2, separate head. The same arguments always give the same\n"
               "file.\n"
               "--shape starts from a real model's hyper-parameters (random weights, q8_0, no tokenizer,\n"
               "context 4096, seed 1); any other option given with it overrides that setting (--tokenizer\n"
               "adds the embedded tokenizer, which llama.cpp needs to load the file).\n"
               "--dtype (of the 2-D weights): f32 f16 bf16 q8_0, or q4_0 q4_1 q5_0 q5_1 (rows of whole\n"
               "32-value blocks) and q2_k q3_k q4_k q5_k q6_k (hidden, ff and heads*head-dim multiples of 256,\n"
               "e.g. --hidden 256 --head-dim 64 --ff 768), quantized as llama-quantize --pure would.\n");
}

/* A whole-string integer in [lo, hi], or an error naming the option. */
static bool parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "make-tiny-model: %s needs an integer in %lld..%lld (got '%s')\n", opt, lo, hi, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

/* A whole-string number in [lo, hi] (lo excluded when `open`), or an error naming the option. */
static bool parse_float(const char *opt, const char *s, double lo, bool open, double hi, float *out) {
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || !(open ? v > lo : v >= lo) || !(v <= hi)) {
        fprintf(stderr, "make-tiny-model: %s needs a number %s %g and <= %g (got '%s')\n", opt, open ? ">" : ">=", lo,
                hi, s ? s : "");
        return false;
    }
    *out = (float)v;
    return true;
}

/* A command line as read so far. */
typedef struct {
    ember_tiny_model_params p;
    const char *out, *dtype, *shape;
    bool have_family;
    const char **tensor_types; /* (argc) the --tensor-type values, NULL-terminated */
    int n_tensor_types;
} cmdline;

/* --shape first, wherever it is: the other options then override the preset. 0, or the exit status. */
static int apply_shape(int argc, char **argv, cmdline *c) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--shape") == 0) {
            if (c->shape) {
                fprintf(stderr, "make-tiny-model: --shape given more than once\n");
                return 2;
            }
            c->shape = i + 1 < argc ? argv[i + 1] : "";
            if (!ember_tiny_model_shape(c->shape, &c->p)) {
                fprintf(stderr, "make-tiny-model: --shape must be one of");
                for (int k = 0; ember_tiny_model_shapes[k]; k++) fprintf(stderr, " %s", ember_tiny_model_shapes[k]);
                fprintf(stderr, " (got '%s')\n", c->shape);
                return 2;
            }
            i++;
        }
    return 0;
}

/* The numeric options, one row each: 1 when a is one (its value read), 0 when it is not, -1 when
 * the value is bad (the message printed). */
static int numeric_option(cmdline *c, const char *a, const char *val) {
    ember_tiny_model_params *p = &c->p;
    const struct {
        const char *opt;
        int64_t *dst;
        long long lo, hi;
    } ints[] = {
        {"--layers", &p->n_layer, 1, 1024},
        {"--hidden", &p->n_embd, 1, 65536},
        {"--heads", &p->n_head, 1, 1024},
        {"--kv-heads", &p->n_head_kv, 1, 1024},
        {"--head-dim", &p->head_dim, 2, 1024},
        {"--ff", &p->n_ff, 1, 262144},
        {"--vocab", &p->n_vocab, 1, 1000000},
        {"--context", &p->n_ctx, 1, 1 << 24},
        {"--head-dim-swa", &p->head_dim_swa, 2, 1024},
        {"--kv-heads-full", &p->n_head_kv_full, 1, 1024},
        {"--window", &p->sliding_window, 1, 1 << 24},
        {"--shared-kv", &p->shared_kv_layers, 0, 1023},
        {"--ple", &p->ple_dim, 0, 65536},
        {"--experts", &p->n_expert, 1, 1024},
        {"--experts-used", &p->n_expert_used, 1, 1024},
        {"--expert-ff", &p->n_ff_exp, 1, 65536},
    };
    const struct {
        const char *opt;
        float *dst;
        double lo;
        bool open;
        double hi;
    } floats[] = {
        {"--rope-base", &p->rope_base, 1.0, true, 1e12},   {"--rope-base-swa", &p->rope_base_swa, 1.0, true, 1e12},
        {"--softcap", &p->softcap, 0.0, false, 1e6},       {"--attn-softcap", &p->attn_softcap, 0.0, true, 1e6},
        {"--rope-scale", &p->rope_scale, 1.0, false, 1e6}, {"--rope-attn-factor", &p->rope_attn_factor, 0.0, true, 1e3},
    };
    long long v;
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if (strcmp(a, ints[k].opt) == 0) {
            if (!parse_int(a, val, ints[k].lo, ints[k].hi, &v)) return -1;
            *ints[k].dst = v;
            return 1;
        }
    for (size_t k = 0; k < sizeof floats / sizeof floats[0]; k++)
        if (strcmp(a, floats[k].opt) == 0)
            return parse_float(a, val, floats[k].lo, floats[k].open, floats[k].hi, floats[k].dst) ? 1 : -1;
    return 0;
}

/* The seed: a non-negative integer. */
static bool parse_seed(const char *val, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long s = val ? strtoull(val, &end, 10) : 0;
    if (!val || !*val || *end || errno || val[0] == '-') {
        fprintf(stderr, "make-tiny-model: --seed needs a non-negative integer (got '%s')\n", val ? val : "");
        return false;
    }
    *out = s;
    return true;
}

/* The other options: how many arguments a took (1 or 2), 0 after --help, -1 on a usage error (the
 * message printed). */
static int other_option(cmdline *c, const char *a, const char *val) {
    ember_tiny_model_params *p = &c->p;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
        usage(stdout);
        return 0;
    } else if (strcmp(a, "--shape") == 0 && val) {
        return 2; /* applied first */
    } else if (strcmp(a, "--family") == 0 && val) {
        if (c->shape && strcmp(val, p->family) != 0) {
            fprintf(stderr, "make-tiny-model: --family %s conflicts with --shape %s (a %s model)\n", val, c->shape,
                    p->family);
            return -1;
        }
        p->family = val;
        c->have_family = true;
        return 2;
    } else if (strcmp(a, "--dtype") == 0 && val) {
        c->dtype = val;
        return 2;
    } else if (strcmp(a, "--out") == 0 && val) {
        c->out = val;
        return 2;
    } else if (strcmp(a, "--tensor-type") == 0 && val) {
        c->tensor_types[c->n_tensor_types++] = val;
        p->tensor_types = c->tensor_types;
        return 2;
    } else if (strcmp(a, "--seed") == 0) {
        return parse_seed(val, &p->seed) ? 2 : -1;
    } else if (strcmp(a, "--swa-pattern") == 0 && val) {
        p->swa_pattern = val;
        return 2;
    } else if (strcmp(a, "--rope-freqs") == 0 || strcmp(a, "--no-rope-freqs") == 0) {
        p->rope_freqs = strcmp(a, "--rope-freqs") == 0;
    } else if (strcmp(a, "--sequential-residual") == 0) {
        p->sequential_residual = true;
    } else if (strcmp(a, "--tied") == 0 || strcmp(a, "--untied") == 0) {
        p->tied = strcmp(a, "--tied") == 0;
    } else if (strcmp(a, "--no-tokenizer") == 0 || strcmp(a, "--tokenizer") == 0) {
        p->tokenizer = strcmp(a, "--tokenizer") == 0; /* --tokenizer e.g. with --shape, for llama.cpp */
    } else {
        fprintf(stderr, "make-tiny-model: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return -1;
    }
    return 1;
}

static int run(int argc, char **argv, cmdline *cp) {
    cmdline c = *cp;
    int rc = apply_shape(argc, argv, &c);
    if (rc) return rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int took = numeric_option(&c, a, val);
        if (took == 1) took = 2;
        else if (took == 0) took = other_option(&c, a, val);
        if (took < 0) return 2;
        if (took == 0) return 0; /* --help */
        i += took - 1;
    }
    if (c.shape) {
        c.have_family = true;
        if (!c.dtype) c.dtype = "q8_0";
    }
    if (!c.have_family || !c.dtype || !c.out) {
        fprintf(stderr, "make-tiny-model: --family (or --shape), --dtype and --out are required\n");
        usage(stderr);
        return 2;
    }
    if (!ember_tiny_model_parse_dtype(c.dtype, &c.p.dtype)) {
        char list[128];
        ember_tiny_model_dtype_list(list, sizeof list);
        fprintf(stderr, "make-tiny-model: --dtype must be one of %s (got '%s')\n", list, c.dtype);
        return 2;
    }
    if (!make_parent_dirs(c.out)) return 1;
    ember_error err = {0};
    if (ember_tiny_model_write(&c.p, c.out, &err) != EMBER_OK) {
        fprintf(stderr, "make-tiny-model: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* The tensor-type list lives as long as the run; freed on every exit path (LeakSanitizer). */
int main(int argc, char **argv) {
    cmdline c = {0};
    ember_tiny_model_defaults(&c.p);
    c.tensor_types = calloc((size_t)argc + 1, sizeof *c.tensor_types);
    if (!c.tensor_types) return 1;
    int rc = run(argc, argv, &c);
    free(c.tensor_types);
    return rc;
}
