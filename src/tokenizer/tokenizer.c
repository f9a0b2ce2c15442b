/* tokenizer.c — the token table, its hash maps, the builder that fills them, and the accessors.
 * Must not tokenize (tokenizer_encode.c) or read files (the Lua loader, tokenizer_gguf.c). */
#include "tokenizer_internal.h"
#include "unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hashing --------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    /* splitmix64's finalizer: every input bit reaches every output bit. */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

uint64_t tok_hash_bytes(const char *s, size_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t k;
        memcpy(&k, s + i, 8);
        h = mix64(h ^ k);
    }
    uint64_t k = 0;
    memcpy(&k, s + i, len - i);
    return mix64(h ^ k ^ ((uint64_t)(len - i) << 59));
}

/* ---- errors ---------------------------------------------------------------------------------- */

/* A token string quoted for an error message: printable ASCII and UTF-8 as is, the rest \xNN,
 * cut short after ~48 bytes. */
static const char *tok_quote(char *dst, size_t cap, const char *s, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 48) {
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c != 0x7F && c != '\'' && c != '\\') {
            dst[o++] = (char)c;
        } else {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02X", c);
        }
    }
    dst[o] = '\0';
    return dst;
}

static ember_status tok_nomem(ember_error *err, const char *source) {
    return ember_error_set(err, EMBER_ERR_NOMEM, "%s: out of memory building the tokenizer", source);
}

/* ---- the token table -------------------------------------------------------------------------
 * While building, the table is compact: entry e (in the order tokens were added) has its string,
 * score and attributes at index e, and the builder keeps each entry's id. Only finish() lays the
 * table out by id, once it has checked that the ids are about as many as the tokens: a file with
 * one token at id 16,777,215 must not cost a 16M-entry table. Ids never given stay without a token
 * (attr 0). */

static void tok_table_free(tok_table *tab) {
    free(tab->text);
    free(tab->off);
    free(tab->len);
    free(tab->score);
    free(tab->attr);
    memset(tab, 0, sizeof *tab);
}

/* Room for exactly cap entries (attr of the new ones 0); also shrinks. */
static bool tok_table_resize(tok_table *tab, int64_t cap) {
    uint32_t *off = realloc(tab->off, (size_t)cap * sizeof *off);
    if (off) tab->off = off;
    uint32_t *len = realloc(tab->len, (size_t)cap * sizeof *len);
    if (len) tab->len = len;
    float *score = realloc(tab->score, (size_t)cap * sizeof *score);
    if (score) tab->score = score;
    uint16_t *attr = realloc(tab->attr, (size_t)cap * sizeof *attr);
    if (attr) tab->attr = attr;
    if (!off || !len || !score || !attr) return false;
    if (cap > tab->cap) memset(tab->attr + tab->cap, 0, (size_t)(cap - tab->cap) * sizeof *attr);
    tab->cap = cap;
    return true;
}

/* Room for entries 0..n (grown by doubling, while building). */
static bool tok_table_reserve(tok_table *tab, int64_t n) {
    if (n < tab->cap) return true;
    const size_t cap = ember_grow_cap((size_t)tab->cap, 1024, (size_t)n + 1);
    return cap && cap <= INT64_MAX && tok_table_resize(tab, (int64_t)cap);
}

/* Room for len more bytes of text (grown by doubling); false when out of memory or when the
 * arena would pass TOK_MAX_TEXT_BYTES (its offsets are 32-bit). */
static bool tok_table_reserve_text(tok_table *tab, size_t len) {
    if (len > TOK_MAX_TEXT_BYTES - 1 - tab->text_used) return false;
    if (tab->text_used + len + 1 <= tab->text_cap) return true;
    const size_t cap = ember_grow_cap(tab->text_cap, 65536, tab->text_used + len + 1);
    char *text = cap ? realloc(tab->text, cap) : NULL;
    if (!text) return false;
    tab->text = text;
    tab->text_cap = cap;
    return true;
}

