/* threads.c — the persistent thread pool behind the fast kernels: chunks claimed from a counter,
 * caller participates. Must not allocate per job nor decide anything numeric: which thread runs an
 * item never changes how the item is computed, so results cannot depend on the schedule. */
#include "threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* How long an idle worker spins before sleeping. Decode issues ~5 jobs per layer a few µs apart;
 * a wake-up through the condition variable costs tens of µs, so workers spin across that gap but
 * not much longer (on a busy machine a spinning worker steals CPU from useful threads). */
#define EMBER_POOL_SPIN_NS 300000L
/* How long the caller spins on unfinished chunks before yielding its CPU between checks. */
#define EMBER_POOL_WAIT_SPIN_NS 50000L
/* Scheduling: the first n_threads claims are one long run each, together 7/8 of the items; the
 * rest goes out in short chunks (about 1/16 of a thread's share) to whoever is free. Long runs
 * keep each thread on one sequential stream (every new stream costs the hardware prefetcher a
 * ramp-up; decode measured 0.49 -> 0.57 of the bandwidth ceiling going from 8 chunks per thread
 * to 1), the short tail still lets a thread absorb the end of a slower or preempted one's work. */
#define EMBER_POOL_HEAD_SHARE_NUM 7
#define EMBER_POOL_HEAD_SHARE_DEN 8
#define EMBER_POOL_TAIL_PER_THREAD 16

typedef struct {
    ember_pool *pool;
    int tid;
} worker_arg;

struct ember_pool {
    int n_threads;
    pthread_t *threads; /* (n_threads - 1) workers */
    worker_arg *args;   /* (n_threads - 1) */
    int n_started;
    pthread_mutex_t run_mu; /* one job at a time */
    pthread_mutex_t mu;     /* guards sleeping */
    pthread_cond_t cv;

    /* The current job. `claim` packs (job generation << 32 | next unclaimed item): a worker claims
     * a chunk with a compare-and-swap that fails once the job is over, so a worker that wakes up
     * late never touches a newer job, and the caller waits only for claimed chunks, never for a
     * thread the OS has not run yet. The fields are atomics because a late worker may read them while the next
     * job is being set up; it then fails its claim and ignores what it read. */
    _Atomic(ember_pool_fn) fn;
    _Atomic(void *) arg;
    atomic_int_fast64_t n, head, tail;
    atomic_uint_fast64_t claim;
    atomic_int_fast64_t done; /* items of the current job finished */
    atomic_uint_fast64_t gen; /* bumped to wake workers; low 32 bits = the job generation */
    atomic_int sleepers;      /* workers waiting on cv */
    atomic_bool stop;
};

void ember_pool_schedule(int64_t n, int64_t grain, int n_threads, int64_t *head, int64_t *tail) {
    if (grain < 1) grain = 1;
    if (n_threads < 1) n_threads = 1;
    *head = n * EMBER_POOL_HEAD_SHARE_NUM / EMBER_POOL_HEAD_SHARE_DEN / n_threads / grain * grain;
    const int64_t want = n / ((int64_t)n_threads * EMBER_POOL_TAIL_PER_THREAD);
    *tail = want <= grain ? grain : (want + grain - 1) / grain * grain;
}

