/* tokenizer_bpe.c — the two merge models: BPE by merge rank and SentencePiece by token score.
 * Must not split or normalize text: it gets one word (BPE) or one normalized run (SentencePiece).
 *
 * Both keep the word as a doubly linked list of symbols and a binary heap of candidate pairs, so a
 * word of n symbols costs O(n log n) instead of the O(n^2) of rescanning for the best pair after
 * every merge. Heap entries are never removed when a merge invalidates them; a popped entry is
 * checked against the current symbols and skipped when stale. */
#include "tokenizer_internal.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

/* A candidate merge of symbol left with its right neighbour, in the one heap both models use:
 * highest key first, then leftmost. BPE's key is -rank (lowest rank first, then leftmost: the order
 * of both HF tokenizers and llama.cpp; exact in a double); SentencePiece's is the joined token's
 * score. BPE checks rank, SentencePiece right and size (bytes of the pair when it was queued), to
 * detect entries made stale by a neighbour's merge. */
typedef struct {
    double key;
    int32_t left, right;
    uint32_t size;
    int32_t rank;
} tok_pair;

static ember_status work_nomem(ember_error *err) {
    return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory while encoding");
}

static ember_status reserve_symbols(tok_work *w, size_t n, ember_error *err) {
    if (n <= w->cap_sym) return EMBER_OK;
    const size_t cap = ember_grow_cap(w->cap_sym, 256, n);
    tok_symbol *sym = cap ? realloc(w->sym, cap * sizeof *sym) : NULL;
    if (!sym) return work_nomem(err);
    w->sym = sym;
    w->cap_sym = cap;
    return EMBER_OK;
}

static ember_status reserve_heap(tok_work *w, size_t n, ember_error *err) {
    if (n <= w->cap_heap) return EMBER_OK;
    const size_t cap = ember_grow_cap(w->cap_heap, 256, n);
    tok_pair *heap = cap ? realloc(w->heap, cap * sizeof *heap) : NULL;
    if (!heap) return work_nomem(err);
    w->heap = heap;
    w->cap_heap = cap;
    return EMBER_OK;
}

static ember_status push_symbol(tok_work *w, int32_t id, uint32_t start, uint32_t n, ember_error *err) {
    ember_status st = reserve_symbols(w, w->n_sym + 1, err);
    if (st != EMBER_OK) return st;
    tok_symbol *s = &w->sym[w->n_sym];
    s->id = id;
    s->start = start;
    s->n = n;
    s->prev = (int32_t)w->n_sym - 1;
    s->next = -1;
    if (w->n_sym > 0) w->sym[w->n_sym - 1].next = (int32_t)w->n_sym;
    w->n_sym++;
    return EMBER_OK;
}

/* ---- the candidate heap ---------------------------------------------------------------------- */

static bool pair_before(const tok_pair *a, const tok_pair *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static ember_status heap_push(tok_work *w, tok_pair e, ember_error *err) {
    ember_status st = reserve_heap(w, w->n_heap + 1, err);
    if (st != EMBER_OK) return st;
    tok_pair *h = w->heap;
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&e, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
    return EMBER_OK;
}

static tok_pair heap_pop(tok_work *w) {
    tok_pair *h = w->heap;
    tok_pair top = h[0], last = h[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&h[c + 1], &h[c])) c++;
        if (!pair_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

/* ---- BPE ------------------------------------------------------------------------------------- */

/* Queues the pair (a, a.next) when a merge exists for it. */
static ember_status bpe_consider(const ember_tokenizer *t, tok_work *w, int32_t a, ember_error *err) {
    if (a < 0 || w->sym[a].next < 0) return EMBER_OK;
    int32_t rank, result;
    if (!tok_merge_find(&t->merges, w->sym[a].id, w->sym[w->sym[a].next].id, &rank, &result)) return EMBER_OK;
    tok_pair e = {-(double)rank, a, -1, 0, rank};
    return heap_push(w, e, err);
}

/* The initial symbols of a word that is not byte-level: one per character, with byte fallback
 * and unknown-token handling the way HF's BPE model does it. */
static ember_status bpe_char_symbols(const ember_tokenizer *t, tok_work *w, const char *word, size_t len,
                                     ember_error *err) {
    ember_status st;
    bool last_unk = false;
    for (size_t i = 0; i < len;) {
        size_t cl = ember_utf8_seq_len((unsigned char)word[i]);
        if (cl > len - i) cl = len - i;
        int32_t id = tok_map_find(&t->map, &t->tab, word + i, cl);
        if (id >= 0) {
            if ((st = push_symbol(w, id, (uint32_t)i, 1, err)) != EMBER_OK) return st;
            last_unk = false;
            i += cl;
            continue;
        }
        bool bytes_ok = t->cfg.byte_fallback;
        for (size_t k = 0; bytes_ok && k < cl; k++) bytes_ok = t->byte_fallback[(unsigned char)word[i + k]] >= 0;
        if (bytes_ok) {
            for (size_t k = 0; k < cl; k++)
                if ((st = push_symbol(w, t->byte_fallback[(unsigned char)word[i + k]], (uint32_t)(i + k), 1, err)) !=
                    EMBER_OK)
                    return st;
            last_unk = false;
        } else if (t->cfg.unk_id >= 0 && !(t->cfg.fuse_unk && last_unk)) {
            if ((st = push_symbol(w, t->cfg.unk_id, (uint32_t)i, 1, err)) != EMBER_OK) return st;
            last_unk = true;
        }
        /* no byte tokens and no unk: HF drops the character, and so does ember */
        i += cl;
    }
    return EMBER_OK;
}

static bool all_newlines(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != '\n') return false;
    return len > 0;
}

ember_status tok_bpe_word(const ember_tokenizer *t, tok_work *w, const char *word, size_t len, tok_ids *out,
                          ember_error *err) {
    ember_status st;
    if (len == 0) return EMBER_OK;
    w->n_sym = 0;
    w->n_heap = 0;
    if (t->cfg.byte_level) {
        if (t->cfg.ignore_merges) {
            /* the word spelled in the byte alphabet, looked up whole */
            if ((st = tok_work_reserve_buf(w, 2 * len, err)) != EMBER_OK) return st;
            size_t m = 0;
            for (size_t i = 0; i < len; i++) m += ember_utf8_encode(ember_byte_to_cp((uint8_t)word[i]), w->buf + m);
            int32_t id = tok_map_find(&t->map, &t->tab, w->buf, m);
            if (id >= 0) return tok_ids_push(out, id, err);
        }
        if ((st = reserve_symbols(w, len, err)) != EMBER_OK) return st;
        for (size_t i = 0; i < len; i++)
            if ((st = push_symbol(w, t->byte_token[(unsigned char)word[i]], (uint32_t)i, 1, err)) != EMBER_OK)
                return st;
    } else {
        if (t->cfg.ignore_merges || (t->cfg.newline_runs_whole && all_newlines(word, len))) {
            int32_t id = tok_map_find(&t->map, &t->tab, word, len);
            if (id >= 0) return tok_ids_push(out, id, err);
        }
        if ((st = bpe_char_symbols(t, w, word, len, err)) != EMBER_OK) return st;
    }
    if (w->n_sym == 0) return EMBER_OK;

    for (int32_t i = 0; i + 1 < (int32_t)w->n_sym; i++)
        if ((st = bpe_consider(t, w, i, err)) != EMBER_OK) return st;
    while (w->n_heap > 0) {
        tok_pair e = heap_pop(w);
        tok_symbol *a = &w->sym[e.left];
        if (a->n == 0 || a->next < 0) continue;
        tok_symbol *b = &w->sym[a->next];
        int32_t rank, result;
        /* stale unless the pair still has a merge, and it is the one that was queued */
        if (!tok_merge_find(&t->merges, a->id, b->id, &rank, &result) || rank != e.rank) continue;
        a->id = result;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0) w->sym[b->next].prev = e.left;
        if ((st = bpe_consider(t, w, a->prev, err)) != EMBER_OK) return st;
        if ((st = bpe_consider(t, w, e.left, err)) != EMBER_OK) return st;
    }
    /* symbol 0 is never merged away (merges fold the right symbol into the left) */
    for (int32_t i = 0; i >= 0; i = w->sym[i].next)
        if ((st = tok_ids_push(out, w->sym[i].id, err)) != EMBER_OK) return st;
    return EMBER_OK;
}

