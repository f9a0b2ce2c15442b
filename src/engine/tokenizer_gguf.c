/* tokenizer_gguf.c — builds a tokenizer from the vocabulary embedded in a GGUF file
 * (tokenizer.ggml.*). Must not open files: it reads an already validated ember_gguf. The engine's
 * side of the arrow engine -> tokenizer: it feeds the tokenizer's public builder (tokenizer.h). */
#include "ember_internal.h"
#include "escape.h"
#include "gguf.h"
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* The array under key, or NULL when absent; a value of another type is an error (in *st), since a
 * tokenizer read from a mistyped array would give wrong ids silently. */
static const gguf_value *find_array(const ember_gguf *g, const char *key, gguf_value_type elem, bool numeric,
                                    ember_error *err, ember_status *st) {
    *st = EMBER_OK;
    const gguf_kv *kv = ember_gguf_find(g, key);
    if (!kv) return NULL;
    const gguf_value *v = &kv->value;
    bool ok = v->type == GGUF_TYPE_ARRAY &&
              (numeric ? (v->v.arr.elem_type != GGUF_TYPE_STRING && v->v.arr.elem_type != GGUF_TYPE_ARRAY &&
                          v->v.arr.elem_type != GGUF_TYPE_BOOL)
                       : v->v.arr.elem_type == elem);
    if (!ok) {
        *st = ember_error_set(err, EMBER_ERR_FORMAT, "%s: %s is not an array of %s", g->path, key,
                              numeric ? "numbers" : "strings");
        return NULL;
    }
    return v;
}

/* An optional integer key naming a token id; -1 when absent. */
static ember_status get_token_id(const ember_gguf *g, const char *key, int64_t n_vocab, int32_t *out,
                                 ember_error *err) {
    int64_t v;
    *out = -1;
    if (!ember_gguf_find(g, key)) return EMBER_OK;
    if (!ember_gguf_get_int(g, key, &v))
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: %s is not an integer", g->path, key);
    /* converters write -1 (as u32 0xFFFFFFFF at times) for "none" */
    if (v < 0 || v == 0xFFFFFFFFll) return EMBER_OK;
    if (v >= n_vocab)
        return ember_error_set(err, EMBER_ERR_FORMAT, "%s: %s = %lld is outside the vocabulary (%lld tokens)", g->path,
                               key, (long long)v, (long long)n_vocab);
    *out = (int32_t)v;
    return EMBER_OK;
}

static bool get_bool_or(const ember_gguf *g, const char *key, bool def) {
    bool b;
    return ember_gguf_get_bool(g, key, &b) ? b : def;
}

static bool streq(const char *a, const char *b) { return a && strcmp(a, b) == 0; }

/* Chooses the model and pattern from tokenizer.ggml.model / .pre, as llama.cpp does. */
static ember_status gguf_config(const ember_gguf *g, const char *model, const char *pre, ember_tokenizer_config *cfg,
                                ember_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = cfg->eos_id = cfg->unk_id = -1;
    if (streq(model, "gpt2")) {
        cfg->model = EMBER_TOK_MODEL_BPE;
        cfg->byte_level = true;
        if (streq(pre, "gpt-2") || streq(pre, "gpt2")) {
            cfg->pre = EMBER_TOK_PRE_GPT2;
        } else if (streq(pre, "llama-bpe") || streq(pre, "llama3")) {
            cfg->pre = EMBER_TOK_PRE_LLAMA3;
            cfg->ignore_merges = true; /* llama.cpp sets this for the LLaMA 3 pre-tokenizer */
            cfg->add_bos = true;
        } else if (streq(pre, "qwen2")) {
            cfg->pre = EMBER_TOK_PRE_QWEN2;
        } else {
            return ember_error_set(err, EMBER_ERR_UNSUPPORTED,
                                   "%s: tokenizer.ggml.pre = '%s' is not supported (gpt-2, llama-bpe, qwen2)", g->path,
                                   pre ? pre : "(missing)");
        }
    } else if (streq(model, "llama")) {
        cfg->model = EMBER_TOK_MODEL_SPM;
        cfg->add_space_prefix = get_bool_or(g, "tokenizer.ggml.add_space_prefix", true);
        cfg->escape_spaces = true;
        cfg->byte_fallback = true;
        cfg->decode_strip_space = cfg->add_space_prefix;
        cfg->add_bos = true;
    } else if (streq(model, "gemma4")) {
        /* SentencePiece-style BPE: raw characters, spaces as U+2581, split into newline runs and
         * the rest, byte fallback; llama.cpp always adds BOS for it. */
        cfg->model = EMBER_TOK_MODEL_BPE;
        cfg->pre = EMBER_TOK_PRE_NEWLINES;
        cfg->newline_runs_whole = true;
        cfg->escape_spaces = true;
        cfg->byte_fallback = true;
        cfg->add_space_prefix = get_bool_or(g, "tokenizer.ggml.add_space_prefix", false);
        cfg->decode_strip_space = cfg->add_space_prefix;
        cfg->add_bos = true;
    } else {
        return ember_error_set(err, EMBER_ERR_UNSUPPORTED,
                               "%s: tokenizer.ggml.model = '%s' is not supported (gpt2, llama, gemma4)", g->path,
                               model ? model : "(missing)");
    }
    if (!streq(model, "gemma4")) cfg->add_bos = get_bool_or(g, "tokenizer.ggml.add_bos_token", cfg->add_bos);
    return EMBER_OK;
}

