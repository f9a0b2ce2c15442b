/* trace.h — the trace stream inside the engine: the state of one trace and the entries the
 * session and the family call sites use (through ember_trace_step in hooks.h). */
#ifndef EMBER_TRACE_H
#define EMBER_TRACE_H

#include <stdio.h>

#include "ember.h"
#include "kernels.h"

struct ember_trace {
    FILE *out;         /* the JSONL stream; owned by the caller */
    uint64_t fp;       /* normalized fingerprint so far: FNV-1a over the lines without timings */
    int64_t events;    /* lines written */
    int64_t evals;     /* evaluations started */
    bool write_failed; /* a write to out failed (reported by ember_trace_status) */
    /* the filter (ember_trace_set_filter): NULL = everything */
    bool *layers; /* (n_layers) which layers' ops are traced */
    int64_t n_layers;
    char **op_names; /* (n_op_names) the op names traced */
    int n_op_names;
    /* the evaluation in progress */
    const ember_kernel_ops *ops;
    ember_phase phase;
    double t0_ms;
};

struct ember_session;
/* Called by the session around the forward pass of one evaluation of n tokens. */
void ember_trace_eval_start(ember_trace *t, const struct ember_session *s, ember_phase phase, int64_t n);
void ember_trace_eval_end(ember_trace *t, bool ok);
/* One executed op: its output data (rows, cols), the kernel that computed it (a product names w). */
void ember_trace_emit(ember_trace *t, const char *op, int64_t layer, ember_kop kop, const ember_matrix *w,
                      const float *data, int64_t rows, int64_t cols);

#endif
