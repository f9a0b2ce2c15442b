/* tokenizer.h — text <-> token ids for the four families: byte-level BPE (GPT-2, Qwen2/3, LLaMA 3),
 * SentencePiece-style BPE with byte fallback (Gemma), and SentencePiece scores (LLaMA 2 GGUF).
 *
 * One way in, the builder below: the Lua loader feeds it from a HuggingFace tokenizer.json (parsed
 * with lua-cjson), and the engine from the vocabulary embedded in a GGUF file
 * (ember_tokenizer_from_gguf, src/engine/tokenizer_gguf.c, declared in include/ember_internal.h).
 * A finished tokenizer is immutable and owns copies of every string, so it outlives its source
 * and may be used from several threads at once. Knows nothing of Lua, GGUF or the engine: it uses
 * only the kernels' types.h (the error slot), so its arrow points down to the bottom layer alone.
 *
 * Encoding, in order (each step only when the tokenizer's configuration asks for it):
 *   1. the text must be valid UTF-8;
 *   2. added tokens (special and user-defined) are cut out first, leftmost-longest; special ones
 *      only when parse_special is true;
 *   3. each remaining run is normalized: NFC, a prefix space, ' ' -> U+2581;
 *   4. it is split into words by the family's pattern (GPT-2, LLaMA 3, Qwen2, newline runs);
 *   5. each word is merged by the model: BPE by merge rank (lowest first, leftmost on ties) or
 *      SentencePiece by token score (highest first, leftmost on ties); symbols that form no token
 *      fall back to <0xNN> byte tokens.
 */
#ifndef EMBER_TOKENIZER_H
#define EMBER_TOKENIZER_H

#include "types.h"

typedef struct ember_tokenizer ember_tokenizer;

/* ---- token attributes ------------------------------------------------------------------------ */

/* One kind per token (low bits) plus matching flags for added tokens (high bits). The kinds are
 * GGUF's tokenizer.ggml.token_type values. */
enum {
    EMBER_TOKEN_NORMAL = 1,
    EMBER_TOKEN_UNKNOWN = 2,
    EMBER_TOKEN_CONTROL = 3,      /* special: matched in text only when parse_special */
    EMBER_TOKEN_USER_DEFINED = 4, /* added but not special: always matched in text */
    EMBER_TOKEN_UNUSED = 5,
    EMBER_TOKEN_BYTE = 6, /* <0xNN>: stands for one raw byte */
    EMBER_TOKEN_KIND_MASK = 0xFF,
    EMBER_TOKEN_LSTRIP = 1u << 8,      /* an added token that swallows whitespace on its left */
    EMBER_TOKEN_RSTRIP = 1u << 9,      /* ... on its right */
    EMBER_TOKEN_SINGLE_WORD = 1u << 10 /* matched only when not inside a word */
};

/* ---- configuration --------------------------------------------------------------------------- */

typedef enum {
    EMBER_TOK_MODEL_BPE = 0, /* merges with ranks */
    EMBER_TOK_MODEL_SPM      /* SentencePiece: merge the adjacent pair whose token scores highest */
} ember_tok_model;

typedef enum {
    EMBER_TOK_PRE_NONE = 0, /* the whole run is one word */
    EMBER_TOK_PRE_GPT2,     /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    EMBER_TOK_PRE_LLAMA3,   /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
                               \s*[\r\n]+|\s+(?!\S)|\s+ */
    EMBER_TOK_PRE_QWEN2,    /* the LLaMA 3 pattern with \p{N} (one digit per word) */
    EMBER_TOK_PRE_NEWLINES  /* [^\n]+|[\n]+ (Gemma 4 in GGUF) */
} ember_tok_pre;

typedef struct {
    ember_tok_model model;
    ember_tok_pre pre;
    bool nfc;                       /* normalize each text run to NFC (Qwen2/3) */
    bool add_space_prefix;          /* prepend ' ' to each text run (SentencePiece "▁" prefix) */
    bool escape_spaces;             /* ' ' -> U+2581 before merging (SentencePiece style) */
    bool byte_level;                /* symbols are GPT-2 byte-alphabet characters, one per byte */
    bool byte_fallback;             /* a symbol with no token becomes its <0xNN> byte tokens */
    bool ignore_merges;             /* a word that is itself a token is taken whole (LLaMA 3) */
    bool newline_runs_whole;        /* a newline-only word that is a token is taken whole (Gemma 4) */
    bool fuse_unk;                  /* consecutive unknown symbols become one unk token */
    bool decode_strip_space;        /* decode drops the one leading space the prefix added */
    bool add_bos;                   /* the family's default for encode(add_bos) */
    int32_t bos_id, eos_id, unk_id; /* -1 when none */
} ember_tokenizer_config;

/* The configuration a tokenizer was built with (for provenance and tests). */
const ember_tokenizer_config *ember_tokenizer_get_config(const ember_tokenizer *t);

/* ---- building -------------------------------------------------------------------------------- */

typedef struct ember_tokenizer_builder ember_tokenizer_builder;

/* Ids are below this: no real vocabulary is that large (a reader may refuse a larger one early). */
#define EMBER_TOKENIZER_MAX_ID (1 << 24)

