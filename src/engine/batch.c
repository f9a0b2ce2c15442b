/* batch.c — several sessions of one model evaluated together (ember_batch_eval): the new rows of
 * every sequence packed into one pass over a workspace the batch owns, each sequence attending
 * over its own session's KV cache at its own positions. Owns no numerics: the family's forward
 * does the arithmetic, through the pass's per-sequence helpers (pass.c). */
#include "memory.h"
#include "model.h"
#include "nonfinite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMBER_BATCH_MAX 4096

struct ember_batch {
    ember_model *m;
    int64_t n_seq, n_ctx;
    ember_session **s;    /* (n_seq) the sequences' sessions */
    ember_session *host;  /* the packed rows' workspace (no KV cache of its own) */
    ember_pass_seq *seq;  /* (n_seq) this evaluation's */
    ember_sequence *info; /* (n_seq) */
    int32_t *ids;         /* (cap_ids) the packed tokens */
    int64_t cap_ids;
    bool *seen; /* (n_seq) scratch: which sessions an evaluation names */
};

uint64_t ember_batch_bytes(const ember_model *m, int64_t n_seq, int64_t n_ctx, int64_t rows) {
    const uint64_t per_seq = ember_session_bytes(m, n_ctx) + (uint64_t)(m->n_embd + 2 * m->n_vocab) * sizeof(float);
    return (uint64_t)n_seq * per_seq + (uint64_t)rows * (uint64_t)ember_workspace_token_bytes(m);
}

void ember_batch_free(ember_batch *b) {
    if (!b) return;
    for (int64_t i = 0; b->s && i < b->n_seq; i++) ember_session_free(b->s[i]);
    free(b->s);
    ember_session_free(b->host);
    free(b->seq);
    free(b->info);
    free(b->ids);
    free(b->seen);
    free(b);
}

/* The host: a session without a KV cache whose workspace holds the packed rows, with one final
 * hidden row and one logits row per sequence. */
static ember_session *host_new(ember_model *m, int64_t n_seq) {
    ember_session *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->model = m;
    h->ws.last = malloc((size_t)(n_seq * m->n_embd) * sizeof(float));
    h->ws.logits = calloc((size_t)(n_seq * m->n_vocab), sizeof(float));
    h->ws.ple_row = malloc((size_t)(m->n_layer * m->ple_dim + 1) * sizeof(float));
    if (!h->ws.last || !h->ws.logits || !h->ws.ple_row) {
        ember_session_free(h);
        return NULL;
    }
    return h;
}

ember_status ember_batch_new(ember_model *m, int64_t n_seq, int64_t n_ctx, ember_batch **out, ember_error *err) {
    *out = NULL;
    if (n_seq < 1 || n_seq > EMBER_BATCH_MAX)
        return ember_error_set(err, EMBER_ERR_ARG, "batch: %lld sequences is out of range (1..%d)", (long long)n_seq,
                               EMBER_BATCH_MAX);
    ember_status st = ember_session_context_of(m, &n_ctx, err);
    if (st != EMBER_OK) return st;
    /* every session's KV cache, estimated before any of it is allocated (ember_batch_bytes) */
    const uint64_t need = ember_batch_bytes(m, n_seq, n_ctx, n_seq), one = ember_session_bytes(m, n_ctx);
    const char *source;
    const uint64_t avail = ember_memory_available(&source);
    if (need > avail)
        return ember_error_set(err, EMBER_ERR_NOMEM,
                               "batch: %lld sequences of %lld positions need %llu bytes (%llu of KV cache and "
                               "attention scratch each), more than the %llu bytes available (%s)",
                               (long long)n_seq, (long long)n_ctx, (unsigned long long)need, (unsigned long long)one,
                               (unsigned long long)avail, source);
    ember_batch *b = calloc(1, sizeof *b);
    if (!b) return ember_error_set(err, EMBER_ERR_NOMEM, "batch: out of memory");
    b->m = m;
    b->n_seq = n_seq;
    b->n_ctx = n_ctx;
    b->s = calloc((size_t)n_seq, sizeof *b->s);
    b->seq = calloc((size_t)n_seq, sizeof *b->seq);
    b->info = calloc((size_t)n_seq, sizeof *b->info);
    b->seen = calloc((size_t)n_seq, sizeof *b->seen);
    b->host = host_new(m, n_seq);
    if (!b->s || !b->seq || !b->info || !b->seen || !b->host) {
        ember_batch_free(b);
        return ember_error_set(err, EMBER_ERR_NOMEM, "batch: out of memory");
    }
    for (int64_t i = 0; i < n_seq; i++)
        if ((st = ember_session_new(m, n_ctx, &b->s[i], err)) != EMBER_OK) {
            ember_batch_free(b);
            return st;
        }
    *out = b;
    return EMBER_OK;
}

