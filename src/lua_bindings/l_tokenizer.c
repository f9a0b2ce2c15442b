/* l_tokenizer.c — ember.Tokenizer and ember.DetokStream, and the C end of the tokenizer.json loader.
 * Must not parse JSON or interpret tokenizer.json (lib/ember/model/tokenizer.lua does): it receives the
 * decoded tables and a flat configuration, and feeds them to the engine's builder. */
#include "l_tokenizer.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ember_internal.h"
#include "l_model.h"
#include "lbind.h"

#define CLOSED_MSG "attempt to use a closed tokenizer"

/* A tokenizer userdata starts closed (t == NULL) and is opened once the engine object exists. */
typedef struct {
    ember_tokenizer *t;
} ltok;

/* A stream keeps its tokenizer userdata in user value 1, and checks it is still open on use. */
typedef struct {
    ember_detok_stream *s;
    ltok *owner;
} lstream;

/* Raises msg as is: engine messages already name the file and the problem, and a position
 * prefix ("file.lua:12:") would only point into the loader. */
static int raise_plain(lua_State *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    return lua_error(L);
}

/* ---- the tokenizer userdata ------------------------------------------------------------------- */

static ltok *push_closed_tokenizer(lua_State *L) {
    ltok *u = lua_newuserdatauv(L, sizeof *u, 0); /* [tok] */
    u->t = NULL;
    luaL_setmetatable(L, EMBER_LUA_TOKENIZER);
    return u;
}

void ember_lua_push_tokenizer(lua_State *L, ember_tokenizer *t) { push_closed_tokenizer(L)->t = t; }

ember_tokenizer *ember_lua_check_tokenizer(lua_State *L, int idx) {
    ltok *u = luaL_checkudata(L, idx, EMBER_LUA_TOKENIZER);
    if (!u->t) luaL_error(L, CLOSED_MSG);
    return u->t;
}

static int tok_close(lua_State *L) {
    ltok *u = luaL_checkudata(L, 1, EMBER_LUA_TOKENIZER);
    ember_tokenizer_free(u->t);
    u->t = NULL;
    return 0;
}

static int tok_tostring(lua_State *L) {
    ltok *u = luaL_checkudata(L, 1, EMBER_LUA_TOKENIZER);
    if (!u->t) lua_pushstring(L, "ember.Tokenizer (closed)");
    else lua_pushfstring(L, "ember.Tokenizer (%I tokens)", (lua_Integer)ember_tokenizer_vocab_size(u->t));
    return 1;
}

