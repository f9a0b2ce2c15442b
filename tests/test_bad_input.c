/* test_bad_input.c — the engine's bad-input catalogue: crafted GGUF files, special files, model files
 * changed under a session, non-finite numerics and hostile tokenizer tables. Each case runs in a child
 * process, so a crash, a signal, a hang (alarm) or a runaway allocation (peak RSS, and RLIMIT_AS
 * outside sanitizer builds) is reported as that case's failure instead of ending the run. Each case
 * asserts the error family, that the message names the file and the field, and the bounds. */
#include "ember.h"
#include "gguf.h"
#include "tiny_model.h"
#include "ember_internal.h"
#include "tokenizer.h"
#include "test_models.h"
#include "test_support.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#define CASE_SECONDS 60     /* alarm per case: far above any case's real time */
#define CASE_MAX_RSS_MB 400 /* peak resident size of a case (sanitizer builds included) */
#define CASE_MAX_AS_MB 2048 /* address space of a case outside sanitizer builds */

/* ---- running a case in a child --------------------------------------------------------------- */

typedef struct {
    ember_status st;
    char msg[1024];
} outcome;

typedef void (*case_fn)(const void *arg, outcome *out);

typedef struct {
    outcome out;
    bool ran;   /* the child reported */
    int signal; /* the child died by this signal, 0 if it exited */
    long max_rss_kb;
} case_result;

static case_result run_case(case_fn fn, const void *arg) {
    case_result r = {.out = {.st = EMBER_OK}};
    int fds[2];
    if (pipe(fds) != 0) return r;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        alarm(CASE_SECONDS);
        if (!UNDER_ASAN) {
            struct rlimit lim = {.rlim_cur = (rlim_t)CASE_MAX_AS_MB << 20, .rlim_max = (rlim_t)CASE_MAX_AS_MB << 20};
            setrlimit(RLIMIT_AS, &lim);
        }
        outcome o = {.st = EMBER_OK};
        fn(arg, &o);
        ssize_t w = write(fds[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 3);
    }
    close(fds[1]);
    ssize_t got = 0, n;
    while (got < (ssize_t)sizeof r.out && (n = read(fds[0], (char *)&r.out + got, sizeof r.out - (size_t)got)) > 0)
        got += n;
    close(fds[0]);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {}
    r.ran = got == (ssize_t)sizeof r.out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    r.max_rss_kb = ru.ru_maxrss;
    r.out.msg[sizeof r.out.msg - 1] = 0;
    return r;
}

/* The case must end (no signal, no hang) with `code`, a message containing the path (if given) and
 * each of subs, within the memory bound. */
static void expect(const char *what, case_fn fn, const void *arg, ember_status code, const char *path, const char *sub1,
                   const char *sub2) {
    case_result r = run_case(fn, arg);
    CHECK_MSG(r.ran && r.signal == 0, "%s: the case did not finish (signal %d%s)", what, r.signal,
              r.signal == SIGALRM ? ": timed out" : "");
    if (!r.ran) return;
    if (getenv("EMBER_TEST_VERBOSE")) fprintf(stderr, "%-48s %3ld MiB  %s\n", what, r.max_rss_kb / 1024, r.out.msg);
    CHECK_MSG(r.out.st == code, "%s: status %d, expected %d: %.700s", what, r.out.st, code, r.out.msg);
    if (path) CHECK_MSG(strstr(r.out.msg, path) != NULL, "%s: message does not name %s: %.600s", what, path, r.out.msg);
    if (sub1) CHECK_MSG(strstr(r.out.msg, sub1) != NULL, "%s: message lacks '%s': %.700s", what, sub1, r.out.msg);
    if (sub2) CHECK_MSG(strstr(r.out.msg, sub2) != NULL, "%s: message lacks '%s': %.700s", what, sub2, r.out.msg);
    CHECK_MSG(r.max_rss_kb < (long)CASE_MAX_RSS_MB * 1024, "%s: peak RSS %ld KiB (bound %d MiB)", what, r.max_rss_kb,
              CASE_MAX_RSS_MB);
}

static const char *tmp_path(const char *name) {
    static char paths[8][1100];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 1100, "%s/bad-%s", ember_test_tmpdir(), name);
    return p;
}

/* ---- raw GGUF bytes -------------------------------------------------------------------------- */

typedef struct {
    unsigned char *b;
    size_t n, cap;
} bytes;

