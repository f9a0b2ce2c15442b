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
               "  gemma4 only:         [--window N] [--swa-pattern SSSFSF] [--shared-kv N] [--ple N]\n"
               "                       [--head-dim-swa N] [--kv-heads-full N] [--rope-base-swa X] [--softcap X]\n"
               "  gemma2 only:         [--window N] [--softcap X] [--attn-softcap X]\n"
               "  gemma3 only:         [--window N] [--softcap X] [--rope-base-swa X] [--rope-scale X]\n"
               "Writes a random-weight model in llama.cpp's GGUF layout, with a small embedded byte-level\n"
               "BPE tokenizer. Defaults: 6 layers, hidden 64, 4 heads, 2 KV heads (gpt2: as many as heads),\n"
               "ff 128, vocab 512, context 256, seed 1. gemma4 defaults: pattern SSSFSF (S sliding, F full;\n"
               "every 4th and the last layer full), window 8, the last 2 layers share KV caches (double-width\n"
               "MLP), per-layer inputs 32 wide, head size 16 sliding / 32 full (--head-dim is the full\n"
               "layers'), half the KV heads on full layers, RoPE base 10000 sliding / 1000000 full,\n"
               "proportional rope_freqs, softcap 30 (0: none). gemma2 defaults: every other layer sliding\n"
               "(window 8), softcaps 50 (attention) and 30 (final), tied head; gemma3: five sliding layers\n"
               "to one global (window 8), RoPE base 10000 sliding / 1000000 global, no final softcap unless\n"
               "given, --rope-scale: linear scaling of the global layers. The same arguments always give\n"
               "the same file.\n"
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

int main(int argc, char **argv) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    const char *out = NULL, *dtype = NULL, *shape = NULL;
    bool have_family = false;
    /* --shape first, wherever it is: the other options then override the preset */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--shape") == 0) {
            if (shape) {
                fprintf(stderr, "make-tiny-model: --shape given more than once\n");
                return 2;
            }
            shape = i + 1 < argc ? argv[i + 1] : "";
            if (!ember_tiny_model_shape(shape, &p)) {
                fprintf(stderr, "make-tiny-model: --shape must be one of");
                for (int k = 0; ember_tiny_model_shapes[k]; k++) fprintf(stderr, " %s", ember_tiny_model_shapes[k]);
                fprintf(stderr, " (got '%s')\n", shape);
                return 2;
            }
            i++;
        }
    struct {
        const char *opt;
        int64_t *dst;
        long long lo, hi;
    } ints[] = {
        {"--layers", &p.n_layer, 1, 1024},
        {"--hidden", &p.n_embd, 1, 65536},
        {"--heads", &p.n_head, 1, 1024},
        {"--kv-heads", &p.n_head_kv, 1, 1024},
        {"--head-dim", &p.head_dim, 2, 1024},
        {"--ff", &p.n_ff, 1, 262144},
        {"--vocab", &p.n_vocab, 1, 1000000},
        {"--context", &p.n_ctx, 1, 1 << 24},
        {"--head-dim-swa", &p.head_dim_swa, 2, 1024},
        {"--kv-heads-full", &p.n_head_kv_full, 1, 1024},
        {"--window", &p.sliding_window, 1, 1 << 24},
        {"--shared-kv", &p.shared_kv_layers, 0, 1023},
        {"--ple", &p.ple_dim, 0, 65536},
    };
    struct {
        const char *opt;
        float *dst;
        double lo;
        bool open;
        double hi;
    } floats[] = {
        {"--rope-base", &p.rope_base, 1.0, true, 1e12},   {"--rope-base-swa", &p.rope_base_swa, 1.0, true, 1e12},
        {"--softcap", &p.softcap, 0.0, false, 1e6},       {"--attn-softcap", &p.attn_softcap, 0.0, true, 1e6},
        {"--rope-scale", &p.rope_scale, 1.0, false, 1e6},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        long long v;
        bool matched = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !matched; k++)
            if (strcmp(a, ints[k].opt) == 0) {
                if (!parse_int(a, val, ints[k].lo, ints[k].hi, &v)) return 2;
                *ints[k].dst = v;
                i++;
                matched = true;
            }
        for (size_t k = 0; k < sizeof floats / sizeof floats[0] && !matched; k++)
            if (strcmp(a, floats[k].opt) == 0) {
                if (!parse_float(a, val, floats[k].lo, floats[k].open, floats[k].hi, floats[k].dst)) return 2;
                i++;
                matched = true;
            }
        if (matched) continue;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--shape") == 0 && val) {
            i++; /* applied above */
        } else if (strcmp(a, "--family") == 0 && val) {
            if (shape && strcmp(val, p.family) != 0) {
                fprintf(stderr, "make-tiny-model: --family %s conflicts with --shape %s (a %s model)\n", val, shape,
                        p.family);
                return 2;
            }
            p.family = val;
            have_family = true;
            i++;
        } else if (strcmp(a, "--dtype") == 0 && val) {
            dtype = val;
            i++;
        } else if (strcmp(a, "--out") == 0 && val) {
            out = val;
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = val ? strtoull(val, &end, 10) : 0;
            if (!val || !*val || *end || errno || val[0] == '-') {
                fprintf(stderr, "make-tiny-model: --seed needs a non-negative integer (got '%s')\n", val ? val : "");
                return 2;
            }
            p.seed = s;
            i++;
        } else if (strcmp(a, "--swa-pattern") == 0 && val) {
            p.swa_pattern = val;
            i++;
        } else if (strcmp(a, "--rope-freqs") == 0) {
            p.rope_freqs = 1;
        } else if (strcmp(a, "--no-rope-freqs") == 0) {
            p.rope_freqs = 0;
        } else if (strcmp(a, "--tied") == 0) {
            p.tied = 1;
        } else if (strcmp(a, "--untied") == 0) {
            p.tied = 0;
        } else if (strcmp(a, "--no-tokenizer") == 0) {
            p.tokenizer = false;
        } else if (strcmp(a, "--tokenizer") == 0) {
            p.tokenizer = true; /* e.g. with --shape, so that llama.cpp can load the file */
        } else {
            fprintf(stderr, "make-tiny-model: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (shape) {
        have_family = true;
        if (!dtype) dtype = "q8_0";
    }
    if (!have_family || !dtype || !out) {
        fprintf(stderr, "make-tiny-model: --family (or --shape), --dtype and --out are required\n");
        usage(stderr);
        return 2;
    }
    if (!ember_tiny_model_parse_dtype(dtype, &p.dtype)) {
        char list[128];
        ember_tiny_model_dtype_list(list, sizeof list);
        fprintf(stderr, "make-tiny-model: --dtype must be one of %s (got '%s')\n", list, dtype);
        return 2;
    }
    if (!make_parent_dirs(out)) return 1;
    ember_error err = {0};
    if (ember_tiny_model_write(&p, out, &err) != EMBER_OK) {
        fprintf(stderr, "make-tiny-model: %s\n", err.msg);
        return 1;
    }
    return 0;
}
