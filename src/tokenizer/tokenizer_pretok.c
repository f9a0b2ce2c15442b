/* tokenizer_pretok.c — the families' word-splitting regexes, matched by hand over code points.
 * Must not know vocabularies: it only says where each word ends.
 *
 * The patterns are alternations tried left to right at the current position (Perl/Oniguruma
 * semantics: the first alternative that matches wins, quantifiers are greedy and backtrack).
 * Each matcher below follows its pattern alternative by alternative; every code point belongs to
 * some alternative, so each call consumes at least one. \s is White_Space, \p{L} and \p{N} are
 * Unicode general categories; the classes come precomputed in fl (EMBER_CP_*). */
#include "tokenizer_internal.h"
#include "unicode.h"

#define IS(j, bit) ((j) < n && (fl[(j)] & (bit)))
/* [^\s\p{L}\p{N}]: anything that is not space, letter or number */
#define IS_OTHER(j) ((j) < n && !(fl[(j)] & (EMBER_CP_LETTER | EMBER_CP_NUMBER | EMBER_CP_SPACE)))

static size_t run_of(const uint8_t *fl, size_t n, size_t j, unsigned bit) {
    while (j < n && (fl[j] & bit)) j++;
    return j;
}

static size_t run_of_other(const uint8_t *fl, size_t n, size_t j) {
    while (IS_OTHER(j)) j++;
    return j;
}

static int32_t ascii_lower(int32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d at i (i holds the apostrophe): the end, or 0 for no match. LLaMA 3
 * and Qwen2 ask for (?i:...), which ember, like llama.cpp, folds for ASCII letters only. */
static size_t contraction(const int32_t *cp, size_t n, size_t i, bool fold) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    int32_t c1 = fold ? ascii_lower(cp[i + 1]) : cp[i + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if (i + 2 >= n) return 0;
    int32_t c2 = fold ? ascii_lower(cp[i + 2]) : cp[i + 2];
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    return 0;
}

/* \s+(?!\S) then \s+ for the whitespace run starting at i (fl[i] is SPACE). The greedy run backs
 * off one character when a non-space follows, so that character's word can take the last space;
 * a single space followed by a non-space falls through to plain \s+. */
static size_t trailing_space(const uint8_t *fl, size_t n, size_t i) {
    size_t k = run_of(fl, n, i, EMBER_CP_SPACE);
    if (k < n && k - i >= 2) return k - 1;
    return k;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t next_gpt2(const int32_t *cp, const uint8_t *fl, size_t n, size_t i) {
    size_t k = contraction(cp, n, i, false);
    if (k) return k;
    size_t j = (cp[i] == ' ') ? i + 1 : i; /* the optional leading space */
    if (IS(j, EMBER_CP_LETTER)) return run_of(fl, n, j, EMBER_CP_LETTER);
    if (IS(j, EMBER_CP_NUMBER)) return run_of(fl, n, j, EMBER_CP_NUMBER);
    if (IS_OTHER(j)) return run_of_other(fl, n, j);
    if (IS(i, EMBER_CP_SPACE)) return trailing_space(fl, n, i);
    return i + 1; /* unreachable: every code point is letter, number, space or other */
}

/* LLaMA 3 (max_digits 3) and Qwen2 (max_digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t next_llama3(const int32_t *cp, const uint8_t *fl, size_t n, size_t i, size_t max_digits) {
    size_t k = contraction(cp, n, i, true);
    if (k) return k;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ : one optional non-newline, non-letter, non-number, then letters */
    if (IS(i, EMBER_CP_LETTER)) return run_of(fl, n, i, EMBER_CP_LETTER);
    if (!(fl[i] & (EMBER_CP_NEWLINE | EMBER_CP_LETTER | EMBER_CP_NUMBER)) && IS(i + 1, EMBER_CP_LETTER))
        return run_of(fl, n, i + 1, EMBER_CP_LETTER);
    if (IS(i, EMBER_CP_NUMBER)) {
        k = i;
        while (k < n && k - i < max_digits && (fl[k] & EMBER_CP_NUMBER)) k++;
        return k;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t j = (cp[i] == ' ') ? i + 1 : i;
    if (IS_OTHER(j)) {
        k = run_of_other(fl, n, j);
        while (k < n && (cp[k] == '\r' || cp[k] == '\n')) k++;
        return k;
    }
    if (IS(i, EMBER_CP_SPACE)) {
        /* \s*[\r\n]+ : the greedy \s* backs off to the last newline of the whitespace run */
        size_t end = run_of(fl, n, i, EMBER_CP_SPACE);
        for (size_t p = end; p > i; p--)
            if (cp[p - 1] == '\r' || cp[p - 1] == '\n') return p;
        return trailing_space(fl, n, i);
    }
    return i + 1;
}

/* [^\n]+|[\n]+ */
static size_t next_newlines(const int32_t *cp, size_t n, size_t i) {
    bool nl = cp[i] == '\n';
    size_t k = i + 1;
    while (k < n && (cp[k] == '\n') == nl) k++;
    return k;
}

size_t tok_pretok_next(ember_tok_pre pre, const int32_t *cp, const uint8_t *fl, size_t n, size_t i) {
    switch (pre) {
    case EMBER_TOK_PRE_GPT2: return next_gpt2(cp, fl, n, i);
    case EMBER_TOK_PRE_LLAMA3: return next_llama3(cp, fl, n, i, 3);
    case EMBER_TOK_PRE_QWEN2: return next_llama3(cp, fl, n, i, 1);
    case EMBER_TOK_PRE_NEWLINES: return next_newlines(cp, n, i);
    case EMBER_TOK_PRE_NONE: break;
    }
    return n;
}
