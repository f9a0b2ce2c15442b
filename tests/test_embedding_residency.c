/* test_embedding_residency.c — embedding lookups leave no table resident (src/engine/embedding.c
 * reads rows from the file, not through the mapping). A tied Q8_0 model with a 17 MiB token table
 * whose head the kernel set repacks (the table's mapped pages are released after the copy): after
 * one warm-up token, a prefill of 200 scattered ids and decode steps may not grow the file
 * mapping's resident size (/proc/self/smaps) by half of what reading those rows through the mapping
 * would at the least, one 4 KiB page per distinct row (they are ~1 in 4,352 pages apart). */
#include "ember.h"
#include "ember_tiny_model.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#define N_IDS 200
#define N_VOCAB 65536

/* Resident KiB of every mapping of `path` in this process, or -1 when smaps is unreadable. */
static long mapped_rss_kib(const char *path) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4096];
    long total = 0, kib;
    bool ours = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) ours = strstr(line, path) != NULL; /* a mapping's first line */
        else if (ours && sscanf(line, "Rss: %ld kB", &kib) == 1) total += kib;
    }
    fclose(f);
    return total;
}

int main(void) {
    char path[2048];
    snprintf(path, sizeof path, "%s/embedding_residency.gguf", ember_test_tmpdir());
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.dtype = EMBER_TYPE_Q8_0;
    p.n_vocab = N_VOCAB;
    p.n_embd = 256;
    p.n_layer = 2;
    p.tied = 1;
    p.tokenizer = false;
    ember_error err = {0};
    if (!CHECKF(ember_tiny_model_write(&p, path, &err) == EMBER_OK, "%s", err.msg)) return ember_test_finish();

    ember_model_params mp = {.path = path, .n_threads = 2};
    ember_model *m = NULL;
    ember_session *s = NULL;
    if (!CHECKF(ember_model_load(&mp, &m, &err) == EMBER_OK, "%s", err.msg)) return ember_test_finish();
    if (ember_model_get_info(m)->repacked_bytes == 0) {
        ember_model_free(m);
        remove(path);
        return ember_test_skip("the head is not repacked here (reference kernels or EMBER_WEIGHTS=mapped): the tied "
                               "table is read in place by every step and stays resident by design");
    }
    if (mapped_rss_kib(path) < 0) {
        ember_model_free(m);
        remove(path);
        return ember_test_skip("/proc/self/smaps is not readable");
    }
    int32_t ids[N_IDS];
    uint32_t r = 7;
    for (int i = 0; i < N_IDS; i++) ids[i] = (int32_t)(((r = r * 1103515245u + 12345u) >> 8) % N_VOCAB);
    CHECKF(ember_session_new(m, N_IDS + 8, &s, &err) == EMBER_OK, "%s", err.msg);
    /* the warm-up token reads the norms and whatever else stays mapped */
    CHECKF(ember_session_prefill(s, ids, 1, NULL, &err) == EMBER_OK, "prefill: %s", err.msg);
    const long before = mapped_rss_kib(path);
    CHECKF(ember_session_prefill(s, ids + 1, N_IDS - 1, NULL, &err) == EMBER_OK, "prefill: %s", err.msg);
    for (int i = 0; i < 4; i++)
        CHECKF(ember_session_decode(s, ids[i * 37], NULL, &err) == EMBER_OK, "decode: %s", err.msg);
    const long after = mapped_rss_kib(path), bound = (N_IDS - 1 + 4) * 4L / 2;
    printf("file mapping resident: %ld KiB after one token, %ld KiB after %d more lookups (bound: +%ld KiB)\n", before,
           after, N_IDS - 1 + 4, bound);
    CHECK_MSG(after - before < bound, "the mapping grew by %ld KiB over the lookups (bound %ld KiB)", after - before,
              bound);
    ember_session_free(s);
    ember_model_free(m);
    remove(path);
    return ember_test_finish();
}