static bool tok_table_append_text(tok_table *tab, const char *s, size_t len, uint32_t *off) {
    if (!tok_table_reserve_text(tab, len)) return false;
    memcpy(tab->text + tab->text_used, s, len);
    *off = (uint32_t)tab->text_used;
    tab->text_used += len;
    return true;
}

/* ---- string -> id map ------------------------------------------------------------------------
 * Open addressing with linear probing over ids: the strings stay in the arena, so the map costs 4
 * bytes a slot and a 262k vocabulary fits in 2 MB. Load factor stays at or below three quarters
 * (linear probing stays short there, and a 152k vocabulary takes 1 MB instead of 2). */

/* Whether a table of cap slots holding count entries must grow before one more goes in. */
static bool tok_load_full(size_t count, size_t cap) { return (count + 1) * 4 > cap * 3; }

int32_t tok_map_find(const tok_str_map *m, const tok_table *tab, const char *s, size_t len) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = tok_hash_bytes(s, len) & mask;; i = (i + 1) & mask) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        if (tab->len[id] == len && memcmp(tab->text + tab->off[id], s, len) == 0) return id;
    }
}

static bool tok_map_grow(tok_str_map *m, const tok_table *tab) {
    const size_t cap = ember_grow_cap(m->cap, 4096, m->cap + 1);
    int32_t *slots = cap ? malloc(cap * sizeof *slots) : NULL;
    if (!slots) return false;
    memset(slots, 0xFF, cap * sizeof *slots); /* all -1 */
    for (size_t i = 0; i < m->cap; i++) {
        int32_t id = m->slots[i];
        if (id < 0) continue;
        size_t j = tok_hash_bytes(tab->text + tab->off[id], tab->len[id]) & (cap - 1);
        while (slots[j] >= 0) j = (j + 1) & (cap - 1);
        slots[j] = id;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

/* Inserts id under its string; an id already holding that string is replaced (the later wins,
 * as in llama.cpp's token_to_id map). */
static bool tok_map_put(tok_str_map *m, const tok_table *tab, int32_t id) {
    if (tok_load_full(m->count, m->cap) && !tok_map_grow(m, tab)) return false;
    const char *s = tab->text + tab->off[id];
    size_t len = tab->len[id], mask = m->cap - 1;
    for (size_t i = tok_hash_bytes(s, len) & mask;; i = (i + 1) & mask) {
        int32_t cur = m->slots[i];
        if (cur < 0) {
            m->slots[i] = id;
            m->count++;
            return true;
        }
        if (tab->len[cur] == len && memcmp(tab->text + tab->off[cur], s, len) == 0) {
            m->slots[i] = id;
            return true;
        }
    }
}

/* ---- (left, right) -> merge map --------------------------------------------------------------
 * Merges are looked up by the ids of the two symbols, never by their strings: the merge loop then
 * does no string work at all. */

static uint64_t tok_merge_key(int32_t left, int32_t right) {
    return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
}

bool tok_merge_find(const tok_merge_map *m, int32_t left, int32_t right, int32_t *rank, int32_t *result) {
    if (!m->cap) return false;
    uint64_t key = tok_merge_key(left, right);
    size_t mask = m->cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        const tok_merge_slot *s = &m->slots[i];
        if (s->key == 0) return false;
        if (s->key == key) {
            *rank = s->rank;
            *result = s->result;
            return true;
        }
    }
}

static bool tok_merge_grow(tok_merge_map *m) {
    const size_t cap = ember_grow_cap(m->cap, 4096, m->cap + 1);
    tok_merge_slot *slots = cap ? calloc(cap, sizeof *slots) : NULL;
    if (!slots) return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        size_t j = mix64(m->slots[i].key) & (cap - 1);
        while (slots[j].key) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

/* Inserts unless the pair is already there (then the first rank stays, as in llama.cpp). */
static bool tok_merge_put(tok_merge_map *m, int32_t left, int32_t right, int32_t rank, int32_t result) {
    if (tok_load_full(m->count, m->cap) && !tok_merge_grow(m)) return false;
    uint64_t key = tok_merge_key(left, right);
    size_t mask = m->cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        tok_merge_slot *s = &m->slots[i];
        if (s->key == key) return true;
        if (s->key == 0) {
            s->key = key;
            s->rank = rank;
            s->result = result;
            m->count++;
            return true;
        }
    }
}

/* ---- id -> entry map (builder only) ----------------------------------------------------------- */

static int32_t tok_id_find(const tok_id_map *m, int64_t id) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = mix64((uint64_t)id) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] < 0) return -1;
        if (m->keys[i] == id) return m->vals[i];
    }
}