/* Reads an optional boolean option; a non-boolean raises naming the caller and the key. */
static int opt_bool(lua_State *L, int opts, const char *fname, const char *key, int def) {
    if (!opts) return def;
    lua_getfield(L, opts, key); /* [.., v] */
    int v = def;
    if (!lua_isnil(L, -1)) {
        if (!lua_isboolean(L, -1))
            luaL_error(L, "bad argument to '%s' (option '%s' must be a boolean, got %s)", fname, key,
                       luaL_typename(L, -1));
        v = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

/* 0 for an absent or nil options argument, else its absolute index (which must hold a table). */
static int opts_index(lua_State *L, int idx, const char *fname, const char *const *valid) {
    if (idx == 0 || lua_isnoneornil(L, idx)) return 0;
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        luaL_error(L, "bad argument to '%s' (options must be a table, got %s)", fname, luaL_typename(L, idx));
    ember_lua_check_options(L, idx, fname, valid);
    return idx;
}

int ember_lua_tokenizer_encode(lua_State *L, ember_tokenizer *t, int text_idx, int opts_idx, const char *fname) {
    static const char *const valid[] = {"bos", "special", NULL};
    if (lua_type(L, text_idx) != LUA_TSTRING) /* checked first: lua_tolstring would convert numbers */
        luaL_error(L, "bad argument to '%s' (text must be a string, got %s)", fname, luaL_typename(L, text_idx));
    size_t len;
    const char *text = lua_tolstring(L, text_idx, &len);
    int opts = opts_index(L, opts_idx, fname, valid);
    bool bos = opt_bool(L, opts, fname, "bos", ember_tokenizer_adds_bos(t));
    bool special = opt_bool(L, opts, fname, "special", 1);

    void **box = ember_lua_box(L, free); /* [.., box]: owns the ids if anything below raises */
    int32_t *ids;
    size_t n;
    ember_error err = {0};
    if (ember_tokenizer_encode(t, text, len, bos, special, &ids, &n, &err) != EMBER_OK)
        return raise_plain(L, "%s", err.msg);
    *box = ids;
    luaL_checkstack(L, 2, "encode");
    lua_createtable(L, n > INT32_MAX ? INT32_MAX : (int)n, 0); /* [.., box, ids] */
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    free(ids);
    *box = NULL;
    lua_remove(L, -2); /* [.., ids] */
    return 1;
}

int ember_lua_tokenizer_decode(lua_State *L, ember_tokenizer *t, int ids_idx, int opts_idx, const char *fname) {
    static const char *const valid[] = {"special", NULL};
    ids_idx = lua_absindex(L, ids_idx);
    if (!lua_istable(L, ids_idx))
        luaL_error(L, "bad argument to '%s' (ids must be a table of integers, got %s)", fname,
                   luaL_typename(L, ids_idx));
    int opts = opts_index(L, opts_idx, fname, valid);
    bool special = opt_bool(L, opts, fname, "special", 1);

    lua_Unsigned n = lua_rawlen(L, ids_idx);
    void **box = ember_lua_box(L, free); /* [.., box] */
    int32_t *ids = malloc((n ? (size_t)n : 1) * sizeof *ids);
    if (!ids) return luaL_error(L, "%s: out of memory", fname);
    *box = ids;
    size_t m = 0;
    for (lua_Unsigned i = 1; i <= n; i++) {
        lua_rawgeti(L, ids_idx, (lua_Integer)i);
        int isint;
        lua_Integer id = lua_tointegerx(L, -1, &isint);
        lua_pop(L, 1);
        if (!isint || id < INT32_MIN || id > INT32_MAX)
            return luaL_error(L, "bad argument to '%s' (ids[%I] is not a token id)", fname, (lua_Integer)i);
        /* special = false leaves control tokens out of the text */
        if (!special && ember_tokenizer_is_special(t, (int32_t)id)) continue;
        ids[m++] = (int32_t)id;
    }
    char *text;
    size_t len;
    ember_error err = {0};
    if (ember_tokenizer_decode(t, ids, m, &text, &len, &err) != EMBER_OK) return raise_plain(L, "%s", err.msg);
    free(ids);
    *box = text;
    lua_pushlstring(L, text, len); /* [.., box, text] */
    free(text);
    *box = NULL;
    lua_remove(L, -2);
    return 1;
}

static int tok_encode(lua_State *L) {
    ember_tokenizer *t = ember_lua_check_tokenizer(L, 1);
    luaL_checktype(L, 2, LUA_TSTRING);
    return ember_lua_tokenizer_encode(L, t, 2, 3, "encode");
}

static int tok_decode(lua_State *L) {
    ember_tokenizer *t = ember_lua_check_tokenizer(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    return ember_lua_tokenizer_decode(L, t, 2, 3, "decode");
}

/* tok:token(id) -> the text the token stands for, and its vocabulary string; nil if no token. */
static int tok_token(lua_State *L) {
    ember_tokenizer *t = ember_lua_check_tokenizer(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    size_t plen, rlen;
    const char *piece = id >= 0 && id <= INT32_MAX ? ember_tokenizer_piece(t, (int32_t)id, &plen) : NULL;
    if (!piece) {
        lua_pushnil(L);
        return 1;
    }
    const char *raw = ember_tokenizer_token_text(t, (int32_t)id, &rlen);
    lua_pushlstring(L, piece, plen);
    lua_pushlstring(L, raw, rlen);
    return 2;
}

/* tok:find(s) -> the id whose vocabulary string is s, or nil. */
static int tok_find(lua_State *L) {
    ember_tokenizer *t = ember_lua_check_tokenizer(L, 1);
    size_t len;
    const char *s = luaL_checklstring(L, 2, &len);
    int32_t id = ember_tokenizer_find(t, s, len);
    if (id < 0) lua_pushnil(L);
    else lua_pushinteger(L, id);
    return 1;
}

/* tok:is_special(id) -> true for control and unknown tokens. */
static int tok_is_special(lua_State *L) {
    ember_tokenizer *t = ember_lua_check_tokenizer(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    lua_pushboolean(L, id >= 0 && id <= INT32_MAX && ember_tokenizer_is_special(t, (int32_t)id));
    return 1;
}

static void push_id_or_nil(lua_State *L, int32_t id) {
    if (id < 0) lua_pushnil(L);
    else lua_pushinteger(L, id);
}

static int get_vocab_size(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)ember_tokenizer_vocab_size(ember_lua_check_tokenizer(L, 1)));
    return 1;
}

static int get_bos_id(lua_State *L) {
    push_id_or_nil(L, ember_tokenizer_bos(ember_lua_check_tokenizer(L, 1)));
    return 1;
}

static int get_eos_id(lua_State *L) {
    push_id_or_nil(L, ember_tokenizer_eos(ember_lua_check_tokenizer(L, 1)));
    return 1;
}

static int get_adds_bos(lua_State *L) {
    lua_pushboolean(L, ember_tokenizer_adds_bos(ember_lua_check_tokenizer(L, 1)));
    return 1;
}

/* ---- streaming -------------------------------------------------------------------------------- */

static lstream *check_stream(lua_State *L, int idx) {
    lstream *s = luaL_checkudata(L, idx, EMBER_LUA_DETOK);
    if (!s->s) luaL_error(L, "attempt to use a closed detokenizer stream");
    if (!s->owner->t) luaL_error(L, CLOSED_MSG);
    return s;
}

/* tok:stream([{skip_special=false, strip_space=false, exact=false}]) -> ember.DetokStream
 * exact: the chunks add up to tok:decode(ids) byte for byte (EMBER_DETOK_AS_DECODE; the other
 * options may not be combined with it). */
static int tok_stream(lua_State *L) {
    static const char *const valid[] = {"skip_special", "strip_space", "exact", NULL};
    ember_tokenizer *t = ember_lua_check_tokenizer(L, 1);
    int opts = opts_index(L, 2, "stream", valid);
    unsigned flags = 0;
    if (opt_bool(L, opts, "stream", "skip_special", 0)) flags |= EMBER_DETOK_SKIP_SPECIAL;
    if (opt_bool(L, opts, "stream", "strip_space", 0)) flags |= EMBER_DETOK_STRIP_LEADING_SPACE;
    if (opt_bool(L, opts, "stream", "exact", 0)) {
        if (flags)
            return luaL_error(L, "stream: 'exact' reproduces decode and cannot be combined with 'skip_special' or "
                                 "'strip_space'");
        flags = EMBER_DETOK_AS_DECODE;
    }
    lstream *s = lua_newuserdatauv(L, sizeof *s, 1); /* [tok, (opts), stream] */
    s->s = NULL;
    s->owner = lua_touserdata(L, 1);
    luaL_setmetatable(L, EMBER_LUA_DETOK);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1); /* the stream keeps its tokenizer alive */
    ember_error err = {0};
    if (ember_detok_stream_new(t, flags, &s->s, &err) != EMBER_OK) return raise_plain(L, "%s", err.msg);
    return 1;
}

/* stream:push(id) -> the text completed by this token ("" while a character is unfinished) */
static int stream_push(lua_State *L) {
    lstream *s = check_stream(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    if (id < INT32_MIN || id > INT32_MAX) return luaL_argerror(L, 2, "not a token id");
    const char *text;
    size_t len;
    ember_error err = {0};
    if (ember_detok_stream_push(s->s, (int32_t)id, &text, &len, &err) != EMBER_OK) return raise_plain(L, "%s", err.msg);
    lua_pushlstring(L, text, len);
    return 1;
}

/* stream:flush() -> what was held back (an unfinished character becomes U+FFFD, or stays as it is
 * with exact); restarts. */
static int stream_flush(lua_State *L) {
    lstream *s = check_stream(L, 1);
    const char *text;
    size_t len;
    ember_detok_stream_flush(s->s, &text, &len);
    lua_pushlstring(L, text, len);
    return 1;
}

static int stream_close(lua_State *L) {
    lstream *s = luaL_checkudata(L, 1, EMBER_LUA_DETOK);
    ember_detok_stream_free(s->s);
    s->s = NULL;
    return 0;
}

/* ---- construction ----------------------------------------------------------------------------- */

static void gguf_close_box(void *g) { ember_gguf_close(g); }
static void builder_free_box(void *b) { ember_tokenizer_builder_free(b); }

/* core.tokenizer_from_gguf(path) */
static int l_tokenizer_from_gguf(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    ltok *u = push_closed_tokenizer(L);            /* [path, tok] */
    void **box = ember_lua_box(L, gguf_close_box); /* [path, tok, box] */
    ember_gguf *g;
    ember_error err = {0};
    if (ember_gguf_open(path, &g, &err) != EMBER_OK) return raise_plain(L, "ember.tokenizer: %s", err.msg);
    *box = g;
    if (ember_tokenizer_from_gguf(g, &u->t, &err) != EMBER_OK) return raise_plain(L, "ember.tokenizer: %s", err.msg);
    ember_gguf_close(g);
    *box = NULL;
    lua_pop(L, 1); /* [path, tok] */
    return 1;
}

/* Field of the spec table as a boolean (absent = false). */
static bool spec_bool(lua_State *L, int spec, const char *key) {
    lua_getfield(L, spec, key);
    bool v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* Field of the spec table as a token id (absent = -1). */
static int32_t spec_id(lua_State *L, int spec, const char *key) {
    lua_Integer v = ember_lua_opt_int_field(L, spec, "tokenizer_build", key, -1);
    if (v < -1 || v >= INT32_MAX) raise_plain(L, "ember.tokenizer: %s = %I is not a token id", key, v);
    return (int32_t)v;
}

static void check_status(lua_State *L, ember_status st, const ember_error *err) {
    if (st != EMBER_OK) raise_plain(L, "ember.tokenizer: %s", err->msg);
}

/* spec.vocab: { [string] = id } (tokenizer.json's model.vocab). [.., vocab] on top. */
static void build_vocab(lua_State *L, ember_tokenizer_builder *b, const char *source) {
    ember_error err = {0};
    int vocab = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, vocab)) { /* [.., vocab, key, id] */
        int isint;
        lua_Integer id = lua_tointegerx(L, -1, &isint);
        /* a number, not a numeric string: "5" must not become id 5 */
        if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TNUMBER || !isint)
            raise_plain(L, "ember.tokenizer: %s: model.vocab must map token strings to integer ids", source);
        size_t len;
        const char *s = lua_tolstring(L, -2, &len);
        check_status(L, ember_tokenizer_builder_add_token(b, id, s, len, 0.0f, EMBER_TOKEN_NORMAL, &err), &err);
        lua_pop(L, 1); /* [.., vocab, key] */
    }
}

/* spec.added: array of { id=, content=, special=, lstrip=, rstrip=, single_word= }. [.., added] */
static void build_added(lua_State *L, ember_tokenizer_builder *b, const char *source) {
    ember_error err = {0};
    int added = lua_gettop(L);
    lua_Unsigned n = lua_rawlen(L, added);
    for (lua_Unsigned i = 1; i <= n; i++) {
        if (lua_rawgeti(L, added, (lua_Integer)i) != LUA_TTABLE) /* [.., added, tok] */
            raise_plain(L, "ember.tokenizer: %s: added_tokens[%I] is not an object", source, (lua_Integer)i);
        int at = lua_gettop(L);
        lua_getfield(L, at, "id");
        int isint;
        lua_Integer id = lua_tointegerx(L, -1, &isint);
        lua_getfield(L, at, "content");
        if (!isint || lua_type(L, -2) != LUA_TNUMBER || lua_type(L, -1) != LUA_TSTRING)
            raise_plain(L, "ember.tokenizer: %s: added_tokens[%I] needs an integer id and a string content", source,
                        (lua_Integer)i);
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        unsigned attr = spec_bool(L, at, "special") ? EMBER_TOKEN_CONTROL : EMBER_TOKEN_USER_DEFINED;
        if (spec_bool(L, at, "lstrip")) attr |= EMBER_TOKEN_LSTRIP;
        if (spec_bool(L, at, "rstrip")) attr |= EMBER_TOKEN_RSTRIP;
        if (spec_bool(L, at, "single_word")) attr |= EMBER_TOKEN_SINGLE_WORD;
        check_status(L, ember_tokenizer_builder_add_token(b, id, s, len, 0.0f, attr, &err), &err);
        lua_settop(L, added);
    }
}

/* spec.merges: array of "left right" strings or { left, right } pairs. [.., merges] */
static void build_merges(lua_State *L, ember_tokenizer_builder *b, const char *source) {
    ember_error err = {0};
    int merges = lua_gettop(L);
    lua_Unsigned n = lua_rawlen(L, merges);
    for (lua_Unsigned i = 1; i <= n; i++) {
        int type = lua_rawgeti(L, merges, (lua_Integer)i); /* [.., merges, m] */
        const char *l = NULL, *r = NULL;
        size_t llen = 0, rlen = 0;
        if (type == LUA_TSTRING) {
            /* "left right": HF splits at the space and wants exactly two parts */
            size_t len;
            const char *s = lua_tolstring(L, -1, &len);
            const char *sp = memchr(s, ' ', len);
            if (sp && !memchr(sp + 1, ' ', len - (size_t)(sp - s) - 1)) {
                l = s;
                llen = (size_t)(sp - s);
                r = sp + 1;
                rlen = len - llen - 1;
            }
        } else if (type == LUA_TTABLE && lua_rawlen(L, -1) == 2) {
            lua_rawgeti(L, -1, 1);
            lua_rawgeti(L, -2, 2); /* [.., merges, m, left, right] */
            if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING) {
                l = lua_tolstring(L, -2, &llen);
                r = lua_tolstring(L, -1, &rlen);
            }
        }
        if (!l || !r || !llen || !rlen)
            raise_plain(L, "ember.tokenizer: %s: model.merges[%I] is neither \"left right\" nor [\"left\", \"right\"]",
                        source, (lua_Integer)i);
        check_status(L, ember_tokenizer_builder_add_merge(b, l, llen, r, rlen, &err), &err);
        lua_settop(L, merges);
    }
}

