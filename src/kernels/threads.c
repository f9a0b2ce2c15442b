/* threads.c — the persistent thread pool behind the fast kernels: static chunks, caller participates.
 * Must not allocate per job nor decide anything numeric: which element a thread computes never
 * changes how it is computed, so results cannot depend on the partition. */
#include "threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* How long an idle worker spins before sleeping. Decode issues ~7 jobs per layer a few µs apart;
 * a wake-up through the condition variable costs tens of µs, so workers spin across that gap. */
#define EMBER_POOL_SPIN_NS 2000000L

typedef struct {
    ember_pool *pool;
    int tid;
} worker_arg;

struct ember_pool {
    int n_threads;
    pthread_t *threads;    /* (n_threads - 1) workers */
    worker_arg *args;      /* (n_threads - 1) */
    pthread_mutex_t run_mu; /* one job at a time */
    pthread_mutex_t mu;     /* guards sleeping */
    pthread_cond_t cv;
    int n_started;

    /* the current job, published by incrementing gen */
    ember_pool_fn fn;
    void *arg;
    int64_t n, grain;
    atomic_uint_fast64_t gen;
    atomic_int pending;  /* workers that have not finished the current job */
    atomic_int sleepers; /* workers waiting on cv */
    atomic_bool stop;
};

void ember_pool_chunk(int64_t n, int64_t grain, int n_threads, int tid, int64_t *begin, int64_t *end) {
    if (grain < 1) grain = 1;
    int64_t units = (n + grain - 1) / grain, per = units / n_threads, rem = units % n_threads;
    int64_t u0 = tid * per + (tid < rem ? tid : rem);
    int64_t u1 = u0 + per + (tid < rem ? 1 : 0);
    *begin = u0 * grain < n ? u0 * grain : n;
    *end = u1 * grain < n ? u1 * grain : n;
}

static void run_chunk(ember_pool *p, int tid) {
    int64_t b, e;
    ember_pool_chunk(p->n, p->grain, p->n_threads, tid, &b, &e);
    if (b < e) p->fn(p->arg, b, e, tid);
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
            if (++spins % 256 == 0) {
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
        run_chunk(p, wa->tid);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

ember_status ember_pool_new(int n_threads, ember_pool **out, ember_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return ember_error_set(err, EMBER_ERR_ARG, "ember_pool_new: %d threads is out of range (1..1024)", n_threads);
    ember_pool *p = calloc(1, sizeof *p);
    if (!p) return ember_error_set(err, EMBER_ERR_NOMEM, "ember_pool_new: out of memory");
    p->n_threads = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
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
    /* One thread, or too little work to split: the caller does it all. */
    if (!p || p->n_threads == 1 || n <= grain) {
        fn(arg, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes the job before sleepers is read */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunk(p, 0);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) cpu_relax();
    pthread_mutex_unlock(&p->run_mu);
}