static bool tok_id_put(tok_id_map *m, int32_t id, int32_t entry) {
    if ((m->count + 1) * 2 > m->cap) {
        const size_t cap = ember_grow_cap(m->cap, 4096, m->cap + 1);
        int32_t *keys = cap ? malloc(cap * sizeof *keys) : NULL, *vals = cap ? malloc(cap * sizeof *vals) : NULL;
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return false;
        }
        memset(keys, 0xFF, cap * sizeof *keys); /* all -1 */
        for (size_t i = 0; i < m->cap; i++) {
            if (m->keys[i] < 0) continue;
            size_t j = mix64((uint64_t)m->keys[i]) & (cap - 1);
            while (keys[j] >= 0) j = (j + 1) & (cap - 1);
            keys[j] = m->keys[i];
            vals[j] = m->vals[i];
        }
        free(m->keys);
        free(m->vals);
        m->keys = keys;
        m->vals = vals;
        m->cap = cap;
    }
    size_t mask = m->cap - 1, i = mix64((uint64_t)id) & mask;
    while (m->keys[i] >= 0) i = (i + 1) & mask; /* callers add each id once */
    m->keys[i] = id;
    m->vals[i] = entry;
    m->count++;
    return true;
}

/* ---- builder --------------------------------------------------------------------------------- */

ember_status ember_tokenizer_builder_new(const char *source, ember_tokenizer_builder **out, ember_error *err) {
    *out = NULL;
    ember_tokenizer_builder *b = calloc(1, sizeof *b);
    char *src = strdup(source ? source : "tokenizer");
    if (!b || !src) {
        free(b);
        free(src);
        return tok_nomem(err, source ? source : "tokenizer");
    }
    b->source = src;
    b->max_id = -1;
    b->in_order = true;
    *out = b;
    return EMBER_OK;
}

void ember_tokenizer_builder_free(ember_tokenizer_builder *b) {
    if (!b) return;
    tok_table_free(&b->tab);
    free(b->entry_id);
    free(b->ids.keys);
    free(b->ids.vals);
    free(b->map.slots);
    free(b->merges.slots);
    free(b->source);
    free(b);
}