int64_t ember_batch_size(const ember_batch *b) { return b->n_seq; }

ember_session *ember_batch_session(ember_batch *b, int64_t i) { return i >= 0 && i < b->n_seq ? b->s[i] : NULL; }

/* Item i's session, checked: in the batch, named once, its tokens valid, no tape, no trace. */
static ember_status check_item(ember_batch *b, const ember_batch_item *it, int64_t i, ember_error *err) {
    char who[64];
    snprintf(who, sizeof who, "batch: sequence %lld", (long long)it->index + 1); /* numbered from 1 */
    if (it->index < 0 || it->index >= b->n_seq)
        return ember_error_set(err, EMBER_ERR_ARG, "batch: item %lld names sequence %lld, outside 0..%lld",
                               (long long)i, (long long)it->index, (long long)b->n_seq - 1);
    if (b->seen[it->index]) return ember_error_set(err, EMBER_ERR_ARG, "%s is named twice in one evaluation", who);
    b->seen[it->index] = true;
    const ember_session *s = b->s[it->index];
    if (s->tape)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "%s keeps a tape for gradients: gradients are single-sequence, evaluate it alone", who);
    if (s->trace)
        return ember_error_set(err, EMBER_ERR_ARG, "%s is traced: a trace follows one session, evaluate it alone", who);
    if (it->n < 1) return ember_error_set(err, EMBER_ERR_ARG, "%s is empty: at least one token is needed", who);
    return ember_check_tokens(s, it->ids, it->n, who, err);
}

/* The items checked and packed into the batch's pass: rows and ids in item order. */
static ember_status pack(ember_batch *b, const ember_batch_item *items, int64_t n_items, const ember_hooks *hooks,
                         ember_pass *p, ember_error *err) {
    if (n_items < 1 || n_items > b->n_seq)
        return ember_error_set(err, EMBER_ERR_ARG, "batch: %lld items for a batch of %lld sequences",
                               (long long)n_items, (long long)b->n_seq);
    if (ember_hook_wants(hooks, EMBER_STAGE_ATTENTION_PATTERN) && n_items > 1)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "batch: the attention_pattern hook sees one sequence's keys: evaluate the sequences "
                               "alone to hook it");
    memset(b->seen, 0, (size_t)b->n_seq * sizeof *b->seen);
    int64_t rows = 0;
    for (int64_t i = 0; i < n_items; i++) {
        ember_status st = check_item(b, &items[i], i, err);
        if (st != EMBER_OK) return st;
        ember_session *s = b->s[items[i].index];
        b->seq[i] = (ember_pass_seq){.s = s, .row = rows, .n = items[i].n};
        b->info[i] = (ember_sequence){
            .index = items[i].index, .first_row = rows, .length = items[i].n, .start_position = s->pos};
        rows += items[i].n;
    }
    if (rows > b->cap_ids) {
        int32_t *ids = realloc(b->ids, (size_t)rows * sizeof *ids);
        if (!ids) return ember_error_set(err, EMBER_ERR_NOMEM, "batch: cannot hold %lld tokens", (long long)rows);
        b->ids = ids;
        b->cap_ids = rows;
    }
    for (int64_t i = 0; i < n_items; i++)
        memcpy(b->ids + b->seq[i].row, items[i].ids, (size_t)items[i].n * sizeof *b->ids);
    *p = (ember_pass){.host = b->host, .ids = b->ids, .n = rows, .n_seq = n_items, .seq = b->seq, .sequences = b->info};
    return EMBER_OK;
}

/* A logits buffer of rows x vocab floats, grown (never shrunk). */
static ember_status grow_all_logits(ember_session *s, int64_t rows, ember_error *err) {
    if (rows <= s->ws.all_cap) return EMBER_OK;
    float *q = realloc(s->ws.all_logits, (size_t)rows * (size_t)s->model->n_vocab * sizeof(float));
    if (!q)
        return ember_error_set(err, EMBER_ERR_NOMEM, "batch: cannot allocate the logits of %lld positions",
                               (long long)rows);
    s->ws.all_logits = q;
    s->ws.all_cap = rows;
    return EMBER_OK;
}

/* The host's workspace for the pass's rows, and every row's logits where a session asks for them. */
static ember_status reserve(ember_batch *b, const ember_pass *p, ember_error *err) {
    ember_session *h = b->host;
    ember_status st = ember_workspace_reserve(h, p->n, err);
    h->all_logits = false;
    for (int64_t i = 0; st == EMBER_OK && i < p->n_seq; i++)
        if (p->seq[i].s->all_logits) {
            h->all_logits = true;
            st = grow_all_logits(p->seq[i].s, p->seq[i].n, err);
        }
    if (st == EMBER_OK && h->all_logits) st = grow_all_logits(h, p->n, err);
    return st;
}

