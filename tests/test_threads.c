/* test_threads.c — the thread pool: every item runs exactly once, chunk boundaries sit on multiples
 * of the grain, thread ids stay in range, many back-to-back jobs (decode's pattern) and jobs after
 * the workers have gone to sleep all complete, and a pool is torn down cleanly. */
#include "test_support.h"
#include "threads.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    atomic_int *hits; /* (n) times each item ran */
    int64_t grain;
    int n_threads;
    atomic_int bad_chunk, bad_tid;
} job;

static void count(void *arg, int64_t begin, int64_t end, int tid) {
    job *j = arg;
    if (begin % j->grain != 0) atomic_fetch_add(&j->bad_chunk, 1);
    if (tid < 0 || tid >= j->n_threads) atomic_fetch_add(&j->bad_tid, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&j->hits[i], 1);
}

static bool run_and_check(ember_pool *p, int n_threads, int64_t n, int64_t grain) {
    atomic_int *hits = calloc((size_t)(n > 0 ? n : 1), sizeof *hits);
    job j = {.hits = hits, .grain = grain, .n_threads = n_threads};
    atomic_init(&j.bad_chunk, 0);
    atomic_init(&j.bad_tid, 0);
    ember_pool_for(p, n, grain, count, &j);
    bool ok = atomic_load(&j.bad_chunk) == 0 && atomic_load(&j.bad_tid) == 0;
    for (int64_t i = 0; i < n; i++) ok = ok && atomic_load(&hits[i]) == 1;
    free(hits);
    return ok;
}

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void) {
    ember_error err;
    ember_pool *bad = NULL;
    CHECK(ember_pool_new(0, &bad, &err) == EMBER_ERR_ARG && bad == NULL);

    static const int64_t sizes[] = {0, 1, 2, 3, 15, 16, 17, 100, 1000, 4099};
    static const int64_t grains[] = {1, 4, 16, 64};
    for (int nt = 1; nt <= 5; nt++) {
        ember_pool *p;
        CHECK_MSG(ember_pool_new(nt, &p, &err) == EMBER_OK, "pool of %d: %.200s", nt, err.msg);
        CHECK(ember_pool_threads(p) == nt);
        bool ok = true;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t gi = 0; gi < sizeof grains / sizeof grains[0]; gi++)
                ok = ok && run_and_check(p, nt, sizes[si], grains[gi]);
        CHECK_MSG(ok, "%d threads: every item exactly once, chunks on grain multiples, tids in range", nt);

        /* decode's pattern: thousands of small jobs back to back */
        ok = true;
        for (int k = 0; k < 3000; k++) ok = ok && run_and_check(p, nt, 64 + k % 50, 4);
        CHECK_MSG(ok, "%d threads: back-to-back jobs", nt);

        /* after the workers have gone to sleep, a job still completes (wake-up path) */
        sleep_ms(20);
        CHECK_MSG(run_and_check(p, nt, 777, 8), "%d threads: job after idle", nt);
        ember_pool_free(p);
    }

    /* the schedule: one long run per thread (7/8 of the items), then short grain-multiple chunks */
    int64_t head, tail;
    ember_pool_schedule(3072, 16, 2, &head, &tail);
    CHECK(head == 1344 && tail == 96); /* 3072*7/8/2 = 1344; 3072/32 = 96 */
    ember_pool_schedule(1000, 16, 2, &head, &tail);
    CHECK(head % 16 == 0 && tail % 16 == 0 && head * 2 <= 1000 && tail >= 16);
    ember_pool_schedule(5, 16, 4, &head, &tail);
    CHECK(head == 0 && tail == 16);
    ember_pool_schedule(16, 1, 2, &head, &tail); /* attention of one decoded token: 16 heads */
    CHECK(head == 7 && tail == 1);

    /* a NULL pool runs on the caller */
    CHECK(run_and_check(NULL, 1, 100, 7));
    ember_pool_free(NULL);
    return ember_test_finish();
}