ember_status ember_tokenizer_builder_add_token(ember_tokenizer_builder *b, int64_t id, const char *text, size_t len,
                                               float score, unsigned attr, ember_error *err) {
    char q1[256], q2[256];
    unsigned kind = attr & EMBER_TOKEN_KIND_MASK;
    if (id < 0 || id >= TOK_MAX_ID)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: token id %lld is out of range (0..%d)", b->source,
                               (long long)id, TOK_MAX_ID - 1);
    if (kind < EMBER_TOKEN_NORMAL || kind > EMBER_TOKEN_BYTE)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: token %lld has an unknown token type %u", b->source,
                               (long long)id, kind);
    if (len > TOK_MAX_TOKEN_LEN)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: token %lld is %zu bytes long (limit %d)", b->source,
                               (long long)id, len, TOK_MAX_TOKEN_LEN);
    tok_table *tab = &b->tab;
    /* while ids come in order, id n is new and id < n is entry id: the id map is made only when
     * the first id out of order arrives */
    if (b->in_order && id > b->tab.n) {
        for (int64_t k = 0; k < b->tab.n; k++)
            if (!tok_id_put(&b->ids, (int32_t)k, (int32_t)k)) return tok_nomem(err, b->source);
        b->in_order = false;
    }
    int32_t e = b->in_order ? (id < b->tab.n ? (int32_t)id : -1) : tok_id_find(&b->ids, id);
    if (e >= 0) {
        const char *old = tab->text + tab->off[e];
        if (tab->len[e] != len || memcmp(old, text, len) != 0)
            return ember_error_set(err, EMBER_ERR_FORMAT, "%s: token id %lld is both '%s' and '%s'", b->source,
                                   (long long)id, tok_quote(q1, sizeof q1, old, tab->len[e]),
                                   tok_quote(q2, sizeof q2, text, len));
        tab->attr[e] = (uint16_t)attr;
        tab->score[e] = score;
        return EMBER_OK;
    }
    uint32_t off;
    int64_t old_cap = tab->cap;
    e = (int32_t)tab->n;
    if (!tok_table_reserve(tab, e) || !tok_table_append_text(tab, text, len, &off)) return tok_nomem(err, b->source);
    if (tab->cap != old_cap) {
        int32_t *ids = realloc(b->entry_id, (size_t)tab->cap * sizeof *ids);
        if (!ids) return tok_nomem(err, b->source);
        b->entry_id = ids;
    }
    tab->off[e] = off;
    tab->len[e] = (uint32_t)len;
    tab->score[e] = score;
    tab->attr[e] = (uint16_t)attr;
    b->entry_id[e] = (int32_t)id;
    tab->n = e + 1;
    if (id > b->max_id) b->max_id = id;
    if ((!b->in_order && !tok_id_put(&b->ids, (int32_t)id, e)) || !tok_map_put(&b->map, tab, e))
        return tok_nomem(err, b->source);
    return EMBER_OK;
}

ember_status ember_tokenizer_builder_add_merge(ember_tokenizer_builder *b, const char *left, size_t llen,
                                               const char *right, size_t rlen, ember_error *err) {
    char q[256];
    tok_table *tab = &b->tab;
    int32_t rank = b->n_merges;
    int32_t l = tok_map_find(&b->map, tab, left, llen);
    if (l < 0)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: merge %d names a token that is not in the vocabulary: '%s'",
                               b->source, rank, tok_quote(q, sizeof q, left, llen));
    int32_t r = tok_map_find(&b->map, tab, right, rlen);
    if (r < 0)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: merge %d names a token that is not in the vocabulary: '%s'",
                               b->source, rank, tok_quote(q, sizeof q, right, rlen));
    if (llen + rlen > TOK_MAX_TOKEN_LEN)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: merge %d is too long", b->source, rank);
    /* The merged string goes through the arena's spare room, so no other buffer is needed. */
    uint32_t off;
    if (!tok_table_append_text(tab, left, llen, &off) || !tok_table_append_text(tab, right, rlen, &off))
        return tok_nomem(err, b->source);
    tab->text_used -= llen + rlen;
    int32_t m = tok_map_find(&b->map, tab, tab->text + tab->text_used, llen + rlen);
    if (m < 0)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: merge %d makes '%s', which is not in the vocabulary",
                               b->source, rank, tok_quote(q, sizeof q, tab->text + tab->text_used, llen + rlen));
    if (!tok_merge_put(&b->merges, b->entry_id[l], b->entry_id[r], rank, b->entry_id[m]))
        return tok_nomem(err, b->source);
    b->n_merges++;
    return EMBER_OK;
}

/* Ids may leave gaps (a padded vocabulary), but not many: beyond this the ids are refused. */
static bool tok_ids_dense_enough(int64_t max_id, int64_t n_tokens) { return max_id < 2 * n_tokens + 1024; }

/* The compact table laid out by id (exactly max_id + 1 entries), and the string map re-pointed
 * from entries to ids. When entry e already is id e (a GGUF vocabulary, or a tokenizer.json whose
 * ids came in order), the builder's arrays are the answer: they move over, trimmed, and no second
 * table exists even for a moment. */