static void put(bytes *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->n + n) cap *= 2;
        o->b = realloc(o->b, cap);
        o->cap = cap;
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void put_u32(bytes *o, uint32_t v) { put(o, &v, 4); }
static void put_u64(bytes *o, uint64_t v) { put(o, &v, 8); }
static void put_str(bytes *o, const char *s) {
    put_u64(o, strlen(s));
    put(o, s, strlen(s));
}
static void put_header(bytes *o, uint64_t n_tensors, uint64_t n_kv) {
    put(o, "GGUF", 4);
    put_u32(o, 3);
    put_u64(o, n_tensors);
    put_u64(o, n_kv);
}
static void put_kv_u32(bytes *o, const char *key, uint32_t v) {
    put_str(o, key);
    put_u32(o, GGUF_TYPE_UINT32);
    put_u32(o, v);
}
static void put_tensor_1d(bytes *o, const char *name, uint32_t type, uint64_t ne0, uint64_t offset) {
    put_str(o, name);
    put_u32(o, 1);
    put_u64(o, ne0);
    put_u32(o, type);
    put_u64(o, offset);
}
static void pad_to(bytes *o, size_t align) {
    static const unsigned char zeros[64];
    while (o->n % align) put(o, zeros, 1);
}

static const char *write_bytes(const char *name, bytes *o) {
    const char *path = tmp_path(name);
    CHECK_MSG(ember_write_file(path, o->b, o->n), "cannot write %s", path);
    free(o->b);
    memset(o, 0, sizeof *o);
    return path;
}

static void open_gguf_case(const void *arg, outcome *o) {
    ember_gguf *g = NULL;
    ember_error err = {0};
    o->st = ember_gguf_open(arg, &g, &err);
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    ember_gguf_close(g);
}

