/* threads.h — a small persistent pthread pool: one parallel-for at a time over [0, n), cut into
 * chunks (boundaries at multiples of `grain`) that the threads claim from a shared counter: one
 * long run per thread first, then short chunks (ember_pool_schedule). Knows nothing of models or
 * kernels.
 *
 * The calling thread works too; n_threads - 1 workers help. Claiming chunks (rather than giving
 * thread i a fixed i-th share) lets the others absorb the end of the work of a thread the OS has
 * descheduled, which matters on shared machines. It does not make results depend on the schedule: every user
 * of the pool computes each item the same way whichever thread runs it (kernels/compute.c).
 * Workers spin for a short while after each job (decode issues a few hundred jobs per token,
 * microseconds apart) and then sleep on a condition variable, so an idle pool costs no CPU.
 * No allocation after creation. One job at a time: concurrent callers are serialised. */
#ifndef EMBER_THREADS_H
#define EMBER_THREADS_H

#include "types.h"

typedef struct ember_pool ember_pool;

/* Work on items [begin, end); tid in [0, n_threads) names the thread (for per-thread scratch). */
typedef void (*ember_pool_fn)(void *arg, int64_t begin, int64_t end, int tid);

/* n_threads >= 1 (1: no worker threads, every job runs on the caller). */
ember_status ember_pool_new(int n_threads, ember_pool **out, ember_error *err);
void ember_pool_free(ember_pool *p); /* NULL is fine */
int ember_pool_threads(const ember_pool *p);

/* Runs fn over [0, n) in chunks whose boundaries are multiples of `grain` (>= 1), each chunk exactly
 * once, on whichever thread claims it; returns when all are done. A NULL pool, a 1-thread pool or
 * n <= grain runs everything on the caller in one call fn(arg, 0, n, 0). */
void ember_pool_for(ember_pool *p, int64_t n, int64_t grain, ember_pool_fn fn, void *arg);

/* The chunks ember_pool_for uses for n items on n_threads threads (exposed for tests): the first
 * n_threads claims take `head` items each (7/8 of n split evenly, rounded down to a multiple of
 * grain; may be 0), every later claim `tail` items (about 1/16 of a thread's share, a multiple of
 * grain, at least grain). */
void ember_pool_schedule(int64_t n, int64_t grain, int n_threads, int64_t *head, int64_t *tail);

#endif