static ember_status tok_table_by_id(ember_tokenizer_builder *b, tok_table *out, ember_error *err) {
    tok_table *c = &b->tab;
    memset(out, 0, sizeof *out);
    if (!tok_ids_dense_enough(b->max_id, c->n))
        return ember_error_set(err, EMBER_ERR_FORMAT,
                               "%s: token ids go up to %lld but only %lld tokens are given (ids must be about "
                               "contiguous: at most %lld for this many tokens)",
                               b->source, (long long)b->max_id, (long long)c->n, (long long)(2 * c->n + 1023));
    if (b->in_order) {
        if (!tok_table_resize(c, c->n)) return tok_nomem(err, b->source);
        *out = *c;
        memset(c, 0, sizeof *c);
        return EMBER_OK; /* the map's entries are its ids already */
    }
    if (!tok_table_resize(out, b->max_id + 1)) {
        tok_table_free(out);
        return tok_nomem(err, b->source);
    }
    for (int64_t e = 0; e < c->n; e++) {
        int32_t id = b->entry_id[e];
        out->off[id] = c->off[e];
        out->len[id] = c->len[e];
        out->score[id] = c->score[e];
        out->attr[id] = c->attr[e];
    }
    out->n = b->max_id + 1;
    /* the text arena moves over unchanged */
    out->text = c->text;
    out->text_used = c->text_used;
    out->text_cap = c->text_cap;
    c->text = NULL;
    /* slots stay where they are: their position depends only on the string */
    for (size_t i = 0; i < b->map.cap; i++)
        if (b->map.slots[i] >= 0) b->map.slots[i] = b->entry_id[b->map.slots[i]];
    return EMBER_OK;
}

/* ---- finishing -------------------------------------------------------------------------------
 * finish() derives everything encode and decode need so they never search: the byte tokens, the
 * sorted added tokens, and every token's decoded text. */

/* "<0xNN>" (upper-case hex, SentencePiece's byte token spelling) -> the byte, else -1. */
static int tok_parse_byte_token(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    return v;
}

/* The table the added ids being sorted index: qsort takes no context argument, and a sort runs
 * within one call on one thread. */
static _Thread_local const tok_table *tok_sort_tab;

