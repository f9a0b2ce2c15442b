/* tiny_tokenizer.c — learns a few hundred BPE merges from a short built-in text and writes them as
 * GGUF tokenizer metadata. Must stay deterministic: no hashing by address, ties broken by id. */
#include "tiny_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Plain English written for this tool: common words and pairs, so the merges look like a real
 * vocabulary's first merges (" t", "he", " the", "in", ...). */
static const char corpus[] =
    "The morning was cold and the river was quiet. In the small town near the hills, people woke "
    "early to open their shops, and the smell of bread came from the bakery on the corner. A boy "
    "walked his dog along the water while his sister read a book on the bench under the old tree.\n"
    "There is a simple idea behind every good tool: it should do one thing and do it well. When "
    "you build something that other people will use, think about what they need, not only about "
    "what you want to make. Write it down, test it, and then test it again.\n"
    "Numbers tell part of the story. In 2023 the town had 4,512 people; by 2024 there were 4,730. "
    "The school added two new rooms, and the library opened on Sundays for the first time.\n"
    "She said, \"We'll see what happens next.\" He didn't answer; he was looking at the sky, where "
    "the clouds were moving fast toward the east. It's going to rain, I think, and they're not "
    "ready for it.\n"
    "Learning a language takes time. You hear a word, you say it, you forget it, and then one day "
    "it stays with you. The same is true for music, for sport, and for most of the things that "
    "matter in life. Practice is the quiet work that nobody sees.\n"
    "The computer reads the model from the disk, runs each layer in order, and writes the next "
    "word on the screen. If something goes wrong, it should say what went wrong and where, so "
    "that the person who reads the message knows what to fix.\n"
    "At night the town is still. The lights in the windows go out one by one, the wind moves "
    "through the trees, and the river keeps running to the sea, as it has for a thousand years.\n"
    "Questions are better than answers when you are starting out. Why does this work? What would "
    "happen if we changed that? How do we know that the result is right? Good questions lead to "
    "careful experiments, and careful experiments lead to things we can trust.\n"
    "They walked together to the market, bought apples, onions, rice and fresh fish, and then "
    "went home to cook dinner for their friends. Everyone talked and laughed until late.\n";

int32_t ember_tiny_tokenizer_byte_id(uint8_t b) {
    /* GPT-2's order: the printable bytes keep their own code point and come first; the other 68
     * bytes (0..32, 127..160, 173) follow in byte order. */
    if (b >= 33 && b <= 126) return b - 33;
    if (b >= 161 && b <= 172) return 94 + (b - 161);
    if (b >= 174) return 106 + (b - 174);
    if (b <= 32) return 188 + b;
    if (b <= 160) return 188 + 33 + (b - 127);
    return 188 + 67; /* 173, the soft hyphen */
}

void ember_tiny_tokenizer_byte_symbol(uint8_t b, char out[3]) {
    int32_t id = ember_tiny_tokenizer_byte_id(b);
    /* Printable bytes map to themselves; the n-th remapped byte maps to U+0100 + n. */
    uint32_t cp = id < 188 ? b : 256u + (uint32_t)(id - 188);
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

typedef struct {
    int32_t *ids; /* current token ids of the word */
    int64_t n;
    int64_t freq;
} word;

typedef struct {
    char **tok; /* (n_vocab) token strings, byte-level encoded */
    int64_t n_tok;
    char **merges;
    int64_t n_merges;
    word *words;
    int64_t n_words;
} trainer;

static bool is_alpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\t'; }

/* Length of the next pre-token at s: a GPT-2-like split for ASCII text (contractions, an optional
 * space before a letter/digit/punctuation run, whitespace runs). Merges never cross these. */
static size_t next_piece(const char *s) {
    static const char *contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t i = 0; i < sizeof contractions / sizeof contractions[0]; i++) {
        size_t n = strlen(contractions[i]);
        if (strncmp(s, contractions[i], n) == 0) return n;
    }
    size_t i = 0;
    if (s[0] == ' ' && s[1] && !is_space((unsigned char)s[1])) i = 1;
    unsigned char c = (unsigned char)s[i];
    if (is_alpha(c)) {
        while (is_alpha((unsigned char)s[i])) i++;
    } else if (is_digit(c)) {
        while (is_digit((unsigned char)s[i])) i++;
    } else if (!is_space(c)) {
        while (s[i] && !is_space((unsigned char)s[i]) && !is_alpha((unsigned char)s[i]) &&
               !is_digit((unsigned char)s[i]) && s[i] != '\'')
            i++;
        if (i == 0 || (i == 1 && s[0] == ' ')) i++; /* a lone apostrophe */
    } else {
        while (is_space((unsigned char)s[i])) i++;
    }
    return i;
}

