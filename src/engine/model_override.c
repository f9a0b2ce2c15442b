/* model_override.c — per-tensor overrides at load: a model whose named tensors come from a second
 * file of the same architecture (ember.load{override=}, --override-from / --override-tensors).
 *
 * How: before the family binds anything, the entries of the model file's tensor table for the
 * names asked are pointed at the other file's tensors (type, size, data), so everything that reads
 * the table afterwards (the binders, the repacking, model:tensors(), model:weight) sees exactly
 * what a file holding those tensors in the other file's types would hold. Both mappings stay open
 * for the model's life; reads that go through the file rather than the mapping (embedding.c) ask
 * ember_model_gguf_holding which one a pointer belongs to. Every check comes before any binding or
 * allocation of the model's own: different architectures, a name missing from either file, a
 * shape that differs, a regex that does not compile or matches nothing. */
#include "model_bind.h"

#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "escape.h"

static ember_status fail(ember_error *err, ember_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ember_status fail(ember_error *err, ember_status code, const char *fmt, ...) {
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ember_error_set(err, code, "override: %s", msg);
}

/* Both files' general.architecture, the same string. */
static ember_status same_architecture(const ember_gguf *b, const ember_gguf *a, ember_error *err) {
    char *arch_b = ember_gguf_get_string(b, "general.architecture");
    char *arch_a = ember_gguf_get_string(a, "general.architecture");
    ember_status st = EMBER_OK;
    if (!arch_a || !arch_b || strcmp(arch_a, arch_b) != 0) {
        char qa[96], qb[96];
        st = fail(err, EMBER_ERR_ARG, "%s is a '%s' model and %s a '%s' one: overrides need one architecture", b->path,
                  arch_b ? ember_escape(qb, sizeof qb, arch_b, strlen(arch_b), 64) : "(none)", a->path,
                  arch_a ? ember_escape(qa, sizeof qa, arch_a, strlen(arch_a), 64) : "(none)");
    }
    free(arch_a);
    free(arch_b);
    return st;
}

/* Tensor `name` of B is overridable by A's: present in both, same dims. */
static ember_status check_pair(const ember_gguf *b, const ember_gguf *a, const char *name, ember_error *err) {
    char q[160];
    const char *shown = ember_escape(q, sizeof q, name, strlen(name), 128);
    const gguf_tensor *tb = ember_gguf_find_tensor(b, name), *ta = ember_gguf_find_tensor(a, name);
    if (!tb) return fail(err, EMBER_ERR_ARG, "no tensor '%s' in %s (the model)", shown, b->path);
    if (!ta) return fail(err, EMBER_ERR_ARG, "no tensor '%s' in %s (the override file)", shown, a->path);
    if (tb->n_dims != ta->n_dims || memcmp(tb->ne, ta->ne, sizeof tb->ne) != 0)
        return fail(err, EMBER_ERR_ARG,
                    "tensor '%s' has shape [%lld, %lld, %lld, %lld] in %s but [%lld, %lld, %lld, %lld] in %s", shown,
                    (long long)tb->ne[0], (long long)tb->ne[1], (long long)tb->ne[2], (long long)tb->ne[3], b->path,
                    (long long)ta->ne[0], (long long)ta->ne[1], (long long)ta->ne[2], (long long)ta->ne[3], a->path);
    return EMBER_OK;
}

/* pick[i] for each tensor i of B: named in the list (each name checked), or matched by the regex. */
static ember_status select_names(const ember_gguf *b, const ember_model_params *p, bool *pick, ember_error *err) {
    if ((p->override_tensors != NULL) == (p->override_regex != NULL))
        return fail(err, EMBER_ERR_ARG, "give the tensors to take from %s as a list or as a regex (one of them)",
                    p->override_from);
    if (p->override_tensors) {
        for (const char *const *n = p->override_tensors; *n; n++) {
            const gguf_tensor *t = ember_gguf_find_tensor(b, *n);
            if (!t) return check_pair(b, b, *n, err); /* names the missing tensor */
            pick[t - b->tensors] = true;
        }
        return EMBER_OK;
    }
    size_t len = strlen(p->override_regex);
    char *anchored = malloc(len + 5);
    if (!anchored) return fail(err, EMBER_ERR_NOMEM, "out of memory");
    snprintf(anchored, len + 5, "^(%s)$", p->override_regex);
    regex_t re;
    int rc = regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB);
    free(anchored);
    char q[160];
    const char *shown = ember_escape(q, sizeof q, p->override_regex, len, 128);
    if (rc != 0) {
        char why[128];
        regerror(rc, NULL, why, sizeof why);
        return fail(err, EMBER_ERR_ARG, "the regex '%s' does not compile: %s", shown, why);
    }
    bool any = false;
    for (uint64_t i = 0; i < b->n_tensors; i++)
        if (regexec(&re, b->tensors[i].name, 0, NULL, 0) == 0) pick[i] = any = true;
    regfree(&re);
    return any ? EMBER_OK : fail(err, EMBER_ERR_ARG, "the regex '%s' matches no tensor of %s", shown, b->path);
}

/* The picked entries of B's table checked against A, then pointed at A's tensors; their names kept. */
static ember_status apply(ember_model *m, const bool *pick, ember_error *err) {
    ember_gguf *b = m->gguf;
    const ember_gguf *a = m->override_gguf;
    int64_t n = 0;
    for (uint64_t i = 0; i < b->n_tensors; i++)
        if (pick[i]) {
            TRY(check_pair(b, a, b->tensors[i].name, err));
            n++;
        }
    m->override_names = calloc((size_t)n, sizeof *m->override_names);
    if (!m->override_names) return fail(err, EMBER_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < b->n_tensors; i++) {
        if (!pick[i]) continue;
        gguf_tensor *t = &b->tensors[i];
        const gguf_tensor *src = ember_gguf_find_tensor(a, t->name);
        if (!(m->override_names[m->n_override] = strdup(t->name))) return fail(err, EMBER_ERR_NOMEM, "out of memory");
        m->n_override++;
        t->type = src->type;
        t->size = src->size;
        t->data = src->data;
    }
    return EMBER_OK;
}

ember_status ember_model_override(ember_model *m, const ember_model_params *p, ember_error *err) {
    if (!p->override_from) {
        if (p->override_tensors || p->override_regex)
            return fail(err, EMBER_ERR_ARG, "tensors to override were given but no file to take them from");
        return EMBER_OK;
    }
    TRY(ember_gguf_open(p->override_from, &m->override_gguf, err));
    TRY(same_architecture(m->gguf, m->override_gguf, err));
    bool *pick = calloc((size_t)m->gguf->n_tensors + 1, sizeof *pick);
    if (!pick) return fail(err, EMBER_ERR_NOMEM, "out of memory");
    ember_status st = select_names(m->gguf, p, pick, err);
    if (st == EMBER_OK) st = apply(m, pick, err);
    free(pick);
    return st;
}

const ember_gguf *ember_model_gguf_holding(const ember_model *m, const void *p) {
    const ember_gguf *a = m->override_gguf;
    const uint8_t *q = p;
    return a && q >= a->base && q < a->base + a->size ? a : m->gguf;
}

ember_status ember_model_check_unchanged(const ember_model *m, ember_error *err) {
    TRY(ember_gguf_check_unchanged(m->gguf, err));
    return m->override_gguf ? ember_gguf_check_unchanged(m->override_gguf, err) : EMBER_OK;
}

void ember_model_override_free(ember_model *m) {
    for (int64_t i = 0; i < m->n_override; i++) free(m->override_names[i]);
    free(m->override_names);
    ember_gguf_close(m->override_gguf);
}