static void load_model_case(const void *arg, outcome *o) {
    ember_model_params p = {.path = arg, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ember_model *m = NULL;
    ember_error err = {0};
    o->st = ember_model_load(&p, &m, &err);
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    ember_model_free(m);
}

/* ---- item 1: duplicate checks in linear time ------------------------------------------------- */

#define MANY_KEYS 100000
#define MANY_TENSORS 50000

/* 100,000 keys and 50,000 one-element f32 tensors; `dup` repeats the last key or tensor name. */
static const char *many_names_file(const char *name, int dup) {
    bytes o = {0};
    char s[64];
    put_header(&o, MANY_TENSORS, MANY_KEYS);
    for (int i = 0; i < MANY_KEYS; i++) {
        snprintf(s, sizeof s, "k.%06d", dup == 1 && i == MANY_KEYS - 1 ? 17 : i);
        put_kv_u32(&o, s, (uint32_t)i);
    }
    for (int i = 0; i < MANY_TENSORS; i++) {
        snprintf(s, sizeof s, "t.%06d", dup == 2 && i == MANY_TENSORS - 1 ? 4242 : i);
        put_tensor_1d(&o, s, 0, 8, (uint64_t)i * 32);
    }
    pad_to(&o, 32);
    for (int i = 0; i < MANY_TENSORS; i++) {
        float v[8] = {(float)i};
        put(&o, v, sizeof v);
    }
    return write_bytes(name, &o);
}

static void many_names_case(const void *arg, outcome *o) {
    ember_gguf *g = NULL;
    ember_error err = {0};
    o->st = ember_gguf_open(arg, &g, &err);
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    if (o->st != EMBER_OK) return;
    /* every name must be found, with its own value: the index is exercised, not only built */
    int64_t v;
    bool ok = ember_gguf_get_int(g, "k.099999", &v) && v == 99999 && ember_gguf_get_int(g, "k.000000", &v) && v == 0;
    const gguf_tensor *t = ember_gguf_find_tensor(g, "t.049999");
    float f = 0;
    if (t) memcpy(&f, t->data, 4);
    ok = ok && t && f == 49999.0f && !ember_gguf_find(g, "k.100000") && !ember_gguf_find_tensor(g, "t.050000");
    snprintf(o->msg, sizeof o->msg, "%llu keys, %llu tensors, lookups %s", (unsigned long long)g->n_kv,
             (unsigned long long)g->n_tensors, ok ? "right" : "WRONG");
    ember_gguf_close(g);
}

static void test_many_names(void) {
    const char *ok = many_names_file("many.gguf", 0);
    expect("100k keys + 50k tensors", many_names_case, ok, EMBER_OK, NULL, "100000 keys, 50000 tensors",
           "lookups right");
    const char *dk = many_names_file("many-dupkey.gguf", 1);
    expect("duplicate key among 100k", open_gguf_case, dk, EMBER_ERR_FORMAT, dk, "'k.000017'", "twice");
    const char *dt = many_names_file("many-duptensor.gguf", 2);
    expect("duplicate tensor among 50k", open_gguf_case, dt, EMBER_ERR_FORMAT, dt, "'t.004242'", "twice");
}

/* ---- sizes that overflow, bad blocks (item 13) ----------------------------------------------- */

static const char *one_tensor_file(const char *name, const char *tname, uint32_t type, uint64_t ne0) {
    bytes o = {0};
    put_header(&o, 1, 0);
    put_tensor_1d(&o, tname, type, ne0, 0);
    pad_to(&o, 32);
    unsigned char data[64] = {0};
    put(&o, data, sizeof data);
    return write_bytes(name, &o);
}

static void test_sizes(void) {
    const char *p = one_tensor_file("ne-2p62.gguf", "big", 0, (uint64_t)1 << 62);
    expect("f32 ne0 = 2^62", open_gguf_case, p, EMBER_ERR_FORMAT, p, "'big'", "overflows");
    p = one_tensor_file("ne-2p62p8.gguf", "wrap", 0, ((uint64_t)1 << 62) + 8);
    expect("f32 ne0 = 2^62+8 (would wrap to 32 bytes)", open_gguf_case, p, EMBER_ERR_FORMAT, p, "'wrap'", "overflows");
    p = one_tensor_file("q8-odd.gguf", "odd", 8, 33);
    expect("q8_0 row of 33", open_gguf_case, p, EMBER_ERR_FORMAT, p, "'odd'", "block size");
    p = one_tensor_file("iq2.gguf", "iq2", 16, 256);
    expect("unsupported type iq2_xxs", open_gguf_case, p, EMBER_ERR_UNSUPPORTED, p, "'iq2'", "iq2_xxs");
    p = one_tensor_file("esc-name.gguf", "x\x1b[31mred", 16, 256);
    expect("escape bytes in a tensor name are escaped", open_gguf_case, p, EMBER_ERR_UNSUPPORTED, p, "x\\x1B[31mred",
           NULL);
    p = one_tensor_file("past-end.gguf", "long", 0, 1024);
    expect("tensor past the end of the file", open_gguf_case, p, EMBER_ERR_FORMAT, p, "'long'", "runs past the end");
    bytes o = {0};
    put(&o, "GGUG", 4);
    for (int i = 0; i < 5; i++) put_u32(&o, 0);
    p = write_bytes("magic.gguf", &o);
    expect("bad magic", open_gguf_case, p, EMBER_ERR_FORMAT, p, "bad magic", NULL);
    put_header(&o, (uint64_t)1 << 40, 0);
    p = write_bytes("count.gguf", &o);
    expect("absurd tensor count", open_gguf_case, p, EMBER_ERR_FORMAT, p, "more than the file can hold", NULL);
}

/* ---- special files (item 8) ------------------------------------------------------------------ */

static void test_special_files(void) {
    const char *fifo = tmp_path("fifo.gguf");
    unlink(fifo);
    if (mkfifo(fifo, 0600) == 0) {
        expect("FIFO as the model", load_model_case, fifo, EMBER_ERR_IO, fifo, "FIFO", "not a regular file");
    } else {
        fprintf(stderr, "note: cannot make a FIFO here; that case is skipped\n");
    }
    expect("/dev/zero as the model", load_model_case, "/dev/zero", EMBER_ERR_IO, "/dev/zero", "character device", NULL);
    const char *dir = ember_test_tmpdir();
    expect("a directory as the model", load_model_case, dir, EMBER_ERR_IO, dir, "directory", NULL);
    const char *none = tmp_path("does-not-exist.gguf");
    expect("missing model file", load_model_case, none, EMBER_ERR_IO, none, "cannot open", NULL);
}

/* ---- hyper-parameters (items 6, 7, 13) ------------------------------------------------------- */

static ember_gguf_writer *tiny(const char *family, ember_type dtype) { return ember_test_tiny_writer(family, dtype); }

/* Writes w to tmp/name, frees w, returns the path (static). */
static const char *finish(ember_gguf_writer *w, const char *name) { return ember_test_write_model(w, tmp_path(name)); }

static const char *with_u32(const char *family, const char *key, uint32_t v, const char *name) {
    ember_gguf_writer *w = tiny(family, EMBER_TYPE_F32);
    ember_gguf_writer_remove_key(w, key);
    ember_gguf_writer_set_u32(w, key, v);
    return finish(w, name);
}

static const char *with_f32(const char *family, const char *key, float v, const char *name) {
    ember_gguf_writer *w = tiny(family, EMBER_TYPE_F32);
    ember_gguf_writer_remove_key(w, key);
    ember_gguf_writer_set_f32(w, key, v);
    return finish(w, name);
}

static void test_hyper_parameters(void) {
    const char *p = with_u32("llama", "llama.block_count", 520000000u, "blocks-520m.gguf");
    expect("block_count 520M", load_model_case, p, EMBER_ERR_FORMAT, p, "llama.block_count", "6 layers");
    p = with_u32("llama", "llama.block_count", 0xFFFFFFFFu, "blocks-2p32.gguf");
    expect("block_count 2^32-1", load_model_case, p, EMBER_ERR_FORMAT, p, "llama.block_count", "4294967295");
    p = with_u32("gemma4", "gemma4.block_count", 520000000u, "gemma-blocks.gguf");
    expect("gemma4 block_count 520M", load_model_case, p, EMBER_ERR_FORMAT, p, "gemma4.block_count", NULL);
    p = with_u32("gpt2", "gpt2.block_count", 7, "gpt2-blocks.gguf");
    expect("gpt2 block_count one past the tensors", load_model_case, p, EMBER_ERR_FORMAT, p, "gpt2.block_count",
           "blk.5");
    {
        /* a stray high layer number does not count: layers must be there from blk.0 up */
        ember_gguf_writer *sw = tiny("llama", EMBER_TYPE_F32);
        const float one = 1.0f;
        const int64_t ne1[1] = {1};
        ember_gguf_writer_add_tensor(sw, "blk.999999999.stray", EMBER_TYPE_F32, 1, ne1, &one);
        ember_gguf_writer_remove_key(sw, "llama.block_count");
        ember_gguf_writer_set_u32(sw, "llama.block_count", 1000000000u);
        p = finish(sw, "blocks-stray.gguf");
        expect("block_count 10^9 with a stray blk.999999999 tensor", load_model_case, p, EMBER_ERR_FORMAT, p,
               "llama.block_count", "6 layers");
    }
    p = with_u32("llama", "llama.embedding_length", 0x7FFFFFFFu, "width.gguf");
    expect("embedding_length 2^31-1", load_model_case, p, EMBER_ERR_FORMAT, p, "llama.embedding_length",
           "larger than any tensor dimension");
    p = with_u32("llama", "llama.attention.head_count", 0x40000000u, "heads.gguf");
    expect("head_count 2^30", load_model_case, p, EMBER_ERR_FORMAT, p, "llama.attention.head_count", NULL);
    p = with_u32("gemma4", "gemma4.embedding_length_per_layer_input", 0x40000000u, "ple.gguf");
    expect("gemma4 per-layer width 2^30", load_model_case, p, EMBER_ERR_FORMAT, p, "embedding_length_per_layer_input",
           NULL);

    p = with_f32("llama", "llama.attention.layer_norm_rms_epsilon", NAN, "eps-nan.gguf");
    expect("rms epsilon NaN", load_model_case, p, EMBER_ERR_FORMAT, p, "llama.attention.layer_norm_rms_epsilon", "nan");
    p = with_f32("qwen3", "qwen3.attention.layer_norm_rms_epsilon", -1e-6f, "eps-neg.gguf");
    expect("rms epsilon negative", load_model_case, p, EMBER_ERR_FORMAT, p, "qwen3.attention.layer_norm_rms_epsilon",
           "-1e-06");
    p = with_f32("gpt2", "gpt2.attention.layer_norm_epsilon", INFINITY, "ln-eps-inf.gguf");
    expect("gpt2 layer-norm epsilon inf", load_model_case, p, EMBER_ERR_FORMAT, p, "gpt2.attention.layer_norm_epsilon",
           "inf");
    p = with_f32("llama", "llama.rope.freq_base", 0.0f, "rope-0.gguf");
    expect("rope.freq_base 0", load_model_case, p, EMBER_ERR_FORMAT, p, "llama.rope.freq_base", "= 0");
    p = with_f32("llama", "llama.rope.freq_base", NAN, "rope-nan.gguf");
    expect("rope.freq_base NaN", load_model_case, p, EMBER_ERR_FORMAT, p, "llama.rope.freq_base", "nan");
    p = with_f32("gemma4", "gemma4.rope.freq_base_swa", -10000.0f, "rope-neg.gguf");
    expect("gemma4 rope.freq_base_swa negative", load_model_case, p, EMBER_ERR_FORMAT, p, "gemma4.rope.freq_base_swa",
           "-10000");

    ember_gguf_writer *w = tiny("llama", EMBER_TYPE_F32);
    ember_gguf_writer_remove_key(w, "general.architecture");
    ember_gguf_writer_set_u32(w, "general.architecture", 7);
    p = finish(w, "arch-u32.gguf");
    expect("general.architecture as u32", load_model_case, p, EMBER_ERR_FORMAT, p, "general.architecture",
           "wrong type");
    w = tiny("llama", EMBER_TYPE_F32);
    ember_gguf_writer_remove_key(w, "general.architecture");
    ember_gguf_writer_set_string(w, "general.architecture",
                                 "ll\x1b]0;owned\x07"
                                 "ama");
    p = finish(w, "arch-esc.gguf");
    expect("escape bytes in general.architecture", load_model_case, p, EMBER_ERR_UNSUPPORTED, p,
           "ll\\x1B]0;owned\\x07ama", "not supported");
    w = tiny("llama", EMBER_TYPE_F32);
    ember_gguf_writer_remove_key(w, "general.architecture");
    p = finish(w, "arch-missing.gguf");
    expect("general.architecture missing", load_model_case, p, EMBER_ERR_FORMAT, p, "missing metadata key", NULL);
    w = tiny("llama", EMBER_TYPE_F32);
    ember_gguf_writer_remove_tensor(w, "blk.3.ffn_up.weight");
    p = finish(w, "no-ffn-up.gguf");
    expect("a layer tensor missing", load_model_case, p, EMBER_ERR_FORMAT, p, "blk.3.ffn_up.weight", NULL);
}

/* ---- model file changed under a session (item 5) --------------------------------------------- */

static const char *truncate_model_path;

typedef struct {
    ember_kernels kernels;
    ember_type dtype;
    bool during;  /* truncate from a hook while the evaluation runs */
    bool rewrite; /* rewrite the bytes in place instead of truncating */
} change_case;

static ember_status truncating_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                                    ember_error *err) {
    (void)stage, (void)v, (void)err;
    if (ctx->layer_index == 0 && truncate(user, 4096) != 0) return EMBER_ERR_IO;
    return EMBER_OK;
}

