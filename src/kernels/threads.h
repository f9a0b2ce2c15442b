/* threads.h — a small persistent pthread pool: one parallel-for at a time over [0, n), split into
 * static contiguous chunks (chunk i always goes to thread i). Knows nothing of models or kernels.
 *
 * The calling thread runs chunk 0 itself; n_threads - 1 workers run the others. Workers spin for a
 * short while after each job (decode issues a few hundred jobs per token, microseconds apart) and
 * then sleep on a condition variable, so an idle pool costs no CPU. No allocation after creation.
 * One job at a time: concurrent callers are serialised by a mutex. */
#ifndef EMBER_THREADS_H
#define EMBER_THREADS_H

#include "ember.h"

typedef struct ember_pool ember_pool;

/* Work on items [begin, end); tid in [0, n_threads) names the thread (for per-thread scratch). */
typedef void (*ember_pool_fn)(void *arg, int64_t begin, int64_t end, int tid);

/* n_threads >= 1 (1: no worker threads, every job runs on the caller). */
ember_status ember_pool_new(int n_threads, ember_pool **out, ember_error *err);
void ember_pool_free(ember_pool *p); /* NULL is fine */
int ember_pool_threads(const ember_pool *p);

/* Runs fn over [0, n): thread i gets the i-th of n_threads contiguous chunks whose boundaries are
 * multiples of `grain` (>= 1). Threads with an empty chunk are not called. Returns when all are done.
 * A NULL pool runs everything on the caller. */
void ember_pool_for(ember_pool *p, int64_t n, int64_t grain, ember_pool_fn fn, void *arg);

/* The chunk [*begin, *end) thread `tid` of `n_threads` gets (exposed for tests). */
void ember_pool_chunk(int64_t n, int64_t grain, int n_threads, int tid, int64_t *begin, int64_t *end);

#endif
