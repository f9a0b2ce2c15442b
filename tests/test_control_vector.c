/* test_control_vector.c — ember_control_vector_read on files written with the project's GGUF writer
 * the way llama.cpp's cvector-generator writes them: directions come back in file order with their
 * layer numbers and exact values; every malformation llama.cpp refuses (and a model file given by
 * mistake) is an error naming the file and the tensor. The tools' ember_control_vector_write makes
 * files this reader reads back exactly, and refuses what it could not read. */
#include "ember_internal.h"
#include "ember_tiny_model.h"
#include "gguf_writer.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#define N_EMBD 24

static void direction(int seed, float *out) {
    for (int i = 0; i < N_EMBD; i++) out[i] = (float)((i * seed + 5) % 11 - 5) / 4.0f;
}

/* writes a control vector with the given direction layers (and the cvector-generator keys) */
static void write_cvec(const char *path, const int *layers, int n, const char *arch, int width_of_last) {
    ember_gguf_writer *w = ember_gguf_writer_new();
    if (arch) ember_gguf_writer_set_string(w, "general.architecture", arch);
    ember_gguf_writer_set_string(w, "controlvector.model_hint", "llama");
    ember_gguf_writer_set_i32(w, "controlvector.layer_count", n);
    for (int i = 0; i < n; i++) {
        float v[N_EMBD];
        direction(layers[i] + 1, v);
        char name[64];
        snprintf(name, sizeof name, "direction.%d", layers[i]);
        int64_t ne[1] = {i == n - 1 && width_of_last ? width_of_last : N_EMBD};
        ember_gguf_writer_add_tensor(w, name, EMBER_TYPE_F32, 1, ne, v);
    }
    ember_error err = {0};
    CHECK_MSG(ember_gguf_writer_write(w, path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_gguf_writer_free(w);
}

static void expect_error(const char *path, const char *text) {
    ember_control_vector *cv = (ember_control_vector *)1;
    ember_error err = {0};
    ember_status st = ember_control_vector_read(path, &cv, &err);
    CHECK_MSG(st != EMBER_OK && cv == NULL, "%s: read succeeded", path);
    CHECK_MSG(strstr(err.msg, path) != NULL, "message does not name the file: %.900s", err.msg);
    CHECK_MSG(strstr(err.msg, text) != NULL, "expected %.60s in: %.900s", text, err.msg);
}

/* ember_control_vector_write: read back exactly; layer 0, unordered layers, a NaN refused with
 * the file named, and no file left behind */
static void test_writer(const char *path) {
    const int64_t layers[] = {1, 2, 5};
    float values[3 * N_EMBD];
    for (int i = 0; i < 3; i++) direction(i + 2, values + i * N_EMBD);
    ember_error err = {0};
    remove(path);
    CHECK_MSG(ember_control_vector_write(path, "qwen3", N_EMBD, 3, layers, values, &err) == EMBER_OK, "%.900s",
              err.msg);
    ember_control_vector *cv = NULL;
    CHECK_MSG(ember_control_vector_read(path, &cv, &err) == EMBER_OK, "%.900s", err.msg);
    if (cv) {
        CHECK(cv->n_embd == N_EMBD && cv->n_directions == 3 && cv->layer_count == 3);
        CHECK(cv->model_hint && strcmp(cv->model_hint, "qwen3") == 0);
        for (int i = 0; i < 3; i++) CHECK(cv->layers[i] == layers[i]);
        CHECK(memcmp(cv->values, values, sizeof values) == 0);
        ember_control_vector_free(cv);
    }
    remove(path);
    const int64_t zero[] = {0}, unordered[] = {2, 1};
    CHECK(ember_control_vector_write(path, "x", N_EMBD, 1, zero, values, &err) != EMBER_OK);
    CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "direction.0"), "%.900s", err.msg);
    CHECK(ember_control_vector_write(path, "x", N_EMBD, 2, unordered, values, &err) != EMBER_OK);
    CHECK_MSG(strstr(err.msg, "direction.1 after direction.2"), "%.900s", err.msg);
    float nan_values[N_EMBD];
    direction(3, nan_values);
    nan_values[4] = 0.0f / 0.0f;
    CHECK(ember_control_vector_write(path, "x", N_EMBD, 1, layers, nan_values, &err) != EMBER_OK);
    CHECK_MSG(strstr(err.msg, "direction.1[4] is not finite"), "%.900s", err.msg);
    FILE *left = fopen(path, "rb");
    CHECK_MSG(left == NULL, "a refused write left %.900s", path);
    if (left) fclose(left);
}