static void changed_file_case(const void *arg, outcome *o) {
    const change_case *c = arg;
    /* a private copy: the case changes it */
    char copy[1200];
    snprintf(copy, sizeof copy, "%s.%d", truncate_model_path, (int)getpid());
    size_t len;
    char *data = ember_read_file(truncate_model_path, &len);
    if (!data || !ember_write_file(copy, data, len)) {
        o->st = EMBER_ERR_ARG;
        snprintf(o->msg, sizeof o->msg, "cannot copy the model");
        free(data);
        return;
    }
    free(data);
    ember_model_params p = {.path = copy, .kernels = c->kernels, .n_threads = 2};
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    const int32_t ids[2] = {1, 2};
    if ((o->st = ember_model_load(&p, &m, &err)) != EMBER_OK) goto done;
    if ((o->st = ember_session_new(m, 16, &s, &err)) != EMBER_OK) goto done;
    if ((o->st = ember_session_prefill(s, ids, 2, NULL, &err)) != EMBER_OK) goto done; /* works before */
    if (c->during) {
        ember_hooks h = {.user = copy};
        h.on_tensor[EMBER_STAGE_BEFORE_LAYER] = truncating_hook;
        o->st = ember_session_prefill(s, ids, 2, &h, &err);
    } else {
        if (c->rewrite) {
            int fd = open(copy, O_WRONLY);
            char junk[4096];
            memset(junk, 0x7F, sizeof junk);
            if (fd < 0 || pwrite(fd, junk, sizeof junk, (off_t)(len / 2)) != (ssize_t)sizeof junk)
                o->st = EMBER_ERR_ARG;
            if (fd >= 0) close(fd);
        } else if (truncate(copy, 4096) != 0) {
            o->st = EMBER_ERR_ARG;
        }
        if (o->st == EMBER_OK) o->st = ember_session_prefill(s, ids, 2, NULL, &err);
    }
    /* once failed, it stays failed: the next evaluation must not compute on the changed file */
    if (o->st != EMBER_OK) {
        ember_error again = {0};
        if (ember_session_prefill(s, ids, 1, NULL, &again) != o->st) snprintf(err.msg, sizeof err.msg, "recovered?!");
    }
done:
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    ember_session_free(s);
    ember_model_free(m);
    unlink(copy);
}