/* Bytewise, a prefix before its extensions, then by id. */
static int tok_added_cmp(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const tok_table *tab = tok_sort_tab;
    uint32_t la = tab->len[a], lb = tab->len[b];
    int c = memcmp(tab->text + tab->off[a], tab->text + tab->off[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return (a > b) - (a < b);
}

/* Whether id is cut out of text before merging: a non-empty control, user-defined or unknown token. */
static bool tok_is_added(const tok_table *tab, int64_t id) {
    unsigned kind = tab->attr[id] & EMBER_TOKEN_KIND_MASK;
    return tab->len[id] > 0 &&
           (kind == EMBER_TOKEN_CONTROL || kind == EMBER_TOKEN_USER_DEFINED || kind == EMBER_TOKEN_UNKNOWN);
}

/* t->added and t->added_first from the control, user-defined and unknown tokens (the ones cut out
 * of text before merging). Of several ids with one string the highest is kept. */
static ember_status tok_build_added(ember_tokenizer *t) {
    int64_t n = 0;
    for (int64_t id = 0; id < t->tab.n; id++) n += tok_is_added(&t->tab, id);
    for (int b = 0; b <= 256; b++) t->added_first[b] = 0;
    if (n == 0) return EMBER_OK;
    if (!(t->added = malloc((size_t)n * sizeof *t->added))) return EMBER_ERR_NOMEM;
    int64_t k = 0;
    for (int64_t id = 0; id < t->tab.n; id++)
        if (tok_is_added(&t->tab, id)) t->added[k++] = (int32_t)id;
    tok_sort_tab = &t->tab;
    qsort(t->added, (size_t)n, sizeof *t->added, tok_added_cmp);
    tok_sort_tab = NULL;
    const tok_table *tab = &t->tab;
    int32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        /* equal strings sort by id: the last of a run is the highest */
        int32_t id = t->added[i], nx = i + 1 < n ? t->added[i + 1] : -1;
        const char *s = tab->text + tab->off[id];
        if (nx >= 0 && tab->len[nx] == tab->len[id] && memcmp(tab->text + tab->off[nx], s, tab->len[id]) == 0) continue;
        t->added[m++] = id;
        t->added_first[(unsigned char)s[0] + 1] = m; /* one past the last with this byte */
        if (tab->len[id] > t->added_max_len) t->added_max_len = tab->len[id];
    }
    t->n_added = m;
    /* the ends found above, made monotone: a byte no token starts with gets an empty range */
    for (int b = 1; b <= 256; b++)
        if (t->added_first[b] < t->added_first[b - 1]) t->added_first[b] = t->added_first[b - 1];
    int32_t *trimmed = realloc(t->added, (size_t)m * sizeof *trimmed);
    if (trimmed) t->added = trimmed;
    return EMBER_OK;
}

/* What the token contributes to decoded text: written after the arena's last byte, and kept
 * there only when it differs from the token's own string (else the piece is that string). */
static bool tok_make_piece(ember_tokenizer *t, int32_t id) {
    tok_table *tab = &t->tab;
    size_t len = tab->len[id];
    if (!tok_table_reserve_text(tab, len + 4)) return false; /* may move the arena: s comes after */
    const char *s = tab->text + tab->off[id];
    unsigned kind = tok_kind(tab, id);
    char *dst = tab->text + tab->text_used;
    size_t n = 0;
    int byte = tok_parse_byte_token(s, len);
    bool sentencepiece = t->cfg.model == EMBER_TOK_MODEL_SPM || t->cfg.byte_fallback;
    if (byte >= 0 && (kind == EMBER_TOKEN_BYTE || (sentencepiece && kind != EMBER_TOKEN_CONTROL))) {
        dst[n++] = (char)byte;
    } else if (kind == EMBER_TOKEN_CONTROL || kind == EMBER_TOKEN_UNKNOWN) {
        memcpy(dst, s, len); /* special tokens read as written */
        n = len;
    } else if (t->cfg.byte_level) {
        /* every character must be in the byte alphabet, else the string stands for itself
         * (HF's ByteLevel decoder does the same) */
        size_t i = 0;
        while (i < len) {
            int32_t cp;
            size_t l = ember_utf8_decode(s + i, len - i, &cp);
            int b = l ? ember_cp_to_byte(cp) : -1;
            if (b < 0) break;
            dst[n++] = (char)b;
            i += l;
        }
        if (i < len) {
            memcpy(dst, s, len);
            n = len;
        }
    } else if (t->cfg.escape_spaces) {
        for (size_t i = 0; i < len; i++) {
            if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) { /* U+2581 -> ' ' */
                dst[n++] = ' ';
                i += 2;
            } else {
                dst[n++] = s[i];
            }
        }
    } else {
        memcpy(dst, s, len);
        n = len;
    }
    t->piece_len[id] = (uint32_t)n;
    if (n == len && memcmp(dst, s, n) == 0) {
        t->piece_off[id] = tab->off[id];
    } else {
        t->piece_off[id] = (uint32_t)tab->text_used;
        tab->text_used += n;
    }
    return true;
}

static ember_status tok_check_special_id(const ember_tokenizer *t, const char *what, int32_t id, ember_error *err) {
    if (id == -1 || tok_has(&t->tab, id)) return EMBER_OK;
    return ember_error_set(err, EMBER_ERR_FORMAT, "%s: the %s id %d is not a token of the vocabulary", t->source, what,
                           id);
}

/* The configuration against the vocabulary: special ids in range, BOS named when added, no
 * byte-level BPE with U+2581 spaces. */