/* The first non-finite logit of the pass as the sessions ask (the head's own check, then what an
 * after_logits hook wrote): its sequence (item) and column, or false. */
static bool find_nonfinite(const ember_batch *b, const ember_pass *p, const ember_hooks *hooks, int64_t *item,
                           int64_t *col, float *value) {
    const ember_session *h = b->host;
    const int64_t v = b->m->n_vocab;
    if (h->head_bad >= 0) {
        *item = h->head_bad / v, *col = h->head_bad % v, *value = h->head_bad_value;
        return true;
    }
    for (int64_t i = 0; ember_hook_wants(hooks, EMBER_STAGE_AFTER_LOGITS) && i < p->n_seq; i++) {
        if (p->seq[i].s->allow_nonfinite) continue;
        const int64_t bad = ember_logits_first_nonfinite(h->ws.logits + i * v, v);
        if (bad >= 0) {
            *item = i, *col = bad, *value = h->ws.logits[i * v + bad];
            return true;
        }
    }
    return false;
}

/* The error of a pass whose sequence `item` made non-finite logits: the same pass again (the same
 * positions, so every cache row it rewrites gets the same values) with the locating hooks on that
 * sequence's rows (nonfinite.h), naming the first stage, layer, row and column where it was. */
static ember_status nonfinite_error(ember_batch *b, const ember_pass *p, const ember_hooks *hooks, int64_t item,
                                    int64_t col, float value, ember_error *err) {
    ember_session *h = b->host;
    ember_nonfinite_locator lc = {
        .user = hooks, .row0 = p->seq[item].row, .rows = p->seq[item].n, .logits_row = h->all_logits ? -1 : item};
    const ember_hooks all = ember_nonfinite_hooks(&lc);
    ember_error pass_err = {0};
    h->head_bad = -1;
    const ember_status st = b->m->family->forward(p, &all, &pass_err);
    if (st != EMBER_OK && !lc.found) return ember_error_set(err, st, "%s", pass_err.msg);
    const int64_t v = b->m->n_vocab;
    const bool head_here = h->head_bad >= 0 && h->head_bad / v == item;
    char where[192];
    ember_nonfinite_where(&lc, head_here ? h->head_bad % v : -1, h->head_bad_value, where, sizeof where);
    return ember_error_set(err, EMBER_ERR_NONFINITE,
                           "%s: batch: sequence %lld: evaluation at position %lld produced non-finite logits "
                           "(logit %lld = %g); %s (allow_nonfinite = true keeps going)",
                           b->m->gguf->path, (long long)p->sequences[item].index + 1, (long long)p->seq[item].s->pos,
                           (long long)col, (double)value, where);
}

/* Each sequence's logits (and rows of all logits) into its session, and its position moved on. */
static void finish(ember_batch *b, const ember_pass *p) {
    const int64_t v = b->m->n_vocab;
    for (int64_t i = 0; i < p->n_seq; i++) {
        ember_session *s = p->seq[i].s;
        memcpy(s->ws.logits, b->host->ws.logits + i * v, (size_t)v * sizeof(float));
        if (s->all_logits)
            memcpy(s->ws.all_logits, b->host->ws.all_logits + p->seq[i].row * v,
                   (size_t)(p->seq[i].n * v) * sizeof(float));
        s->pos += p->seq[i].n;
        s->has_logits = true;
        s->n_all = s->all_logits ? p->seq[i].n : 0;
    }
}

ember_status ember_batch_eval(ember_batch *b, ember_phase phase, const ember_batch_item *items, int64_t n_items,
                              const ember_hooks *hooks, ember_error *err) {
    ember_pass p;
    ember_status st = pack(b, items, n_items, hooks, &p, err);
    if (st == EMBER_OK) st = ember_model_check_unchanged(b->m, err);
    if (st == EMBER_OK) st = reserve(b, &p, err);
    if (st != EMBER_OK) return st;
    for (int64_t i = 0; i < p.n_seq; i++) {
        p.seq[i].s->has_logits = false;
        p.seq[i].s->n_all = 0;
    }
    ember_session *h = b->host;
    h->phase = phase;
    h->head_bad = -1;
    st = b->m->family->forward(&p, hooks, err);
    ember_error changed = {0}; /* a truncation during the evaluation: the weights read as zeros */
    if (ember_model_check_unchanged(b->m, &changed) != EMBER_OK) {
        if (err) *err = changed;
        return changed.code;
    }
    if (st != EMBER_OK) return st; /* the caches beyond each position may hold partial rows */
    int64_t item, col;
    float value;
    if (find_nonfinite(b, &p, hooks, &item, &col, &value)) return nonfinite_error(b, &p, hooks, item, col, value, err);
    finish(b, &p);
    return EMBER_OK;
}
