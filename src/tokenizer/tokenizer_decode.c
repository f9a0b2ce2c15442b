/* tokenizer_decode.c — ids to text, whole or streamed. Must not encode.
 * Pieces were decoded once when the tokenizer was built (tokenizer.c); decoding concatenates them.
 * The stream additionally holds back a character split across tokens until it is complete. */
#include "tokenizer_internal.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

static ember_status check_id(const ember_tokenizer *t, int32_t id, ember_error *err) {
    if (tok_has(&t->tab, id)) return EMBER_OK;
    return ember_error_set(err, EMBER_ERR_ARG, "tokenizer: id %d is not a token (vocabulary size %lld)", id,
                           (long long)t->tab.n);
}

ember_status ember_tokenizer_decode(const ember_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len,
                                    ember_error *err) {
    *text = NULL;
    *len = 0;
    ember_status st;
    for (size_t i = 0; i < n; i++)
        if ((st = check_id(t, ids[i], err)) != EMBER_OK) return st;
    /* The BOS the tokenizer adds on its own is not part of the text (llama.cpp's remove_special). */
    if (n > 0 && t->cfg.add_bos && ids[0] == t->cfg.bos_id) {
        ids++;
        n--;
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += t->piece_len[ids[i]];
    char *out = malloc(total + 1);
    if (!out) return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = t->tab.text + t->piece_off[ids[i]];
        size_t l = t->piece_len[ids[i]];
        /* the space the SentencePiece prefix put before the first word is not text */
        if (i == 0 && t->cfg.decode_strip_space && l > 0 && p[0] == ' ') {
            p++;
            l--;
        }
        memcpy(out + o, p, l);
        o += l;
    }
    out[o] = '\0';
    *text = out;
    *len = o;
    return EMBER_OK;
}

/* ---- streaming ------------------------------------------------------------------------------- */

struct ember_detok_stream {
    const ember_tokenizer *t;
    unsigned flags;
    bool started;  /* a piece has been emitted since the start/flush */
    bool any_id;   /* an id has been pushed since the start/flush */
    char *pending; /* bytes of an incomplete character, at most 3 */
    size_t n_pending;
    char *out; /* the chunk handed back by the last call */
    size_t cap_out;
    char *joined; /* pending bytes + the new piece, before validation */
    size_t cap_joined;
};

ember_status ember_detok_stream_new(const ember_tokenizer *t, unsigned flags, ember_detok_stream **out,
                                    ember_error *err) {
    *out = NULL;
    ember_detok_stream *s = calloc(1, sizeof *s);
    if (s) s->pending = malloc(8);
    if (!s || !s->pending) {
        free(s);
        return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory for a detokenizer stream");
    }
    s->t = t;
    s->flags = flags & EMBER_DETOK_AS_DECODE ? EMBER_DETOK_AS_DECODE | EMBER_DETOK_STRIP_LEADING_SPACE : flags;
    *out = s;
    return EMBER_OK;
}

void ember_detok_stream_free(ember_detok_stream *s) {
    if (!s) return;
    free(s->pending);
    free(s->out);
    free(s->joined);
    free(s);
}

void ember_detok_stream_reset(ember_detok_stream *s) {
    s->started = false;
    s->any_id = false;
    s->n_pending = 0;
}

/* Length of the longest prefix of s[0..n) that can begin a UTF-8 character (the "maximal subpart"
 * of Unicode's replacement rules); 0 when s[0] cannot start one. */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
    unsigned char lo = 0x80, hi = 0xBF;
    size_t need;
    unsigned char c = s[0];
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0; /* no overlong forms */
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return 0;
    }
    size_t k = 1;
    while (k < need && k < n) {
        unsigned char lim_lo = k == 1 ? lo : 0x80, lim_hi = k == 1 ? hi : 0xBF;
        if (s[k] < lim_lo || s[k] > lim_hi) break;
        k++;
    }
    return k;
}

