/* tokenizer_internal.h — the tokenizer's data layout, shared by tokenizer*.c and nothing else.
 * Not an API: the bindings and the model see only tokenizer.h. */
#ifndef EMBER_TOKENIZER_INTERNAL_H
#define EMBER_TOKENIZER_INTERNAL_H

#include "tokenizer.h"

#define TOK_MAX_ID EMBER_TOKENIZER_MAX_ID
#define TOK_MAX_TOKEN_LEN 65536 /* bytes of one vocabulary string */
/* Longest text encode accepts: after ' ' -> U+2581 (3 bytes) it still fits the int32 symbol links
 * and uint32 offsets of the merge loop. */
#define TOK_MAX_TEXT_LEN ((size_t)256 << 20)

/* String -> id, open addressing; keys live in the token table, the map stores only ids. */
typedef struct {
    int32_t *slots; /* (cap) id or -1 */
    size_t cap;     /* power of two */
    size_t count;
} tok_str_map;

/* (left id, right id) -> (rank, merged id), open addressing. */
typedef struct {
    uint64_t key; /* (left << 32 | right) + 1; 0 marks an empty slot */
    int32_t rank;
    int32_t result;
} tok_merge_slot;

typedef struct {
    tok_merge_slot *slots; /* (cap) */
    size_t cap;            /* power of two */
    size_t count;
} tok_merge_map;

/* The token table, shared by builder and tokenizer: strings in one arena, per-id offsets. The
 * arena stays below 4 GiB (TOK_MAX_TEXT_BYTES), so offsets are 32-bit. */
#define TOK_MAX_TEXT_BYTES ((size_t)UINT32_MAX)
typedef struct {
    char *text; /* (text_used) all vocabulary strings, back to back, then the decoded
                           * pieces that differ from their token's string */
    size_t text_used, text_cap;
    uint32_t *off;  /* (n) start of id's string in text */
    uint32_t *len;  /* (n) its length */
    float *score;   /* (n) SentencePiece score, 0 elsewhere */
    uint16_t *attr; /* (n) EMBER_TOKEN_*; 0 = no token with this id */
    int64_t n, cap; /* ids 0..n-1 are addressable */
} tok_table;

struct ember_tokenizer {
    char *source; /* file named in errors */
    ember_tokenizer_config cfg;
    tok_table tab;
    tok_str_map map;
    tok_merge_map merges;
    uint32_t *piece_off;        /* (tab.n) start of the decoded piece in tab.text: the token's own
                                  * string when decoding leaves it as is (most tokens) */
    uint32_t *piece_len;        /* (tab.n) */
    int32_t byte_token[256];    /* byte-level: id of the alphabet character of each byte */
    int32_t byte_fallback[256]; /* id of <0xNN> for each byte, -1 when absent */
    /* The added tokens for leftmost-longest matching in raw text: ids sorted by their strings
     * (bytewise, a prefix before its extensions), one id per string (the highest, as a map that
     * lets the later id win). 4 bytes a token, where a byte trie cost ~50 for reserved tokens. */
    int32_t *added; /* (n_added) */
    int32_t n_added;
    int32_t added_first[257]; /* added[added_first[b] .. added_first[b + 1]) start with byte b */
    size_t added_max_len;     /* longest added token in bytes */
};

/* id -> entry of the builder's compact table, open addressing. */
typedef struct {
    int32_t *keys; /* (cap) id, -1 = empty */
    int32_t *vals; /* (cap) entry */
    size_t cap;    /* power of two */
    size_t count;
} tok_id_map;

/* While building, tab and map are indexed by entry (the order tokens were added), not by id;
 * finish() lays them out by id. */
struct ember_tokenizer_builder {
    char *source;
    tok_table tab;        /* compact: entry e at index e; tab.n = number of entries */
    int32_t *entry_id;    /* (tab.cap) the id of each entry */
    tok_id_map ids;       /* id -> entry; empty while in_order */
    bool in_order;        /* every entry e so far has id e (a GGUF vocabulary): no id map needed */
    int64_t max_id;       /* largest id given, -1 before any */
    tok_str_map map;      /* string -> entry */
    tok_merge_map merges; /* ids, as in the finished tokenizer */
    int32_t n_merges;
};

/* ---- tables and maps (tokenizer.c) ----------------------------------------------------------- */

int32_t tok_map_find(const tok_str_map *m, const tok_table *tab, const char *s, size_t len);
bool tok_merge_find(const tok_merge_map *m, int32_t left, int32_t right, int32_t *rank, int32_t *result);
uint64_t tok_hash_bytes(const char *s, size_t len);

static inline bool tok_has(const tok_table *tab, int64_t id) { return id >= 0 && id < tab->n && tab->attr[id] != 0; }

static inline unsigned tok_kind(const tok_table *tab, int32_t id) { return tab->attr[id] & EMBER_TOKEN_KIND_MASK; }

/* ---- growable id list ------------------------------------------------------------------------ */

typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids;

ember_status tok_ids_push(tok_ids *a, int32_t id, ember_error *err);

/* ---- per-call scratch (tokenizer_encode.c) --------------------------------------------------- */

typedef struct {
    int32_t id;     /* BPE: current token id; SPM: unused */
    uint32_t start; /* SPM: byte offset of the symbol in the run */
    uint32_t n;     /* SPM: byte length; 0 once merged away. BPE: 1 alive, 0 merged away */
    int32_t prev, next;
} tok_symbol;

typedef struct {
    tok_symbol *sym;
    size_t n_sym, cap_sym;
    void *heap; /* tok_pair (tokenizer_bpe.c): the candidate merges of either model */
    size_t n_heap, cap_heap;
    char *buf; /* scratch bytes: a word spelled in the byte alphabet */
    size_t cap_buf;
    char *run; /* the normalized text run being encoded */
    size_t cap_run;
    int32_t *cp;      /* code points of the run being split */
    uint8_t *fl;      /* their EMBER_CP_* classes */
    uint32_t *cp_off; /* byte offset of each code point, plus one past the end */
    size_t cap_cp;
} tok_work;

void tok_work_free(tok_work *w);
ember_status tok_work_reserve_buf(tok_work *w, size_t n, ember_error *err);

/* ---- models (tokenizer_bpe.c) ---------------------------------------------------------------- */

/* One word through BPE merges, ids appended to out. */
ember_status tok_bpe_word(const ember_tokenizer *t, tok_work *w, const char *word, size_t len, tok_ids *out,
                          ember_error *err);
/* One normalized run through SentencePiece score merges, ids appended to out. */
ember_status tok_spm_run(const ember_tokenizer *t, tok_work *w, const char *run, size_t len, tok_ids *out,
                         ember_error *err);

/* ---- pre-tokenizer (tokenizer_pretok.c) ------------------------------------------------------ */

/* End (exclusive, in code points) of the word that starts at code point i of cp[0..n) under
 * pattern pre; always > i. fl holds each code point's EMBER_CP_* classes. */
size_t tok_pretok_next(ember_tok_pre pre, const int32_t *cp, const uint8_t *fl, size_t n, size_t i);

#endif