int main(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/cvec.gguf", ember_test_tmpdir());

    /* a good file: directions 3, 1, 7 in that order */
    const int layers[] = {3, 1, 7};
    write_cvec(path, layers, 3, "controlvector", 0);
    ember_control_vector *cv = NULL;
    ember_error err = {0};
    CHECK_MSG(ember_control_vector_read(path, &cv, &err) == EMBER_OK, "%.900s", err.msg);
    if (cv) {
        CHECK(cv->n_embd == N_EMBD && cv->n_directions == 3 && cv->layer_count == 3);
        CHECK(cv->model_hint && strcmp(cv->model_hint, "llama") == 0);
        for (int i = 0; i < 3; i++) {
            float v[N_EMBD];
            direction(layers[i] + 1, v);
            CHECK_MSG(cv->layers[i] == layers[i], "direction %d: layer %lld", i, (long long)cv->layers[i]);
            CHECK_MSG(memcmp(cv->values + i * N_EMBD, v, sizeof v) == 0, "direction.%d values differ", layers[i]);
        }
        ember_control_vector_free(cv);
    }

    /* without general.architecture the file is still a control vector (llama.cpp reads no key) */
    write_cvec(path, layers, 1, NULL, 0);
    cv = NULL;
    CHECK_MSG(ember_control_vector_read(path, &cv, &err) == EMBER_OK, "%.900s", err.msg);
    if (cv) CHECK(cv->layer_count == 1 && cv->layers[0] == 3);
    ember_control_vector_free(cv);

    const int zero[] = {2, 0};
    write_cvec(path, zero, 2, "controlvector", 0);
    expect_error(path, "tensor 'direction.0': layer 0 cannot be steered");
    write_cvec(path, layers, 3, "controlvector", N_EMBD - 1);
    expect_error(path, "tensor 'direction.7' has 23 values, 'direction.3' has 24");
    write_cvec(path, layers, 2, "llama", 0);
    expect_error(path, "general.architecture is 'llama', not 'controlvector'");

    /* names llama.cpp would misread or refuse, a matrix, a non-f32 tensor, an empty file */
    static const char *bad_names[] = {"direction.", "direction.-1", "direction.3x", "dir.1", "direction.1234567890"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        ember_gguf_writer *w = ember_gguf_writer_new();
        float v[N_EMBD] = {0};
        int64_t ne[1] = {N_EMBD};
        ember_gguf_writer_add_tensor(w, bad_names[i], EMBER_TYPE_F32, 1, ne, v);
        CHECK(ember_gguf_writer_write(w, path, &err) == EMBER_OK);
        ember_gguf_writer_free(w);
        char want[128];
        snprintf(want, sizeof want, "tensor '%s' is not named direction.N", bad_names[i]);
        expect_error(path, want);
    }
    {
        ember_gguf_writer *w = ember_gguf_writer_new();
        float v[N_EMBD] = {0};
        int64_t ne[2] = {N_EMBD / 2, 2};
        ember_gguf_writer_add_tensor(w, "direction.1", EMBER_TYPE_F32, 2, ne, v);
        CHECK(ember_gguf_writer_write(w, path, &err) == EMBER_OK);
        ember_gguf_writer_free(w);
        expect_error(path, "tensor 'direction.1' is not one-dimensional");
    }
    {
        ember_gguf_writer *w = ember_gguf_writer_new();
        float v[N_EMBD] = {0};
        int64_t ne[1] = {N_EMBD};
        ember_gguf_writer_add_tensor(w, "direction.1", EMBER_TYPE_F16, 1, ne, v);
        CHECK(ember_gguf_writer_write(w, path, &err) == EMBER_OK);
        ember_gguf_writer_free(w);
        expect_error(path, "tensor 'direction.1' is f16, not f32");
    }
    {
        ember_gguf_writer *w = ember_gguf_writer_new();
        ember_gguf_writer_set_string(w, "general.architecture", "controlvector");
        CHECK(ember_gguf_writer_write(w, path, &err) == EMBER_OK);
        ember_gguf_writer_free(w);
        expect_error(path, "no direction.N tensors");
    }
    expect_error("/nonexistent/cvec.gguf", "/nonexistent/cvec.gguf");
    test_writer(path);
    return ember_test_finish();
}