/* ---- SentencePiece --------------------------------------------------------------------------- */

/* Queues (left, right) when their joined text is a token of the vocabulary. */
static ember_status spm_consider(const ember_tokenizer *t, tok_work *w, const char *run, int32_t left, int32_t right,
                                 ember_error *err) {
    if (left < 0 || right < 0) return EMBER_OK;
    const tok_symbol *l = &w->sym[left], *r = &w->sym[right];
    uint32_t size = l->n + r->n;
    int32_t id = tok_map_find(&t->map, &t->tab, run + l->start, size);
    if (id < 0) return EMBER_OK;
    tok_pair e = {t->tab.score[id], left, right, size, 0};
    return heap_push(w, e, err);
}

ember_status tok_spm_run(const ember_tokenizer *t, tok_work *w, const char *run, size_t len, tok_ids *out,
                         ember_error *err) {
    ember_status st;
    w->n_sym = 0;
    w->n_heap = 0;
    for (size_t i = 0; i < len;) {
        size_t cl = ember_utf8_seq_len((unsigned char)run[i]);
        if (cl > len - i) cl = len - i;
        if ((st = push_symbol(w, -1, (uint32_t)i, (uint32_t)cl, err)) != EMBER_OK) return st;
        i += cl;
    }
    if (w->n_sym == 0) return EMBER_OK;
    for (int32_t i = 0; i + 1 < (int32_t)w->n_sym; i++)
        if ((st = spm_consider(t, w, run, i, i + 1, err)) != EMBER_OK) return st;
    while (w->n_heap > 0) {
        tok_pair e = heap_pop(w);
        tok_symbol *l = &w->sym[e.left], *r = &w->sym[e.right];
        if (l->n == 0 || r->n == 0 || l->next != e.right || l->n + r->n != e.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = e.left;
        if ((st = spm_consider(t, w, run, l->prev, e.left, err)) != EMBER_OK) return st;
        if ((st = spm_consider(t, w, run, e.left, l->next, err)) != EMBER_OK) return st;
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
        const tok_symbol *s = &w->sym[i];
        int32_t id = tok_map_find(&t->map, &t->tab, run + s->start, s->n);
        if (id >= 0) {
            if ((st = tok_ids_push(out, id, err)) != EMBER_OK) return st;
            continue;
        }
        /* only a single character can be left without a token: spell it in byte tokens */
        for (uint32_t k = 0; k < s->n; k++) {
            unsigned char byte = (unsigned char)run[s->start + k];
            int32_t b = t->byte_fallback[byte] >= 0 ? t->byte_fallback[byte] : t->cfg.unk_id;
            if (b < 0)
                return ember_error_set(err, EMBER_ERR_FORMAT, "%s: no token for byte 0x%02X and no unknown token",
                                       t->source, byte);
            if ((st = tok_ids_push(out, b, err)) != EMBER_OK) return st;
        }
    }
    return EMBER_OK;
}