static int parse_enum(lua_State *L, int spec, const char *key, const char *const *names, const char *def) {
    const char *v = ember_lua_opt_str_field(L, spec, "tokenizer_build", key, def);
    for (int i = 0; names[i]; i++)
        if (strcmp(v, names[i]) == 0) return i;
    return raise_plain(L, "ember.tokenizer: unknown %s '%s'", key, v);
}

/* core.tokenizer_build(spec): spec = { source=, model="bpe"|"spm", pre="none"|"gpt2"|"llama3"|
 * "qwen2"|"newlines", vocab={}, added={}, merges={}, bos_id=, eos_id=, unk_id=, and the booleans
 * of ember_tokenizer_config: nfc, add_space_prefix, escape_spaces, byte_level, byte_fallback,
 * ignore_merges, newline_runs_whole, fuse_unk, decode_strip_space, add_bos }. */
static int l_tokenizer_build(lua_State *L) {
    static const char *const models[] = {"bpe", "spm", NULL};
    static const char *const pres[] = {"none", "gpt2", "llama3", "qwen2", "newlines", NULL};
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    const char *source = ember_lua_opt_str_field(L, 1, "tokenizer_build", "source", "tokenizer.json");
    ember_tokenizer_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model = (ember_tok_model)parse_enum(L, 1, "model", models, "bpe");
    cfg.pre = (ember_tok_pre)parse_enum(L, 1, "pre", pres, "none");
    cfg.nfc = spec_bool(L, 1, "nfc");
    cfg.add_space_prefix = spec_bool(L, 1, "add_space_prefix");
    cfg.escape_spaces = spec_bool(L, 1, "escape_spaces");
    cfg.byte_level = spec_bool(L, 1, "byte_level");
    cfg.byte_fallback = spec_bool(L, 1, "byte_fallback");
    cfg.ignore_merges = spec_bool(L, 1, "ignore_merges");
    cfg.newline_runs_whole = spec_bool(L, 1, "newline_runs_whole");
    cfg.fuse_unk = spec_bool(L, 1, "fuse_unk");
    cfg.decode_strip_space = spec_bool(L, 1, "decode_strip_space");
    cfg.add_bos = spec_bool(L, 1, "add_bos");
    cfg.bos_id = spec_id(L, 1, "bos_id");
    cfg.eos_id = spec_id(L, 1, "eos_id");
    cfg.unk_id = spec_id(L, 1, "unk_id");

    ltok *u = push_closed_tokenizer(L);              /* [spec, tok] */
    void **box = ember_lua_box(L, builder_free_box); /* [spec, tok, box] */
    ember_tokenizer_builder *b;
    ember_error err = {0};
    check_status(L, ember_tokenizer_builder_new(source, &b, &err), &err);
    *box = b;

    if (lua_getfield(L, 1, "vocab") != LUA_TTABLE) raise_plain(L, "ember.tokenizer: %s: no model.vocab", source);
    build_vocab(L, b, source);
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "added") == LUA_TTABLE) build_added(L, b, source);
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "merges") == LUA_TTABLE) build_merges(L, b, source);
    lua_pop(L, 1); /* [spec, tok, box] */

    *box = NULL; /* finish consumes the builder whatever happens */
    check_status(L, ember_tokenizer_builder_finish(b, &cfg, &u->t, &err), &err);
    lua_pop(L, 1); /* [spec, tok] */
    return 1;
}