static ember_status check_config(const ember_tokenizer *t, const ember_tokenizer_config *cfg, ember_error *err) {
    ember_status st;
    if (t->tab.n <= 0) return ember_error_set(err, EMBER_ERR_FORMAT, "%s: the vocabulary is empty", t->source);
    if ((st = tok_check_special_id(t, "BOS", cfg->bos_id, err)) != EMBER_OK ||
        (st = tok_check_special_id(t, "EOS", cfg->eos_id, err)) != EMBER_OK ||
        (st = tok_check_special_id(t, "unknown-token", cfg->unk_id, err)) != EMBER_OK)
        return st;
    if (cfg->add_bos && cfg->bos_id < 0)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: the tokenizer adds BOS but names no BOS token", t->source);
    if (cfg->model == EMBER_TOK_MODEL_BPE && cfg->byte_level && cfg->escape_spaces)
        return ember_error_set(err, EMBER_ERR_UNSUPPORTED, "%s: byte-level BPE with U+2581 spaces is not supported",
                               t->source);
    return EMBER_OK;
}

/* Each byte's token: its byte-level character (required when byte-level) and its <0xNN> fallback
 * (SentencePiece: else the byte's own one-character token, as llama.cpp does). */
static ember_status find_byte_tokens(ember_tokenizer *t, const ember_tokenizer_config *cfg, ember_error *err) {
    char q[64];
    for (int b8 = 0; b8 < 256; b8++) {
        char s[8];
        t->byte_token[b8] = -1;
        if (cfg->byte_level) {
            size_t l = ember_utf8_encode(ember_byte_to_cp((uint8_t)b8), s);
            t->byte_token[b8] = tok_map_find(&t->map, &t->tab, s, l);
            if (t->byte_token[b8] < 0)
                return ember_error_set(err, EMBER_ERR_FORMAT,
                                       "%s: byte-level vocabulary has no token for byte 0x%02X ('%s')", t->source, b8,
                                       tok_quote(q, sizeof q, s, l));
        }
        snprintf(s, sizeof s, "<0x%02X>", b8);
        t->byte_fallback[b8] = tok_map_find(&t->map, &t->tab, s, 6);
        if (t->byte_fallback[b8] < 0 && cfg->model == EMBER_TOK_MODEL_SPM && b8 < 0x80) {
            s[0] = (char)b8;
            t->byte_fallback[b8] = tok_map_find(&t->map, &t->tab, s, 1);
        }
    }
    return EMBER_OK;
}

/* Every id's decoded piece, into the arena. */
static ember_status make_pieces(ember_tokenizer *t, ember_error *err) {
    if (t->tab.n <= 0 || t->tab.n > TOK_MAX_ID) /* cannot happen: add_token bounds ids */
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: bad vocabulary size", t->source);
    size_t n_ids = (size_t)t->tab.n;
    t->piece_off = malloc(n_ids * sizeof *t->piece_off);
    t->piece_len = calloc(n_ids, sizeof *t->piece_len);
    if (!t->piece_off || !t->piece_len) return tok_nomem(err, t->source);
    for (int64_t id = 0; id < t->tab.n; id++) {
        t->piece_off[id] = 0;
        if (!tok_has(&t->tab, id)) continue;
        if (!tok_make_piece(t, (int32_t)id)) return tok_nomem(err, t->source);
    }
    return EMBER_OK;
}