static bool kernels_usable(ember_kernels k) {
    const ember_cpu_features *f = ember_cpu();
    if (k == EMBER_KERNELS_AVX2) return f->avx2 && f->fma && f->f16c;
    if (k == EMBER_KERNELS_AVX512) return f->avx512f && f->avx512bw && f->avx512vl;
    return true;
}

static void test_changed_file(void) {
    ember_tiny_model_params tp;
    ember_tiny_model_defaults(&tp);
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    const ember_type dtypes[] = {EMBER_TYPE_F32, EMBER_TYPE_Q8_0};
    for (size_t d = 0; d < 2; d++) {
        tp.dtype = dtypes[d];
        static char model[1100];
        snprintf(model, sizeof model, "%s", tmp_path(d ? "change-q8_0.gguf" : "change-f32.gguf"));
        ember_error err = {0};
        CHECK_MSG(ember_tiny_model_write(&tp, model, &err) == EMBER_OK, "%.900s", err.msg);
        truncate_model_path = model;
        for (size_t k = 0; k < 3; k++) {
            if (!kernels_usable(sets[k])) {
                fprintf(stderr, "note: this CPU lacks %s; its changed-file cases are skipped\n",
                        ember_kernels_name(sets[k]));
                continue;
            }
            char what[160];
            change_case c = {.kernels = sets[k], .dtype = dtypes[d]};
            snprintf(what, sizeof what, "truncated after load (%s, %s)", ember_kernels_name(sets[k]),
                     ember_type_name(dtypes[d]));
            expect(what, changed_file_case, &c, EMBER_ERR_IO, model, "changed after it was loaded", NULL);
            c.rewrite = true;
            snprintf(what, sizeof what, "rewritten in place (%s, %s)", ember_kernels_name(sets[k]),
                     ember_type_name(dtypes[d]));
            expect(what, changed_file_case, &c, EMBER_ERR_IO, model, "rewritten in place", NULL);
            c.rewrite = false;
            c.during = true;
            snprintf(what, sizeof what, "truncated during prefill (%s, %s)", ember_kernels_name(sets[k]),
                     ember_type_name(dtypes[d]));
            /* f32 weights are read from the mapping on every set: the read past the end faults and
             * the guard turns it into the error; q8_0 weights may be repacked copies (no fault),
             * then the size check after the evaluation reports it */
            expect(what, changed_file_case, &c, EMBER_ERR_IO, model,
                   dtypes[d] == EMBER_TYPE_F32 ? "truncated while in use" : "reload the model", NULL);
        }
    }
}

