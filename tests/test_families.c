/* test_families.c — the family table (engine/families.c) against what loading does: every row's
 * family loads a tiny model made by the tools' own table and runs, the tools write exactly the
 * engine's families, and an unsupported architecture is refused with every architecture listed. */
#include "ember.h"
#include "test_models.h"
#include "test_support.h"

#include <math.h>
#include <string.h>

/* Rows are well formed: a name, at least one architecture, no name or architecture twice. */
static void test_rows(void) {
    const int n = ember_family_count();
    CHECK(n >= 1);
    CHECK(ember_family_get(-1) == NULL && ember_family_get(n) == NULL);
    for (int i = 0; i < n; i++) {
        const ember_family_info *f = ember_family_get(i);
        CHECK_MSG(f && f->name && f->name[0] && f->architectures && f->architectures[0], "family %d", i);
        if (!f || !f->architectures) continue;
        for (int j = 0; j < i; j++) {
            const ember_family_info *g = ember_family_get(j);
            CHECK_MSG(strcmp(f->name, g->name) != 0, "family '%s' twice", f->name);
            for (const char *const *a = f->architectures; *a; a++)
                for (const char *const *b = g->architectures; *b; b++)
                    CHECK_MSG(strcmp(*a, *b) != 0, "architecture '%s' in '%s' and '%s'", *a, f->name, g->name);
        }
    }
}

/* The tiny-model tool writes every family the engine reads, and no other. */
static void test_tool_families(void) {
    int n_tool = 0;
    while (ember_tiny_model_family(n_tool)) n_tool++;
    CHECK_MSG(n_tool == ember_family_count(), "the tool writes %d families, the engine reads %d", n_tool,
              ember_family_count());
    for (int i = 0; i < ember_family_count(); i++) {
        bool found = false;
        for (int j = 0; j < n_tool; j++)
            found = found || strcmp(ember_family_get(i)->name, ember_tiny_model_family(j)) == 0;
        CHECK_MSG(found, "the tiny-model tool has no writer for family '%s'", ember_family_get(i)->name);
    }
}

/* Each row's family: its tiny model loads as that family and evaluates a prefill and a decode. */
static void test_family_loads(const ember_family_info *f) {
    char path[1100];
    snprintf(path, sizeof path, "%s/families-table-%s.gguf", ember_test_tmpdir(), f->name);
    ember_test_write_model(ember_test_tiny_writer(f->name, EMBER_TYPE_F32), path);
    ember_model_params mp = {
        .path = path, .arch = f->architectures[0], .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    if (ember_model_load(&mp, &m, &err) != EMBER_OK || ember_session_new(m, 16, &s, &err) != EMBER_OK) {
        CHECK_MSG(false, "%s: %.900s", f->name, err.msg);
        ember_model_free(m);
        return;
    }
    const ember_model_info *info = ember_model_get_info(m);
    CHECK_MSG(strcmp(info->family, f->name) == 0, "%s loads as '%s'", f->name, info->family);
    CHECK_MSG(strcmp(info->architecture, f->architectures[0]) == 0, "%s: architecture '%s'", f->name,
              info->architecture);
    CHECK_MSG(info->experimental == f->experimental, "%s: experimental %d", f->name, (int)info->experimental);
    const int32_t ids[3] = {5, 6, 7};
    CHECK_MSG(ember_session_prefill(s, ids, 3, NULL, &err) == EMBER_OK, "%s prefill: %.900s", f->name, err.msg);
    CHECK_MSG(ember_session_decode(s, 8, NULL, &err) == EMBER_OK, "%s decode: %.900s", f->name, err.msg);
    float lo = 0, hi = 0;
    CHECK_MSG(ember_test_span(ember_session_logits(s), (size_t)info->n_vocab, &lo, &hi) && hi > lo,
              "%s: logits in [%g, %g]", f->name, lo, hi);
    ember_session_free(s);
    ember_model_free(m);
}

/* An architecture no row accepts: refused as unsupported, the message naming it and every
 * architecture of every row. */
static void test_unsupported(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/families-table-unknown.gguf", ember_test_tmpdir());
    ember_gguf_writer *w = ember_test_tiny_writer("llama", EMBER_TYPE_F32);
    ember_gguf_writer_remove_key(w, "general.architecture");
    ember_gguf_writer_set_string(w, "general.architecture", "mamba9");
    ember_test_write_model(w, path);
    ember_model_params mp = {.path = path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ember_model *m = NULL;
    ember_error err = {0};
    CHECK(ember_model_load(&mp, &m, &err) == EMBER_ERR_UNSUPPORTED && m == NULL);
    CHECK_MSG(strstr(err.msg, "'mamba9' is not supported") != NULL, "%.900s", err.msg);
    for (int i = 0; i < ember_family_count(); i++)
        for (const char *const *a = ember_family_get(i)->architectures; *a; a++)
            CHECK_MSG(strstr(err.msg, *a) != NULL, "the message does not list '%s': %.900s", *a, err.msg);
}

int main(void) {
    test_rows();
    test_tool_families();
    for (int i = 0; i < ember_family_count(); i++) test_family_loads(ember_family_get(i));
    test_unsupported();
    return ember_test_finish();
}
