/* tokenizer_encode.c — text to ids: validation, added tokens, normalization, word splitting, and
 * the hand-off of each word to the merge model. Must not decide merges (tokenizer_bpe.c) nor
 * know where the vocabulary came from. */
#include "tokenizer_internal.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

#define SPACE_MARK "\xE2\x96\x81" /* U+2581, SentencePiece's visible space */

void tok_work_free(tok_work *w) {
    free(w->sym);
    free(w->heap);
    free(w->buf);
    free(w->run);
    free(w->cp);
    free(w->fl);
    free(w->cp_off);
    memset(w, 0, sizeof *w);
}

static bool grow_bytes(char **p, size_t *cap, size_t n) {
    if (n <= *cap) return true;
    const size_t c = ember_grow_cap(*cap, 4096, n);
    char *q = c ? realloc(*p, c) : NULL;
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

ember_status tok_work_reserve_buf(tok_work *w, size_t n, ember_error *err) {
    if (!grow_bytes(&w->buf, &w->cap_buf, n))
        return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory while encoding");
    return EMBER_OK;
}

static ember_status reserve_cps(tok_work *w, size_t n, ember_error *err) {
    if (n <= w->cap_cp) return EMBER_OK;
    const size_t cap = ember_grow_cap(w->cap_cp, 1024, n);
    if (!cap) return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory while encoding");
    int32_t *cp = realloc(w->cp, cap * sizeof *cp);
    if (cp) w->cp = cp;
    uint8_t *fl = realloc(w->fl, cap * sizeof *fl);
    if (fl) w->fl = fl;
    uint32_t *off = realloc(w->cp_off, (cap + 1) * sizeof *off);
    if (off) w->cp_off = off;
    if (!cp || !fl || !off) return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory while encoding");
    w->cap_cp = cap;
    return EMBER_OK;
}

/* ---- one run of plain text (between added tokens) ------------------------------------------- */

/* Splits run[0..len) into words with the family's pattern and merges each word. The run is decoded
 * to code points once, with their classes, so the matchers never re-decode UTF-8 or ask utf8proc
 * twice about the same character. */
static ember_status encode_words(const ember_tokenizer *t, tok_work *w, const char *run, size_t len, tok_ids *out,
                                 ember_error *err) {
    ember_status st;
    if (t->cfg.pre == EMBER_TOK_PRE_NONE) return tok_bpe_word(t, w, run, len, out, err);
    if ((st = reserve_cps(w, len + 1, err)) != EMBER_OK) return st;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int32_t c;
        size_t l = ember_utf8_decode(run + i, len - i, &c);
        if (l == 0) { /* cannot happen: text was validated and normalization keeps it valid */
            c = 0xFFFD;
            l = 1;
        }
        w->cp[n] = c;
        w->fl[n] = (uint8_t)ember_unicode_flags(c);
        w->cp_off[n] = (uint32_t)i;
        n++;
        i += l;
    }
    w->cp_off[n] = (uint32_t)len;
    for (size_t i = 0; i < n;) {
        size_t j = tok_pretok_next(t->cfg.pre, w->cp, w->fl, n, i);
        if (j <= i) j = i + 1; /* a matcher must always advance; never loop forever */
        if ((st = tok_bpe_word(t, w, run + w->cp_off[i], w->cp_off[j] - w->cp_off[i], out, err)) != EMBER_OK) return st;
        i = j;
    }
    return EMBER_OK;
}

/* Normalizes one run (NFC, prefix space, ' ' -> U+2581) and hands it to the model. Runs are
 * normalized one at a time, between added tokens, as HF normalizes each split separately; that is
 * also why a SentencePiece prefix space comes back after every special token (llama.cpp does the
 * same with its is_prev_special flag). */
static ember_status encode_run(const ember_tokenizer *t, tok_work *w, const char *text, size_t len, tok_ids *out,
                               ember_error *err) {
    ember_status st = EMBER_OK;
    if (len == 0) return EMBER_OK;
    char *nfc = NULL;
    if (t->cfg.nfc && !ember_ascii_only(text, len)) {
        size_t nlen;
        if ((st = ember_unicode_nfc(text, len, &nfc, &nlen, err)) != EMBER_OK) return st;
        text = nfc;
        len = nlen;
    }
    if (t->cfg.add_space_prefix || t->cfg.escape_spaces) {
        /* worst case every byte is a space that becomes three bytes, plus the prefix */
        if (!grow_bytes(&w->run, &w->cap_run, 3 * len + 4)) {
            free(nfc);
            return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory while encoding");
        }
        size_t m = 0;
        const char *space = t->cfg.escape_spaces ? SPACE_MARK : " ";
        size_t space_len = strlen(space);
        if (t->cfg.add_space_prefix) {
            memcpy(w->run + m, space, space_len);
            m += space_len;
        }
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ' && t->cfg.escape_spaces) {
                memcpy(w->run + m, SPACE_MARK, 3);
                m += 3;
            } else {
                w->run[m++] = text[i];
            }
        }
        text = w->run;
        len = m;
    }
    if (t->cfg.model == EMBER_TOK_MODEL_SPM) st = tok_spm_run(t, w, text, len, out, err);
    else st = encode_words(t, w, text, len, out, err);
    free(nfc);
    return st;
}