/* Token i of tokenizer.ggml.tokens becomes id i, with its type and score when the file has them. */
static ember_status add_tokens(const ember_gguf *g, ember_tokenizer_builder *b, const gguf_value *tokens,
                               const gguf_value *types, const gguf_value *scores, ember_error *err) {
    uint64_t n = tokens->v.arr.count;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        double type = EMBER_TOKEN_NORMAL, score = 0;
        if (!ember_gguf_array_string(tokens, i, &s))
            return ember_error_set(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%llu] is unreadable", g->path,
                                   (unsigned long long)i);
        if (types && !ember_gguf_array_number(types, i, &type))
            return ember_error_set(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%llu] is unreadable", g->path,
                                   (unsigned long long)i);
        if (scores && !ember_gguf_array_number(scores, i, &score))
            return ember_error_set(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.scores[%llu] is unreadable", g->path,
                                   (unsigned long long)i);
        if (type == 0) type = EMBER_TOKEN_NORMAL; /* llama.cpp's "undefined" type reads as normal */
        if (type < EMBER_TOKEN_NORMAL || type > EMBER_TOKEN_BYTE || type != (double)(int)type)
            return ember_error_set(err, EMBER_ERR_FORMAT,
                                   "%s: tokenizer.ggml.token_type[%llu] = %g is not a token type", g->path,
                                   (unsigned long long)i, type);
        ember_status st =
            ember_tokenizer_builder_add_token(b, (int64_t)i, s.ptr, (size_t)s.len, (float)score, (unsigned)type, err);
        if (st != EMBER_OK) return st;
    }
    return EMBER_OK;
}

static ember_status add_merges(const ember_gguf *g, ember_tokenizer_builder *b, const gguf_value *merges,
                               ember_error *err) {
    for (uint64_t i = 0; i < merges->v.arr.count; i++) {
        gguf_str s;
        if (!ember_gguf_array_string(merges, i, &s))
            return ember_error_set(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] is unreadable", g->path,
                                   (unsigned long long)i);
        /* "left right": split at the first space after the first byte, so a left side that is
         * itself a space still works (llama.cpp's rule) */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', (size_t)s.len - 1) : NULL;
        if (!sp)
            return ember_error_set(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] has no space separator",
                                   g->path, (unsigned long long)i);
        size_t llen = (size_t)(sp - s.ptr);
        ember_status st = ember_tokenizer_builder_add_merge(b, s.ptr, llen, sp + 1, (size_t)s.len - llen - 1, err);
        if (st != EMBER_OK) return st;
    }
    return EMBER_OK;
}