/* ---- non-finite numerics (item 6) ------------------------------------------------------------ */

typedef struct {
    const char *path;
    bool allow;
    int hook_layer; /* >= 0: a hook writes NaN at after_mlp of this layer */
    int ban;        /* 1: an after_logits hook sets one logit to -inf; 2: all of them */
} nonfinite_case;

static ember_status ban_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                             ember_error *err) {
    (void)stage, (void)ctx, (void)err;
    const nonfinite_case *c = user;
    for (int64_t i = 0; i < (c->ban == 2 ? v->cols : 1); i++) v->data[i] = -INFINITY;
    return EMBER_OK;
}

static ember_status nan_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                             ember_error *err) {
    (void)stage, (void)err;
    if (ctx->layer_index == *(const int *)user) v->data[v->cols + 3] = NAN;
    return EMBER_OK;
}

static void nonfinite_run(const void *arg, outcome *o) {
    const nonfinite_case *c = arg;
    ember_model_params p = {
        .path = c->path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1, .allow_nonfinite = c->allow};
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    const int32_t ids[3] = {5, 6, 7};
    ember_hooks h = {.user = (void *)&c->hook_layer}, ban = {.user = (void *)c};
    h.on_tensor[EMBER_STAGE_AFTER_MLP] = nan_hook;
    ban.on_tensor[EMBER_STAGE_AFTER_LOGITS] = ban_hook;
    if ((o->st = ember_model_load(&p, &m, &err)) == EMBER_OK &&
        (o->st = ember_session_new(m, 16, &s, &err)) == EMBER_OK) {
        o->st = ember_session_prefill(s, ids, 3, c->ban ? &ban : c->hook_layer >= 0 ? &h : NULL, &err);
        if (o->st == EMBER_OK) {
            const float *logits = ember_session_logits(s);
            bool finite = true;
            for (int64_t i = 0; i < ember_model_get_info(m)->n_vocab; i++) finite = finite && isfinite(logits[i]);
            snprintf(err.msg, sizeof err.msg, "ran on; logits %s", finite ? "finite" : "non-finite");
        }
    }
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    ember_session_free(s);
    ember_model_free(m);
}

static void test_nonfinite(void) {
    ember_gguf_writer *w = tiny("llama", EMBER_TYPE_F32);
    float norm[64];
    for (int i = 0; i < 64; i++) norm[i] = 1.0f;
    norm[10] = NAN;
    const int64_t ne[1] = {64};
    ember_gguf_writer_remove_tensor(w, "blk.2.ffn_norm.weight");
    ember_gguf_writer_add_tensor(w, "blk.2.ffn_norm.weight", EMBER_TYPE_F32, 1, ne, norm);
    const char *nan_norm = finish(w, "nan-norm.gguf");
    nonfinite_case c = {.path = nan_norm, .hook_layer = -1};
    expect("NaN in a norm weight", nonfinite_run, &c, EMBER_ERR_NONFINITE, nan_norm, "mlp_activation of layer 2",
           "allow_nonfinite");
    c.allow = true;
    expect("NaN in a norm weight, allow_nonfinite", nonfinite_run, &c, EMBER_OK, NULL, "ran on; logits non-finite",
           NULL);

    w = tiny("llama", EMBER_TYPE_F32);
    for (int i = 0; i < 64; i++) norm[i] = 1.0f;
    norm[0] = INFINITY;
    ember_gguf_writer_remove_tensor(w, "output_norm.weight");
    ember_gguf_writer_add_tensor(w, "output_norm.weight", EMBER_TYPE_F32, 1, ne, norm);
    const char *inf_out = finish(w, "inf-output-norm.gguf");
    nonfinite_case o = {.path = inf_out, .hook_layer = -1};
    expect("Inf in the output norm", nonfinite_run, &o, EMBER_ERR_NONFINITE, inf_out, "at before_logits", NULL);

    const char *clean = finish(tiny("llama", EMBER_TYPE_F32), "clean.gguf");
    nonfinite_case hk = {.path = clean, .hook_layer = 3};
    expect("a hook writes NaN", nonfinite_run, &hk, EMBER_ERR_NONFINITE, clean, "after_mlp of layer 3",
           "token row 1, column 3");
    hk.allow = true;
    expect("a hook writes NaN, allow_nonfinite", nonfinite_run, &hk, EMBER_OK, NULL, "ran on", NULL);
    nonfinite_case fine = {.path = clean, .hook_layer = -1};
    expect("finite model passes the check", nonfinite_run, &fine, EMBER_OK, NULL, "logits finite", NULL);
    nonfinite_case ban1 = {.path = clean, .hook_layer = -1, .ban = 1};
    expect("a hook bans a token with -inf", nonfinite_run, &ban1, EMBER_OK, NULL, "ran on; logits non-finite", NULL);
    nonfinite_case ban_all = {.path = clean, .hook_layer = -1, .ban = 2};
    expect("a hook sets every logit to -inf", nonfinite_run, &ban_all, EMBER_ERR_NONFINITE, clean, "logit 0 = -inf",
           "at after_logits (column 0 = -inf)");
}