/* ---- added tokens ---------------------------------------------------------------------------- */

static bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* A word character for single_word tokens: letter, number or '_' (what \w means to HF). */
static bool word_char_at(const char *s, size_t n, size_t i) {
    int32_t c;
    if (i >= n || !ember_utf8_decode(s + i, n - i, &c)) return false;
    return c == '_' || (ember_unicode_flags(c) & (EMBER_CP_LETTER | EMBER_CP_NUMBER));
}

static bool word_char_before(const char *s, size_t n, size_t i) {
    if (i == 0) return false;
    size_t k = i - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return word_char_at(s, n, k);
}

/* The byte at depth d of added[j]'s string; every string in the range searched is longer than d. */
static unsigned char added_byte(const ember_tokenizer *t, int32_t j, size_t d) {
    int32_t id = t->added[j];
    return (unsigned char)t->tab.text[t->tab.off[id] + d];
}

/* First j in [lo, hi) whose byte at depth d is above c (above = false: at least c). */
static int32_t added_bound(const ember_tokenizer *t, int32_t lo, int32_t hi, size_t d, unsigned char c, bool above) {
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        unsigned char b = added_byte(t, mid, d);
        if (above ? b <= c : b < c) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The longest added token that starts at text[i] and may be matched here; its id and length.
 * Narrows the sorted added tokens byte by byte to those spelling text[i..i+d) as deep as the text
 * allows, and keeps the last acceptable token seen (the one exactly d bytes long sorts first in
 * its range), which gives HF's leftmost-longest rule when the caller tries positions left to
 * right. Control tokens count only with parse_special; user-defined ones always (llama.cpp and HF
 * agree on that). */
static bool match_added(const ember_tokenizer *t, const char *text, size_t len, size_t i, bool parse_special,
                        int32_t *id, size_t *mlen) {
    unsigned char first = (unsigned char)text[i];
    int32_t lo = t->added_first[first], hi = t->added_first[first + 1];
    bool found = false;
    for (size_t d = 1; lo < hi; d++) {
        /* added[lo..hi): the added strings that begin with text[i..i+d) */
        int32_t tok = t->added[lo];
        if (t->tab.len[tok] == d) {
            unsigned attr = t->tab.attr[tok], kind = attr & EMBER_TOKEN_KIND_MASK;
            bool ok = parse_special || kind == EMBER_TOKEN_USER_DEFINED;
            if (ok && (attr & EMBER_TOKEN_SINGLE_WORD))
                ok = !word_char_before(text, len, i) && !word_char_at(text, len, i + d);
            if (ok) {
                found = true;
                *id = tok;
                *mlen = d;
            }
            lo++;
        }
        if (i + d >= len) break;
        unsigned char next = (unsigned char)text[i + d];
        lo = added_bound(t, lo, hi, d, next, false);
        hi = added_bound(t, lo, hi, d, next, true);
    }
    return found;
}

ember_status ember_tokenizer_encode(const ember_tokenizer *t, const char *text, size_t len, bool add_bos,
                                    bool parse_special, int32_t **ids, size_t *n_ids, ember_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return ember_error_set(err, EMBER_ERR_ARG, "tokenizer: encode was given no text");
    if (len > TOK_MAX_TEXT_LEN)
        return ember_error_set(err, EMBER_ERR_ARG, "tokenizer: a text of %zu bytes is too long (limit %zu MiB)", len,
                               TOK_MAX_TEXT_LEN >> 20);
    size_t bad = ember_utf8_validate(text, len);
    if (bad < len)
        return ember_error_set(err, EMBER_ERR_ARG, "tokenizer: the text is not valid UTF-8 (byte 0x%02X at offset %zu)",
                               (unsigned char)text[bad], bad);

    ember_status st = EMBER_OK;
    tok_ids out = {0};
    tok_work w = {0};
    if (add_bos && t->cfg.bos_id >= 0 && (st = tok_ids_push(&out, t->cfg.bos_id, err)) != EMBER_OK) goto done;

    /* Cut added tokens out first: the text between them is encoded run by run. added_first makes
     * the common case (no added token can start at this byte) two table loads. */
    size_t seg = 0; /* start of the plain text not yet encoded */
    for (size_t i = 0; i < len;) {
        int32_t id;
        size_t mlen;
        unsigned char c = (unsigned char)text[i];
        if (t->added_first[c] == t->added_first[c + 1] || !match_added(t, text, len, i, parse_special, &id, &mlen)) {
            i++;
            continue;
        }
        unsigned attr = t->tab.attr[id];
        size_t seg_end = i;
        if (attr & EMBER_TOKEN_LSTRIP)
            while (seg_end > seg && is_ascii_space(text[seg_end - 1])) seg_end--;
        if ((st = encode_run(t, &w, text + seg, seg_end - seg, &out, err)) != EMBER_OK) goto done;
        if ((st = tok_ids_push(&out, id, err)) != EMBER_OK) goto done;
        i += mlen;
        if (attr & EMBER_TOKEN_RSTRIP)
            while (i < len && is_ascii_space(text[i])) i++;
        seg = i;
    }
    st = encode_run(t, &w, text + seg, len - seg, &out, err);

done:
    tok_work_free(&w);
    if (st != EMBER_OK) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n_ids = out.n;
    return EMBER_OK;
}