static void trainer_free(trainer *t) {
    for (int64_t i = 0; i < t->n_tok; i++) free(t->tok[i]);
    for (int64_t i = 0; i < t->n_merges; i++) free(t->merges[i]);
    for (int64_t i = 0; i < t->n_words; i++) free(t->words[i].ids);
    free(t->tok);
    free(t->merges);
    free(t->words);
}

/* Splits the corpus into distinct words (with counts) of byte ids. */
static bool trainer_words(trainer *t) {
    t->words = calloc(sizeof corpus, sizeof *t->words); /* more than the number of pieces */
    if (!t->words) return false;
    for (const char *s = corpus; *s;) {
        size_t n = next_piece(s);
        int64_t found = -1;
        for (int64_t w = 0; w < t->n_words && found < 0; w++) {
            const word *wd = &t->words[w];
            if (wd->n != (int64_t)n) continue;
            bool same = true;
            for (size_t k = 0; k < n && same; k++) same = wd->ids[k] == ember_tiny_tokenizer_byte_id((uint8_t)s[k]);
            if (same) found = w;
        }
        if (found >= 0) {
            t->words[found].freq++;
        } else {
            word *wd = &t->words[t->n_words++];
            wd->ids = malloc(n * sizeof *wd->ids);
            if (!wd->ids) return false;
            for (size_t k = 0; k < n; k++) wd->ids[k] = ember_tiny_tokenizer_byte_id((uint8_t)s[k]);
            wd->n = (int64_t)n;
            wd->freq = 1;
        }
        s += n;
    }
    return true;
}

typedef struct {
    int32_t a, b;
    int64_t freq;
} pair_count;

static int by_pair(const void *x, const void *y) {
    const pair_count *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return p->b < q->b ? -1 : p->b > q->b;
}

/* The most frequent adjacent pair over all words; ties go to the smaller (a, b). False if none.
 * `scratch` holds one entry per adjacent position (at most the corpus length). */
static bool best_pair(const trainer *t, pair_count *scratch, int32_t *ba, int32_t *bb) {
    size_t n = 0;
    for (int64_t w = 0; w < t->n_words; w++)
        for (int64_t k = 0; k + 1 < t->words[w].n; k++)
            scratch[n++] = (pair_count){t->words[w].ids[k], t->words[w].ids[k + 1], t->words[w].freq};
    qsort(scratch, n, sizeof *scratch, by_pair);
    int64_t best = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        int64_t sum = 0;
        for (; j < n && scratch[j].a == scratch[i].a && scratch[j].b == scratch[i].b; j++) sum += scratch[j].freq;
        if (sum > best) { /* strictly greater: the first (smallest) pair wins a tie */
            best = sum;
            *ba = scratch[i].a;
            *bb = scratch[i].b;
        }
        i = j;
    }
    return best > 0;
}

static void apply_merge(trainer *t, int32_t a, int32_t b, int32_t id) {
    for (int64_t w = 0; w < t->n_words; w++) {
        word *wd = &t->words[w];
        int64_t o = 0;
        for (int64_t k = 0; k < wd->n; k++) {
            if (k + 1 < wd->n && wd->ids[k] == a && wd->ids[k + 1] == b) {
                wd->ids[o++] = id;
                k++;
            } else {
                wd->ids[o++] = wd->ids[k];
            }
        }
        wd->n = o;
    }
}

static char *concat(const char *a, const char *sep, const char *b) {
    size_t na = strlen(a), ns = strlen(sep), nb = strlen(b);
    char *s = malloc(na + ns + nb + 1);
    if (!s) return NULL;
    memcpy(s, a, na);
    memcpy(s + na, sep, ns);
    memcpy(s + na + ns, b, nb + 1);
    return s;
}