/* ---- tokenizer tables (items 14, 15) --------------------------------------------------------- */

static void sparse_id_case(const void *arg, outcome *o) {
    (void)arg;
    ember_tokenizer_builder *b = NULL;
    ember_tokenizer *t = NULL;
    ember_error err = {0};
    ember_tokenizer_config cfg = {.bos_id = -1, .eos_id = -1, .unk_id = -1};
    if ((o->st = ember_tokenizer_builder_new("sparse.json", &b, &err)) == EMBER_OK &&
        (o->st = ember_tokenizer_builder_add_token(b, 16777215, "a", 1, 0, EMBER_TOKEN_NORMAL, &err)) == EMBER_OK) {
        o->st = ember_tokenizer_builder_finish(b, &cfg, &t, &err);
        b = NULL;
    }
    ember_tokenizer_builder_free(b);
    ember_tokenizer_free(t);
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
}

static void dense_ids_case(const void *arg, outcome *o) {
    (void)arg;
    ember_tokenizer_builder *b = NULL;
    ember_tokenizer *t = NULL;
    ember_error err = {0};
    ember_tokenizer_config cfg = {.bos_id = -1, .eos_id = -1, .unk_id = -1};
    char s[16];
    o->st = ember_tokenizer_builder_new("dense.json", &b, &err);
    /* out of order, with a small gap at the end, as tokenizer.json (a hash) delivers them */
    for (int i = 299; i >= 0 && o->st == EMBER_OK; i--) {
        snprintf(s, sizeof s, "t%d", i);
        o->st = ember_tokenizer_builder_add_token(b, i < 290 ? i : i + 20, s, strlen(s), 0, EMBER_TOKEN_NORMAL, &err);
    }
    if (o->st == EMBER_OK)
        o->st = ember_tokenizer_builder_add_merge(b, "t1", 2, "t2", 2, &err) == EMBER_ERR_FORMAT
                    ? EMBER_OK
                    : EMBER_ERR_ARG; /* "t1t2" is no token */
    if (o->st == EMBER_OK) {
        o->st = ember_tokenizer_builder_finish(b, &cfg, &t, &err);
        b = NULL;
    }
    if (o->st == EMBER_OK) {
        size_t len;
        const char *txt = ember_tokenizer_token_text(t, 319, &len);
        bool ok = ember_tokenizer_vocab_size(t) == 320 && txt && len == 4 && memcmp(txt, "t299", 4) == 0 &&
                  ember_tokenizer_find(t, "t17", 3) == 17 && !ember_tokenizer_token_text(t, 295, &len);
        snprintf(err.msg, sizeof err.msg, "table %s", ok ? "right" : "WRONG");
    }
    ember_tokenizer_builder_free(b);
    ember_tokenizer_free(t);
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
}

static void duplicate_id_case(const void *arg, outcome *o) {
    (void)arg;
    ember_tokenizer_builder *b = NULL;
    ember_error err = {0};
    if ((o->st = ember_tokenizer_builder_new("dup.json", &b, &err)) == EMBER_OK &&
        (o->st = ember_tokenizer_builder_add_token(b, 3, "x", 1, 0, EMBER_TOKEN_NORMAL, &err)) == EMBER_OK)
        o->st = ember_tokenizer_builder_add_token(b, 3, "y", 1, 0, EMBER_TOKEN_NORMAL, &err);
    ember_tokenizer_builder_free(b);
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
}

typedef struct {
    const char *model, *vocab;
} cross_case;