/* core.tokenizer_check(tok, model) -> true | nil, message: tok against the vocabulary the model's
 * GGUF embeds (ember_tokenizer_check_gguf). */
static int l_tokenizer_check(lua_State *L) {
    ember_tokenizer *t = ember_lua_check_tokenizer(L, 1);
    ember_lua_model *lm = ember_lua_check_model(L, 2);
    ember_error err = {0};
    if (ember_tokenizer_check_gguf(t, ember_model_gguf(lm->m), &err) != EMBER_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* ---- registration ----------------------------------------------------------------------------- */

void ember_lua_open_tokenizer(lua_State *L, int module_index) {
    static const luaL_Reg tok_methods[] = {
        {"encode", tok_encode},         {"decode", tok_decode}, {"token", tok_token}, {"find", tok_find},
        {"is_special", tok_is_special}, {"stream", tok_stream}, {"close", tok_close}, {NULL, NULL},
    };
    static const luaL_Reg tok_meta[] = {
        {"__gc", tok_close},
        {"__close", tok_close},
        {"__tostring", tok_tostring},
        {NULL, NULL},
    };
    static const luaL_Reg tok_getters[] = {
        {"vocab_size", get_vocab_size}, {"bos_id", get_bos_id}, {"eos_id", get_eos_id},
        {"adds_bos", get_adds_bos},     {NULL, NULL},
    };
    static const luaL_Reg stream_methods[] = {
        {"push", stream_push},
        {"flush", stream_flush},
        {"close", stream_close},
        {NULL, NULL},
    };
    static const luaL_Reg stream_meta[] = {
        {"__gc", stream_close},
        {"__close", stream_close},
        {NULL, NULL},
    };
    module_index = lua_absindex(L, module_index);
    ember_lua_new_class(L, EMBER_LUA_TOKENIZER, tok_methods, tok_meta, tok_getters); /* [mt] */
    lua_pop(L, 1);
    ember_lua_new_class(L, EMBER_LUA_DETOK, stream_methods, stream_meta, NULL); /* [mt] */
    lua_pop(L, 1);
    lua_pushcfunction(L, l_tokenizer_from_gguf);
    lua_setfield(L, module_index, "tokenizer_from_gguf");
    lua_pushcfunction(L, l_tokenizer_build);
    lua_setfield(L, module_index, "tokenizer_build");
    lua_pushcfunction(L, l_tokenizer_check);
    lua_setfield(L, module_index, "tokenizer_check");
}