ember_status ember_tokenizer_builder_finish(ember_tokenizer_builder *b, const ember_tokenizer_config *cfg,
                                            ember_tokenizer **out, ember_error *err) {
    *out = NULL;
    ember_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        ember_status st = tok_nomem(err, b->source);
        ember_tokenizer_builder_free(b);
        return st;
    }
    ember_status st = EMBER_OK;
    if (b->tab.n > 0 && (st = tok_table_by_id(b, &t->tab, err)) != EMBER_OK) {
        ember_tokenizer_builder_free(b);
        free(t);
        return st;
    }
    /* Take everything from the builder, then free its shell. */
    t->source = b->source;
    t->map = b->map;
    t->merges = b->merges;
    t->cfg = *cfg;
    b->source = NULL;
    memset(&b->map, 0, sizeof b->map);
    memset(&b->merges, 0, sizeof b->merges);
    ember_tokenizer_builder_free(b);

    if ((st = check_config(t, cfg, err)) != EMBER_OK || (st = find_byte_tokens(t, cfg, err)) != EMBER_OK) goto fail;

    /* Added tokens: control, user-defined and unknown tokens are cut out of text before merging. */
    if ((st = tok_build_added(t)) != EMBER_OK) {
        ember_error_set(err, st, "%s: out of memory building the tokenizer", t->source);
        goto fail;
    }

    if ((st = make_pieces(t, err)) != EMBER_OK) goto fail;
    /* the arena is complete: give back its doubling slack (the spare byte stays, so a vocabulary
     * of empty strings still has a valid base pointer) */
    char *fitted = realloc(t->tab.text, t->tab.text_used + 1);
    if (fitted) {
        t->tab.text = fitted;
        t->tab.text_cap = t->tab.text_used + 1;
    }
    *out = t;
    return EMBER_OK;

fail:
    ember_tokenizer_free(t);
    return st;
}

void ember_tokenizer_free(ember_tokenizer *t) {
    if (!t) return;
    tok_table_free(&t->tab);
    free(t->map.slots);
    free(t->merges.slots);
    free(t->piece_off);
    free(t->piece_len);
    free(t->added);
    free(t->source);
    free(t);
}

/* ---- accessors ------------------------------------------------------------------------------- */

const ember_tokenizer_config *ember_tokenizer_get_config(const ember_tokenizer *t) { return &t->cfg; }
int64_t ember_tokenizer_vocab_size(const ember_tokenizer *t) { return t->tab.n; }
const char *ember_tokenizer_source(const ember_tokenizer *t) { return t->source ? t->source : "tokenizer"; }
int32_t ember_tokenizer_bos(const ember_tokenizer *t) { return t->cfg.bos_id; }
int32_t ember_tokenizer_eos(const ember_tokenizer *t) { return t->cfg.eos_id; }
bool ember_tokenizer_adds_bos(const ember_tokenizer *t) { return t->cfg.add_bos; }

const char *ember_tokenizer_piece(const ember_tokenizer *t, int32_t id, size_t *len) {
    if (!tok_has(&t->tab, id)) return NULL;
    *len = t->piece_len[id];
    return t->tab.text + t->piece_off[id];
}

const char *ember_tokenizer_token_text(const ember_tokenizer *t, int32_t id, size_t *len) {
    if (!tok_has(&t->tab, id)) return NULL;
    *len = t->tab.len[id];
    return t->tab.text + t->tab.off[id];
}

unsigned ember_tokenizer_token_attr(const ember_tokenizer *t, int32_t id) {
    return tok_has(&t->tab, id) ? t->tab.attr[id] : 0;
}

bool ember_tokenizer_is_special(const ember_tokenizer *t, int32_t id) {
    if (!tok_has(&t->tab, id)) return false;
    unsigned kind = tok_kind(&t->tab, id);
    return kind == EMBER_TOKEN_CONTROL || kind == EMBER_TOKEN_UNKNOWN;
}

int32_t ember_tokenizer_find(const ember_tokenizer *t, const char *text, size_t len) {
    return tok_map_find(&t->map, &t->tab, text, len);
}

ember_status tok_ids_push(tok_ids *a, int32_t id, ember_error *err) {
    if (a->n == a->cap) {
        const size_t cap = ember_grow_cap(a->cap, 64, a->cap + 1);
        int32_t *v = cap ? realloc(a->v, cap * sizeof *v) : NULL;
        if (!v) return ember_error_set(err, EMBER_ERR_NOMEM, "tokenizer: out of memory for token ids");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return EMBER_OK;
}