static void cross_check_case(const void *arg, outcome *o) {
    const cross_case *c = arg;
    ember_gguf *gm = NULL, *gv = NULL;
    ember_tokenizer *t = NULL;
    ember_error err = {0};
    if ((o->st = ember_gguf_open(c->model, &gm, &err)) == EMBER_OK &&
        (o->st = ember_gguf_open(c->vocab, &gv, &err)) == EMBER_OK &&
        (o->st = ember_tokenizer_from_gguf(gv, &t, &err)) == EMBER_OK)
        o->st = ember_tokenizer_check_gguf(t, gm, &err);
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    ember_tokenizer_free(t);
    ember_gguf_close(gv);
    ember_gguf_close(gm);
}

static void test_tokenizer_tables(void) {
    expect("one token at id 16,777,215", sparse_id_case, NULL, EMBER_ERR_FORMAT, "sparse.json", "16777215",
           "contiguous");
    expect("ids out of order with a gap", dense_ids_case, NULL, EMBER_OK, NULL, "table right", NULL);
    expect("one id, two strings", duplicate_id_case, NULL, EMBER_ERR_FORMAT, "dup.json", "token id 3", "'x' and 'y'");

    const char *llama = finish(tiny("llama", EMBER_TYPE_F32), "vocab-llama.gguf");
    const char *gpt2 = finish(tiny("gpt2", EMBER_TYPE_F32), "vocab-gpt2.gguf");
    ember_tiny_model_params tp;
    ember_tiny_model_defaults(&tp);
    tp.n_vocab = 300;
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_error err = {0};
    CHECK_MSG(ember_tiny_model_build(&tp, w, &err) == EMBER_OK, "%.900s", err.msg);
    const char *small = finish(w, "vocab-small.gguf");
    cross_case same = {.model = llama, .vocab = llama};
    expect("tokenizer matches the GGUF vocabulary", cross_check_case, &same, EMBER_OK, NULL, NULL, NULL);
    cross_case bigger = {.model = small, .vocab = llama};
    expect("tokenizer larger than the GGUF vocabulary", cross_check_case, &bigger, EMBER_ERR_ARG, small, llama,
           "512 token ids against 300");
    cross_case other = {.model = gpt2, .vocab = llama};
    case_result r = run_case(cross_check_case, &other);
    /* the tiny families share the tokenizer layout; what differs must be named if anything does */
    CHECK_MSG(r.ran && (r.out.st == EMBER_OK || (strstr(r.out.msg, gpt2) && strstr(r.out.msg, llama))),
              "cross-family check: %d %.600s", r.out.st, r.out.msg);
}

/* ---- item 2: sessions sized against the model and the memory there is ------------------------ */

/* arg: path; opens a session of the context in the path's companion global (0: the default). */
static int64_t session_ctx;
static void session_case(const void *arg, outcome *o) {
    ember_model_params p = {.path = arg, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ember_model *m = NULL;
    ember_error err = {0};
    o->st = ember_model_load(&p, &m, &err);
    if (o->st == EMBER_OK) {
        ember_session *s = NULL;
        o->st = ember_session_new(m, session_ctx, &s, &err);
        ember_session_free(s);
    }
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    ember_model_free(m);
}

static void test_sessions(void) {
    const char *p = with_u32("llama", "llama.context_length", 0, "ctx0.gguf");
    session_ctx = 0;
    expect("context_length 0, default context", session_case, p, EMBER_ERR_ARG, NULL,
           "session: the model's context_length is 0", "explicit context");
    session_ctx = 8;
    expect("context_length 0, explicit context", session_case, p, EMBER_OK, NULL, NULL, NULL);
    /* 2 layers of 2 x 2048 floats a position: 2^24 positions need about 550 GB, more than any
     * MemAvailable (or the RLIMIT_AS of a case) here; refused before allocating */
    ember_tiny_model_params tp;
    ember_tiny_model_defaults(&tp);
    tp.dtype = EMBER_TYPE_F32;
    tp.n_layer = 2;
    tp.n_embd = 32;
    tp.n_head = 2;
    tp.n_head_kv = 2;
    tp.head_dim = 1024;
    tp.n_ff = 32;
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_error err = {0};
    CHECK_MSG(ember_tiny_model_build(&tp, w, &err) == EMBER_OK, "%.900s", err.msg);
    p = finish(w, "wide-kv.gguf");
    session_ctx = (int64_t)1 << 24;
    /* 2 layers x (K, V) x 2048 wide x 4 bytes x 2^24 = 549,755,813,888 bytes of cache, plus the
     * chunked attention scratch (about 0.54 GB at this context): 550.3 GB */
    expect("KV cache beyond the memory available", session_case, p, EMBER_ERR_NOMEM, NULL,
           "16777216-token context needs 550", "bytes available");
    session_ctx = 64;
    expect("a KV cache that fits", session_case, p, EMBER_OK, NULL, NULL, NULL);
}

int main(void) {
    test_many_names();
    test_sizes();
    test_special_files();
    test_hyper_parameters();
    test_changed_file();
    test_nonfinite();
    test_tokenizer_tables();
    test_sessions();
    return ember_test_finish();
}