ember_status ember_tokenizer_from_gguf(const ember_gguf *g, ember_tokenizer **out, ember_error *err) {
    *out = NULL;
    ember_status st;
    ember_tokenizer_config cfg;
    ember_tokenizer_builder *b = NULL;
    char *model = ember_gguf_get_string(g, "tokenizer.ggml.model");
    char *pre = ember_gguf_get_string(g, "tokenizer.ggml.pre");
    const gguf_value *tokens, *types, *scores, *merges;

    if (!model) {
        st = ember_error_set(err, EMBER_ERR_FORMAT, "%s: has no embedded tokenizer (tokenizer.ggml.model is missing)",
                             g->path);
        goto done;
    }
    if ((st = gguf_config(g, model, pre, &cfg, err)) != EMBER_OK) goto done;
    tokens = find_array(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, false, err, &st);
    if (st != EMBER_OK) goto done;
    if (!tokens || tokens->v.arr.count == 0) {
        st = ember_error_set(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing or empty", g->path);
        goto done;
    }
    if (tokens->v.arr.count > EMBER_TOKENIZER_MAX_ID) {
        st = ember_error_set(err, EMBER_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries (limit %d)", g->path,
                             (unsigned long long)tokens->v.arr.count, EMBER_TOKENIZER_MAX_ID);
        goto done;
    }
    types = find_array(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, true, err, &st);
    if (st != EMBER_OK) goto done;
    scores = find_array(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, true, err, &st);
    if (st != EMBER_OK) goto done;
    merges = find_array(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING, false, err, &st);
    if (st != EMBER_OK) goto done;
    const char *count_mismatch = NULL;
    if (types && types->v.arr.count != tokens->v.arr.count) count_mismatch = "tokenizer.ggml.token_type";
    if (scores && scores->v.arr.count != tokens->v.arr.count) count_mismatch = "tokenizer.ggml.scores";
    if (count_mismatch) {
        st =
            ember_error_set(err, EMBER_ERR_FORMAT, "%s: %s does not have one entry per token", g->path, count_mismatch);
        goto done;
    }
    if (cfg.model == EMBER_TOK_MODEL_BPE && !merges) {
        st = ember_error_set(err, EMBER_ERR_FORMAT, "%s: a BPE tokenizer needs tokenizer.ggml.merges", g->path);
        goto done;
    }
    int64_t n_vocab = (int64_t)tokens->v.arr.count;
    if ((st = get_token_id(g, "tokenizer.ggml.bos_token_id", n_vocab, &cfg.bos_id, err)) != EMBER_OK ||
        (st = get_token_id(g, "tokenizer.ggml.eos_token_id", n_vocab, &cfg.eos_id, err)) != EMBER_OK ||
        (st = get_token_id(g, "tokenizer.ggml.unknown_token_id", n_vocab, &cfg.unk_id, err)) != EMBER_OK)
        goto done;
    if (cfg.bos_id < 0) cfg.add_bos = false;

    if ((st = ember_tokenizer_builder_new(g->path, &b, err)) != EMBER_OK) goto done;
    if ((st = add_tokens(g, b, tokens, types, scores, err)) != EMBER_OK) goto done;
    if (merges && cfg.model == EMBER_TOK_MODEL_BPE && (st = add_merges(g, b, merges, err)) != EMBER_OK) goto done;
    st = ember_tokenizer_builder_finish(b, &cfg, out, err);
    b = NULL; /* finish frees it */

done:
    ember_tokenizer_builder_free(b);
    free(model);
    free(pre);
    return st;
}

/* ---- cross-check with a separately given tokenizer ----------------------------------------------
 * A tokenizer.json of another model family runs without complaint and produces garbage, so it is
 * compared with the vocabulary the GGUF embeds: the GGUF may pad its table beyond the tokenizer
 * (converters add [PAD] entries up to the embedding rows), but never hold fewer tokens; BOS must
 * agree when both name one, BOS and EOS must be the same tokens in both; and a spread sample of
 * ids must spell the same strings. */

#define TOK_CHECK_SAMPLES 64

ember_status ember_tokenizer_check_gguf(const ember_tokenizer *t, const ember_gguf *g, ember_error *err) {
    ember_status st;
    const gguf_value *tokens = find_array(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, false, err, &st);
    if (st != EMBER_OK) return st;
    if (!tokens || tokens->v.arr.count == 0) return EMBER_OK; /* nothing embedded to compare with */
    const int64_t n_g = (int64_t)tokens->v.arr.count, n_t = ember_tokenizer_vocab_size(t);
    const char *src = ember_tokenizer_source(t);
    const char *hint = "(tokenizer_check = false uses it anyway)";
    if (n_t > n_g)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "%s does not match the vocabulary embedded in %s: %lld token ids against %lld %s", src,
                               g->path, (long long)n_t, (long long)n_g, hint);
    int32_t g_bos = -1;
    if ((st = get_token_id(g, "tokenizer.ggml.bos_token_id", n_g, &g_bos, err)) != EMBER_OK) return st;
    if (g_bos >= 0 && ember_tokenizer_bos(t) >= 0 && g_bos != ember_tokenizer_bos(t))
        return ember_error_set(
            err, EMBER_ERR_ARG,
            "%s does not match the vocabulary embedded in %s: BOS is id %d in one and %d in the other %s", src, g->path,
            ember_tokenizer_bos(t), g_bos, hint);
    /* EOS may differ (a chat tokenizer ends turns with another token than the base vocabulary
     * names), but the token it names must be the same token in both */
    const int32_t specials[2] = {ember_tokenizer_bos(t), ember_tokenizer_eos(t)};
    for (int i = 0; i < 2; i++) {
        gguf_str s;
        int32_t id = specials[i];
        size_t tlen;
        const char *text = id < 0 ? NULL : ember_tokenizer_token_text(t, id, &tlen);
        if (!text) continue;
        if (!ember_gguf_array_string(tokens, (uint64_t)id, &s) || s.len != tlen ||
            memcmp(s.ptr, text, (size_t)s.len) != 0) {
            char q1[64], q2[64];
            bool in_g = ember_gguf_array_string(tokens, (uint64_t)id, &s);
            return ember_error_set(err, EMBER_ERR_ARG,
                                   "%s does not match the vocabulary embedded in %s: its %s id %d is '%s' in one and "
                                   "'%s' in the other %s",
                                   src, g->path, i ? "EOS" : "BOS", id, ember_escape(q1, sizeof q1, text, tlen, 24),
                                   in_g ? ember_escape(q2, sizeof q2, s.ptr, (size_t)s.len, 24) : "", hint);
        }
    }
    int compared = 0, differ = 0;
    int64_t first_bad = -1;
    for (int i = 0; i < TOK_CHECK_SAMPLES; i++) {
        int64_t id = n_t <= 1 ? 0 : (int64_t)((double)i * (double)(n_t - 1) / (TOK_CHECK_SAMPLES - 1));
        size_t tlen;
        const char *text = ember_tokenizer_token_text(t, (int32_t)id, &tlen);
        if (!text) continue;
        gguf_str s;
        if (!ember_gguf_array_string(tokens, (uint64_t)id, &s)) continue;
        compared++;
        if (s.len != tlen || memcmp(s.ptr, text, (size_t)s.len) != 0) {
            differ++;
            if (first_bad < 0) first_bad = id;
        }
    }
    /* a few differences are tolerated (converters rewrite the odd special token) */
    if (differ > compared / 8) {
        char q1[64], q2[64];
        gguf_str s;
        size_t tlen;
        const char *text = ember_tokenizer_token_text(t, (int32_t)first_bad, &tlen);
        ember_gguf_array_string(tokens, (uint64_t)first_bad, &s);
        return ember_error_set(err, EMBER_ERR_ARG,
                               "%s does not match the vocabulary embedded in %s: %d of %d sampled ids differ "
                               "(id %lld is '%s' in one and '%s' in the other) %s",
                               src, g->path, differ, compared, (long long)first_bad,
                               ember_escape(q1, sizeof q1, text, tlen, 24),
                               ember_escape(q2, sizeof q2, s.ptr, (size_t)s.len, 24), hint);
    }
    return EMBER_OK;
}