static bool grow(char **buf, size_t *cap, size_t n) {
    if (n <= *cap) return true;
    const size_t c = ember_grow_cap(*cap, 256, n);
    char *b = c ? realloc(*buf, c) : NULL;
    if (!b) return false;
    *buf = b;
    *cap = c;
    return true;
}

static bool out_reserve(ember_detok_stream *s, size_t n) { return grow(&s->out, &s->cap_out, n); }

/* Moves the complete characters of bytes[0..n) to s->out (at *o); invalid bytes become U+FFFD (or
 * pass through unchanged with EMBER_DETOK_AS_DECODE) and a valid but unfinished tail is kept in
 * pending (unless final: then it is treated as invalid). */
static void emit_valid(ember_detok_stream *s, const unsigned char *bytes, size_t n, size_t *o, bool final) {
    const bool raw = s->flags & EMBER_DETOK_AS_DECODE;
    size_t i = 0;
    while (i < n) {
        if (bytes[i] < 0x80) {
            s->out[(*o)++] = (char)bytes[i++];
            continue;
        }
        int32_t cp;
        size_t l = ember_utf8_decode((const char *)bytes + i, n - i, &cp);
        if (l) {
            memcpy(s->out + *o, bytes + i, l);
            *o += l;
            i += l;
            continue;
        }
        size_t k = utf8_valid_prefix(bytes + i, n - i);
        if (k > 0 && i + k == n && !final) { /* may still be completed by the next token */
            memcpy(s->pending, bytes + i, k);
            s->n_pending = k;
            return;
        }
        const size_t bad = k ? k : 1;
        if (raw) {
            memcpy(s->out + *o, bytes + i, bad);
            *o += bad;
        } else {
            memcpy(s->out + *o, "\xEF\xBF\xBD", 3);
            *o += 3;
        }
        i += bad;
    }
}

ember_status ember_detok_stream_push(ember_detok_stream *s, int32_t id, const char **text, size_t *len,
                                     ember_error *err) {
    *text = "";
    *len = 0;
    const ember_tokenizer *t = s->t;
    ember_status st = check_id(t, id, err);
    if (st != EMBER_OK) return st;
    const bool first_id = !s->any_id;
    s->any_id = true;
    if ((s->flags & EMBER_DETOK_AS_DECODE) && first_id && t->cfg.add_bos && id == t->cfg.bos_id) return EMBER_OK;
    if ((s->flags & EMBER_DETOK_SKIP_SPECIAL) && ember_tokenizer_is_special(t, id)) return EMBER_OK;
    const char *p = t->tab.text + t->piece_off[id];
    size_t l = t->piece_len[id];
    if (!s->started && (s->flags & EMBER_DETOK_STRIP_LEADING_SPACE) && t->cfg.decode_strip_space && l > 0 &&
        p[0] == ' ') {
        p++;
        l--;
    }
    s->started = true;
    /* pending + piece, worst case every byte becomes a 3-byte U+FFFD */
    size_t n = s->n_pending + l;
    if (!out_reserve(s, 3 * n + 1) || !grow(&s->joined, &s->cap_joined, n + 1))
        return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory in a detokenizer stream");
    memcpy(s->joined, s->pending, s->n_pending);
    memcpy(s->joined + s->n_pending, p, l);
    s->n_pending = 0;
    size_t o = 0;
    emit_valid(s, (const unsigned char *)s->joined, n, &o, false);
    s->out[o] = '\0';
    *text = s->out;
    *len = o;
    return EMBER_OK;
}

void ember_detok_stream_flush(ember_detok_stream *s, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (s->n_pending && out_reserve(s, 3 * s->n_pending + 1)) {
        unsigned char held[8];
        size_t n = s->n_pending, o = 0;
        memcpy(held, s->pending, n);
        s->n_pending = 0;
        emit_valid(s, held, n, &o, true);
        s->out[o] = '\0';
        *text = s->out;
        *len = o;
    }
    ember_detok_stream_reset(s);
}