/* source names the file in every error message (e.g. "…/tokenizer.json"). */
ember_status ember_tokenizer_builder_new(const char *source, ember_tokenizer_builder **out, ember_error *err);
void ember_tokenizer_builder_free(ember_tokenizer_builder *b);
/* Adds token `id` (0 <= id < 2^24) with its vocabulary string, SentencePiece score and attributes.
 * Giving an id again with the same string updates its score and attributes (an added token that is
 * also in the vocabulary); with a different string it is an error. When two ids share a string,
 * text lookups find the later one. */
ember_status ember_tokenizer_builder_add_token(ember_tokenizer_builder *b, int64_t id, const char *text, size_t len,
                                               float score, unsigned attr, ember_error *err);
/* Appends one merge; its rank is the number of merges added before it. Both sides and their
 * concatenation must already be tokens. A repeated pair keeps its first rank. */
ember_status ember_tokenizer_builder_add_merge(ember_tokenizer_builder *b, const char *left, size_t llen,
                                               const char *right, size_t rlen, ember_error *err);
/* Validates and freezes; frees the builder whatever happens (*out is NULL on error). */
ember_status ember_tokenizer_builder_finish(ember_tokenizer_builder *b, const ember_tokenizer_config *cfg,
                                            ember_tokenizer **out, ember_error *err);

void ember_tokenizer_free(ember_tokenizer *t);

/* ---- using ----------------------------------------------------------------------------------- */

/* Token ids for text[0..len) into a malloc'd *ids (NULL when *n_ids is 0). Invalid UTF-8 is an
 * error naming the byte offset. add_bos prepends the BOS id (ignored when there is none). */
ember_status ember_tokenizer_encode(const ember_tokenizer *t, const char *text, size_t len, bool add_bos,
                                    bool parse_special, int32_t **ids, size_t *n_ids, ember_error *err);

/* Text of ids into a malloc'd, NUL-terminated *text (bytes exactly as the tokens spell them, which
 * for byte tokens need not be valid UTF-8). A leading BOS is not rendered when the tokenizer adds
 * BOS by default, so decode(encode(s)) == s for lossless families; special tokens elsewhere are
 * rendered as their text. An id out of range, or one that has no token, is an error. */
ember_status ember_tokenizer_decode(const ember_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len,
                                    ember_error *err);

int64_t ember_tokenizer_vocab_size(const ember_tokenizer *t);
/* The file the tokenizer was built from, as named in errors. */
const char *ember_tokenizer_source(const ember_tokenizer *t);
int32_t ember_tokenizer_bos(const ember_tokenizer *t); /* -1 if none */
int32_t ember_tokenizer_eos(const ember_tokenizer *t); /* -1 if none */
bool ember_tokenizer_adds_bos(const ember_tokenizer *t);
/* Bytes the token contributes to decoded text (Ġ -> ' ', ▁ -> ' ', <0x0A> -> '\n', special tokens
 * as written); NULL for an id out of range or without a token. Not NUL-terminated. */
const char *ember_tokenizer_piece(const ember_tokenizer *t, int32_t id, size_t *len);
/* The token's string as the vocabulary writes it ("Ġthe", "▁the", "<0x0A>"); NULL as above. */
const char *ember_tokenizer_token_text(const ember_tokenizer *t, int32_t id, size_t *len);
/* EMBER_TOKEN_* attributes of id (0 for an id out of range or without a token). */
unsigned ember_tokenizer_token_attr(const ember_tokenizer *t, int32_t id);
/* Control and unknown tokens: what a streaming printer may choose to hide. */
bool ember_tokenizer_is_special(const ember_tokenizer *t, int32_t id);
/* The id whose vocabulary string is text[0..len), or -1. */
int32_t ember_tokenizer_find(const ember_tokenizer *t, const char *text, size_t len);

/* ---- streaming detokenizer ------------------------------------------------------------------- */

/* Feeds ids one at a time and hands back only complete UTF-8: a character split across tokens is
 * held until its last byte arrives, and bytes that can never form a character come out as U+FFFD,
 * so every returned chunk is valid UTF-8 on its own. */
typedef struct ember_detok_stream ember_detok_stream;

enum {
    EMBER_DETOK_SKIP_SPECIAL = 1u,        /* control/unknown tokens contribute nothing */
    EMBER_DETOK_STRIP_LEADING_SPACE = 2u, /* drop one leading space of the first piece when the
                                             tokenizer's prefix space put it there */
    EMBER_DETOK_AS_DECODE = 4u            /* the chunks plus the flush add up to
                                             ember_tokenizer_decode of the same ids, byte for byte:
                                             bytes that can never form a character pass through
                                             unchanged (not U+FFFD), the BOS the tokenizer adds is
                                             skipped when it is the first id, the first piece's
                                             prefix space is dropped as decode drops it. Only an
                                             unfinished character is held back. Other flags are
                                             ignored. */
};

ember_status ember_detok_stream_new(const ember_tokenizer *t, unsigned flags, ember_detok_stream **out,
                                    ember_error *err);
/* text, len: the newly completed text (possibly empty); valid until the next call on s. */
ember_status ember_detok_stream_push(ember_detok_stream *s, int32_t id, const char **text, size_t *len,
                                     ember_error *err);
/* Ends the stream: whatever incomplete bytes are held come out as U+FFFD (unchanged with
 * EMBER_DETOK_AS_DECODE); the stream restarts. */
void ember_detok_stream_flush(ember_detok_stream *s, const char **text, size_t *len);
void ember_detok_stream_reset(ember_detok_stream *s);
void ember_detok_stream_free(ember_detok_stream *s);

#endif