/* Claims and runs chunks of job `g` until none are left or the job is over. */
static void run_chunks(ember_pool *p, uint32_t g, int tid) {
    for (;;) {
        uint_fast64_t cur = atomic_load_explicit(&p->claim, memory_order_acquire);
        if ((uint32_t)(cur >> 32) != g) return; /* another job now */
        const int64_t start = (int64_t)(uint32_t)cur, n = atomic_load_explicit(&p->n, memory_order_relaxed);
        if (start >= n) return;
        const int64_t head = atomic_load_explicit(&p->head, memory_order_relaxed);
        const int64_t size = start < head * p->n_threads ? head : atomic_load_explicit(&p->tail, memory_order_relaxed);
        const int64_t end = start + size < n ? start + size : n;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &cur, (uint_fast64_t)g << 32 | (uint64_t)end,
                                                   memory_order_acq_rel, memory_order_relaxed))
            continue;
        /* [start, end) of job g is ours; the job cannot finish (and its fields cannot change)
         * before we report it done. */
        atomic_load_explicit(&p->fn, memory_order_relaxed)(atomic_load_explicit(&p->arg, memory_order_relaxed), start,
                                                           end, tid);
        atomic_fetch_add_explicit(&p->done, end - start, memory_order_release);
    }
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    ember_pool *p = wa->pool;
    uint_fast64_t seen = 0; /* the generation at creation: a job may be published before we get here */
    for (;;) {
        /* wait for a new generation: spin first, then sleep */
        int64_t deadline = 0;
        unsigned spins = 0;
        while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
            cpu_relax();
            if (++spins % 64 == 0) {
                int64_t t = now_ns();
                if (!deadline) deadline = t + EMBER_POOL_SPIN_NS;
                else if (t > deadline) {
                    pthread_mutex_lock(&p->mu);
                    atomic_fetch_add(&p->sleepers, 1);
                    /* re-checked under the mutex: the caller bumps gen before looking at sleepers */
                    while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv, &p->mu);
                    atomic_fetch_sub(&p->sleepers, 1);
                    pthread_mutex_unlock(&p->mu);
                    break;
                }
            }
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load(&p->stop)) return NULL;
        run_chunks(p, (uint32_t)seen, wa->tid);
    }
}

ember_status ember_pool_new(int n_threads, ember_pool **out, ember_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_pool_new: %d threads is out of range (1..1024)", n_threads);
    ember_pool *p = calloc(1, sizeof *p);
    if (!p) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_pool_new: out of memory");
    p->n_threads = n_threads;
    atomic_init(&p->fn, NULL);
    atomic_init(&p->arg, NULL);
    atomic_init(&p->n, 0);
    atomic_init(&p->head, 0);
    atomic_init(&p->tail, 1);
    atomic_init(&p->claim, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) {
            ember_pool_free(p);
            return ember_error_set(err, EMBER_ERR_NOMEM, "ember_pool_new: out of memory");
        }
        for (int i = 0; i < n_threads - 1; i++) {
            p->args[i] = (worker_arg){.pool = p, .tid = i + 1};
            if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
                ember_pool_free(p);
                return ember_error_set(err, EMBER_ERR_NOMEM, "ember_pool_new: cannot start thread %d of %d", i + 2,
                                       n_threads);
            }
            p->n_started++;
        }
    }
    *out = p;
    return EMBER_OK;
}

void ember_pool_free(ember_pool *p) {
    if (!p) return;
    if (p->n_started > 0) {
        pthread_mutex_lock(&p->run_mu);
        atomic_store(&p->stop, true);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
        pthread_mutex_unlock(&p->run_mu);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->threads);
    free(p->args);
    free(p);
}

int ember_pool_threads(const ember_pool *p) { return p ? p->n_threads : 1; }

void ember_pool_for(ember_pool *p, int64_t n, int64_t grain, ember_pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    /* One thread, or too little work to split (or more items than a claim can name): the caller
     * does it all. */
    if (!p || p->n_threads == 1 || n <= grain || n >= (int64_t)UINT32_MAX) {
        fn(arg, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    int64_t head, tail;
    ember_pool_schedule(n, grain, p->n_threads, &head, &tail);
    const uint32_t g = (uint32_t)atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->n, n, memory_order_relaxed);
    atomic_store_explicit(&p->head, head, memory_order_relaxed);
    atomic_store_explicit(&p->tail, tail, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint_fast64_t)g << 32, memory_order_release); /* opens the job */
    atomic_fetch_add(&p->gen, 1); /* seq_cst: wakes spinners, and is ordered before reading sleepers */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, g, 0);
    /* Wait for chunks other threads claimed and are still running. */
    int64_t t0 = 0;
    unsigned spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n) {
        cpu_relax();
        if (++spins % 64 == 0) {
            int64_t t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > EMBER_POOL_WAIT_SPIN_NS) sched_yield(); /* a descheduled worker needs a CPU */
        }
    }
    /* Close the job: a late worker's claim now fails (no item is left). */
    atomic_store_explicit(&p->claim, (uint_fast64_t)g << 32 | 0xffffffffu, memory_order_release);
    pthread_mutex_unlock(&p->run_mu);
}
