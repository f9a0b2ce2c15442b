/* trace.c — structured tracing: one JSON line per executed step, written by one fixed-order
 * emitter, and the normalized trace fingerprint over those lines with their timings left out.
 * Never reads or changes a value it traces beyond fingerprinting it; calls no hook. */
#include "trace.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char *phase_name(ember_phase p) { return p == EMBER_PHASE_DECODE ? "decode" : "prefill"; }

ember_status ember_trace_new(FILE *out, ember_trace **t, ember_error *err) {
    *t = NULL;
    if (!out) return ember_error_set(err, EMBER_ERR_ARG, "trace: no output stream");
    ember_trace *n = calloc(1, sizeof *n);
    if (!n) return ember_error_set(err, EMBER_ERR_NOMEM, "trace: out of memory");
    n->out = out;
    n->fp = ember_fingerprint_start();
    *t = n;
    return EMBER_OK;
}

static void filter_free(ember_trace *t) {
    free(t->layers);
    for (int i = 0; i < t->n_op_names; i++) free(t->op_names[i]);
    free(t->op_names);
    t->layers = NULL;
    t->op_names = NULL;
    t->n_layers = 0;
    t->n_op_names = 0;
}

void ember_trace_free(ember_trace *t) {
    if (!t) return;
    filter_free(t);
    free(t);
}

ember_status ember_trace_set_filter(ember_trace *t, const bool *layer_mask, int64_t n_mask, const char *const *ops,
                                    int n_ops, ember_error *err) {
    filter_free(t);
    if (layer_mask) {
        t->layers = malloc((size_t)(n_mask > 0 ? n_mask : 1) * sizeof *t->layers);
        if (!t->layers) return ember_error_set(err, EMBER_ERR_NOMEM, "trace: out of memory");
        if (n_mask > 0) memcpy(t->layers, layer_mask, (size_t)n_mask * sizeof *t->layers);
        t->n_layers = n_mask > 0 ? n_mask : 0;
    }
    if (ops) { /* an empty list is a filter too: no op line at all */
        t->op_names = calloc((size_t)(n_ops > 0 ? n_ops : 1), sizeof *t->op_names);
        if (!t->op_names) {
            filter_free(t);
            return ember_error_set(err, EMBER_ERR_NOMEM, "trace: out of memory");
        }
        for (int i = 0; i < n_ops; i++) {
            t->op_names[i] = strdup(ops[i]);
            t->n_op_names = i + 1;
            if (!t->op_names[i]) {
                filter_free(t);
                return ember_error_set(err, EMBER_ERR_NOMEM, "trace: out of memory");
            }
        }
    }
    return EMBER_OK;
}

/* Whether the filter keeps an op of `layer` called `op`. */
static bool traced(const ember_trace *t, const char *op, int64_t layer) {
    if (t->layers && layer >= 0 && (layer >= t->n_layers || !t->layers[layer])) return false;
    if (!t->op_names) return true;
    for (int i = 0; i < t->n_op_names; i++)
        if (strcmp(t->op_names[i], op) == 0) return true;
    return false;
}

uint64_t ember_trace_fingerprint(const ember_trace *t) { return t->fp; }
int64_t ember_trace_event_count(const ember_trace *t) { return t->events; }
int64_t ember_trace_eval_count(const ember_trace *t) { return t->evals; }

ember_status ember_trace_status(const ember_trace *t, ember_error *err) {
    if (t->write_failed || ferror(t->out)) return ember_error_set(err, EMBER_ERR_IO, "trace: writing the trace failed");
    return EMBER_OK;
}

void ember_session_set_trace(ember_session *s, ember_trace *t) { s->trace = t; }

/* Writes one line: `norm` (a JSON object without its closing brace: the normalized part, which
 * goes into the fingerprint; len of the cap bytes snprintf had) then `timing` (fields left out of
 * it, may be "") and the brace. A line that did not fit is a bug in the emitter, not input. */
static void put_line(ember_trace *t, const char *norm, int len, size_t cap, const char *timing) {
    if (len < 0 || (size_t)len >= cap) {
        t->write_failed = true;
        return;
    }
    t->fp = ember_fingerprint_bytes(t->fp, norm, (size_t)len);
    t->fp = ember_fingerprint_bytes(t->fp, "}\n", 2);
    if (fputs(norm, t->out) == EOF || fputs(timing, t->out) == EOF || fputs("}\n", t->out) == EOF)
        t->write_failed = true;
    t->events++;
}

void ember_trace_eval_start(ember_trace *t, const ember_session *s, ember_phase phase, int64_t n) {
    char line[256];
    t->evals++;
    t->ops = s->model->ops;
    t->phase = phase;
    int len = snprintf(line, sizeof line,
                       "{\"event\":\"eval_start\",\"eval\":%" PRId64 ",\"phase\":\"%s\",\"position\":%" PRId64
                       ",\"tokens\":%" PRId64,
                       t->evals, phase_name(phase), s->pos, n);
    put_line(t, line, len, sizeof line, "");
    t->t0_ms = now_ms();
}

void ember_trace_eval_end(ember_trace *t, bool ok) {
    char line[160], timing[64];
    const double ms = now_ms() - t->t0_ms;
    int len = snprintf(line, sizeof line, "{\"event\":\"eval_end\",\"eval\":%" PRId64 ",\"phase\":\"%s\",\"ok\":%s",
                       t->evals, phase_name(t->phase), ok ? "true" : "false");
    snprintf(timing, sizeof timing, ",\"ms\":%.3f", ms);
    put_line(t, line, len, sizeof line, timing);
}

/* Op names and kernel names are the engine's own identifiers ([a-z0-9_/]), so they are written
 * as they are; the fingerprint is 16 hex digits (JSON readers that hold numbers as doubles would
 * round a 20-digit integer). */
void ember_trace_emit(ember_trace *t, const char *op, int64_t layer, ember_kop kop, const ember_matrix *w,
                      const float *data, int64_t rows, int64_t cols) {
    if ((t->layers || t->op_names) && !traced(t, op, layer)) return;
    char line[384], variant[48];
    const char *act = NULL;
    if (kop == EMBER_KOP_PRODUCT && w) {
        ember_kernels_product_variant(t->ops, w, variant, sizeof variant);
        act = ember_kernels_product_activations(t->ops, w);
    } else {
        snprintf(variant, sizeof variant, "%s", ember_kernels_op_variant(t->ops, kop));
    }
    const uint64_t fp = ember_fingerprint_f32(data, rows * cols);
    int len = snprintf(line, sizeof line,
                       "{\"event\":\"op\",\"eval\":%" PRId64 ",\"phase\":\"%s\",\"layer\":%" PRId64
                       ",\"op\":\"%s\",\"rows\":%" PRId64 ",\"cols\":%" PRId64 ",\"kernel\":\"%s\"%s%s%s"
                       ",\"fingerprint\":\"%016" PRIx64 "\"",
                       t->evals, phase_name(t->phase), layer, op, rows, cols, variant, act ? ",\"act\":\"" : "",
                       act ? act : "", act ? "\"" : "", fp);
    put_line(t, line, len, sizeof line, "");
}