/* Learns merges until the vocabulary holds n_normal tokens or no pair is left. */
static bool trainer_run(trainer *t, int64_t n_normal) {
    pair_count *counts = malloc(sizeof corpus * sizeof *counts);
    if (!counts) return false;
    int32_t a = 0, b = 0;
    while (t->n_tok < n_normal && best_pair(t, counts, &a, &b)) {
        char *res = concat(t->tok[a], "", t->tok[b]);
        char *merge = concat(t->tok[a], " ", t->tok[b]);
        if (!res || !merge) {
            free(res);
            free(merge);
            free(counts);
            return false;
        }
        /* Two different merges can spell the same string ("ab"+"c", "a"+"bc"): one token. */
        int32_t id = -1;
        for (int64_t i = 0; i < t->n_tok && id < 0; i++)
            if (strcmp(t->tok[i], res) == 0) id = (int32_t)i;
        if (id < 0) {
            id = (int32_t)t->n_tok;
            t->tok[t->n_tok++] = res;
        } else {
            free(res);
        }
        t->merges[t->n_merges++] = merge;
        apply_merge(t, a, b, id);
    }
    free(counts);
    return true;
}

ember_status ember_tiny_tokenizer_build(ember_gguf_writer *w, int64_t n_vocab, const char *pre, bool add_bos,
                                        ember_error *err) {
    /* up to the real models' vocabularies (Gemma's 262,144 tokens): beyond the learnt merges the
     * rest are reserved control tokens */
    if (n_vocab < EMBER_TINY_TOKENIZER_MIN_VOCAB || n_vocab > (1 << 20))
        return ember_error_set(err, EMBER_ERR_ARG,
                               "tiny tokenizer: vocabulary of %lld tokens is out of range (%d..1048576)",
                               (long long)n_vocab, EMBER_TINY_TOKENIZER_MIN_VOCAB);
    const int64_t n_normal = n_vocab - 2;
    trainer t = {0};
    ember_status st = EMBER_OK;
    int32_t *types = NULL;
    t.tok = calloc((size_t)n_vocab, sizeof *t.tok);
    /* Each merge shortens some word, so there are fewer merges than corpus bytes. */
    t.merges = calloc(sizeof corpus, sizeof *t.merges);
    if (!t.tok || !t.merges) goto oom;
    t.n_tok = 256; /* filled below; set first so a failure frees what was made */
    for (int b = 0; b < 256; b++) {
        char sym[3];
        ember_tiny_tokenizer_byte_symbol((uint8_t)b, sym);
        if (!(t.tok[ember_tiny_tokenizer_byte_id((uint8_t)b)] = strdup(sym))) goto oom;
    }
    if (!trainer_words(&t)) goto oom;
    if (!trainer_run(&t, n_normal)) goto oom;
    const int64_t n_learnt = t.n_tok; /* byte and merged tokens; the rest are control tokens */
    for (int64_t r = 0; t.n_tok < n_normal; r++) {
        char name[48];
        snprintf(name, sizeof name, "<|reserved_%lld|>", (long long)r);
        if (!(t.tok[t.n_tok++] = strdup(name))) goto oom;
    }
    if (!(t.tok[t.n_tok++] = strdup("<|begin_of_text|>")) || !(t.tok[t.n_tok++] = strdup("<|end_of_text|>"))) goto oom;

    types = malloc((size_t)n_vocab * sizeof *types);
    if (!types) goto oom;
    for (int64_t i = 0; i < n_vocab; i++) types[i] = i < n_learnt ? 1 /* normal */ : 3 /* control */;

    ember_gguf_writer_set_string(w, "tokenizer.ggml.model", "gpt2");
    ember_gguf_writer_set_string(w, "tokenizer.ggml.pre", pre);
    ember_gguf_writer_set_strings(w, "tokenizer.ggml.tokens", (const char *const *)t.tok, (uint64_t)n_vocab);
    ember_gguf_writer_set_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n_vocab);
    ember_gguf_writer_set_strings(w, "tokenizer.ggml.merges", (const char *const *)t.merges, (uint64_t)t.n_merges);
    ember_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(n_vocab - 2));
    ember_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n_vocab - 1));
    ember_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    ember_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    st = ember_gguf_writer_status(w, err); /* the first failure of the calls above, if any */
    goto done;
oom:
    st = ember_error_set(err, EMBER_ERR_NOMEM, "tiny tokenizer: out of memory");
done:
    free(types);
    trainer_free(&t);
    return st;
}
