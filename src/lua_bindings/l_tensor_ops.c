/* l_tensor_ops.c — the computing side of ember.Tensor / ember.TensorView: softmax, matmul, dot,
 * broadcasting arithmetic, reductions, slices, heads and token-space helpers. Never writes to its
 * operands: results are new owned Tensors (or, for the selections of a view — slice, head —
 * sub-views that write through). */
#include "l_tensor_ops.h"
#include "l_tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A read-only look at either type (l_tensor.h). */
typedef ember_lua_ref cref;

/* The operand at i, contiguous: what every computing method reads (a strided view's values are
 * gathered first, l_tensor.c). */
static cref check_ref(lua_State *L, int i, const char *fname) { return ember_lua_check_dense(L, i, fname); }

static bool is_tensor(lua_State *L, int i) {
    return luaL_testudata(L, i, EMBER_LUA_TENSOR) || luaL_testudata(L, i, EMBER_LUA_VIEW);
}

static const char *shape_str(lua_State *L, int64_t rows, int64_t cols) {
    return lua_pushfstring(L, "[%I, %I]", (lua_Integer)rows, (lua_Integer)cols);
}

/* A new owned tensor for a result, after every check has passed. */
static float *new_tensor(lua_State *L, int64_t rows, int64_t cols, const char *fname) {
    if (!ember_lua_shape_ok(rows, cols))
        luaL_error(L, "%s: a result of shape [%I, %I] is larger than 2^32 values", fname, (lua_Integer)rows,
                   (lua_Integer)cols);
    return ember_lua_push_tensor(L, rows, cols)->data;
}

/* Scratch that Lua's GC frees even if a later call raises. */
static double *scratch_doubles(lua_State *L, int64_t n) { return lua_newuserdatauv(L, (size_t)n * sizeof(double), 0); }

/* Rows r0..r0+n-1: a sub-view of a view, a copy of a tensor. */
static void push_rows(lua_State *L, int idx, const cref *t, int64_t r0, int64_t n, const char *fname) {
    if (t->view) {
        ember_lua_push_subview(L, idx, t, t->data + r0 * t->stride, n, t->cols);
        return;
    }
    float *out = new_tensor(L, n, t->cols, fname);
    memcpy(out, t->data + r0 * t->cols, (size_t)(n * t->cols) * sizeof(float));
}

/* A 1-based row argument, optional only for one-row tensors. */
static int64_t opt_row(lua_State *L, int arg, const cref *t, const char *fname) {
    if (lua_isnoneornil(L, arg)) {
        if (t->rows != 1)
            luaL_error(L, "%s: the tensor has %I rows; pass the row (1-based)", fname, (lua_Integer)t->rows);
        return 0;
    }
    lua_Integer r = luaL_checkinteger(L, arg);
    if (r < 1 || r > t->rows)
        luaL_error(L, "%s: row %I out of range 1..%I (rows are 1-based)", fname, r, (lua_Integer)t->rows);
    return (int64_t)r - 1;
}

/* ---- per-row normalisations -------------------------------------------------------------------- */

/* Per row: m = max, s = sum exp(x - m) in double; softmax = exp(x - m) / s,
 * log_softmax = x - m - log(s). */
static int row_softmax(lua_State *L, bool log_form, const char *fname) {
    cref t = check_ref(L, 1, fname);
    float *out = new_tensor(L, t.rows, t.cols, fname);
    for (int64_t r = 0; r < t.rows; r++) {
        const float *x = t.data + r * t.cols;
        float *y = out + r * t.cols;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < t.cols; c++)
            if (x[c] > m || isnan(x[c])) m = x[c];
        for (int64_t c = 0; c < t.cols; c++) s += exp((double)x[c] - m);
        const double ls = log(s);
        for (int64_t c = 0; c < t.cols; c++)
            y[c] = log_form ? (float)((double)x[c] - m - ls) : (float)(exp((double)x[c] - m) / s);
    }
    return 1;
}

static int t_softmax(lua_State *L) { return row_softmax(L, false, "softmax"); }
static int t_log_softmax(lua_State *L) { return row_softmax(L, true, "log_softmax"); }

/* ---- products ---------------------------------------------------------------------------------- */

/* a:matmul(b): [r, k] x [k, c] -> [r, c]; each element a sum over k in double, rounded once. */
static int t_matmul(lua_State *L) {
    cref a = check_ref(L, 1, "matmul"), b = check_ref(L, 2, "matmul");
    if (a.cols != b.rows)
        return luaL_error(L, "matmul: shapes %s and %s do not fit (a's columns %I must equal b's rows %I)",
                          shape_str(L, a.rows, a.cols), shape_str(L, b.rows, b.cols), (lua_Integer)a.cols,
                          (lua_Integer)b.rows);
    double *acc = scratch_doubles(L, b.cols);
    float *out = new_tensor(L, a.rows, b.cols, "matmul");
    for (int64_t i = 0; i < a.rows; i++) {
        memset(acc, 0, (size_t)b.cols * sizeof(double));
        for (int64_t k = 0; k < a.cols; k++) { /* row of b by row of b: sequential reads */
            const double aik = a.data[i * a.cols + k];
            const float *bk = b.data + k * b.cols;
            for (int64_t j = 0; j < b.cols; j++) acc[j] += aik * bk[j];
        }
        for (int64_t j = 0; j < b.cols; j++) out[i * b.cols + j] = (float)acc[j];
    }
    return 1;
}

/* a:matmul_t(b): a times b transposed, [r, k] x [c, k]^T -> [r, c]: the form of a weight stored
 * as [n_out, n_in] (h:matmul_t(W) = h W^T). */
static int t_matmul_t(lua_State *L) {
    cref a = check_ref(L, 1, "matmul_t"), b = check_ref(L, 2, "matmul_t");
    if (a.cols != b.cols)
        return luaL_error(L, "matmul_t: shapes %s and %s do not fit (both must have the same columns: %I vs %I)",
                          shape_str(L, a.rows, a.cols), shape_str(L, b.rows, b.cols), (lua_Integer)a.cols,
                          (lua_Integer)b.cols);
    float *out = new_tensor(L, a.rows, b.rows, "matmul_t");
    for (int64_t i = 0; i < a.rows; i++)
        for (int64_t j = 0; j < b.rows; j++) {
            const float *x = a.data + i * a.cols, *y = b.data + j * b.cols;
            double s = 0;
            for (int64_t k = 0; k < a.cols; k++) s += (double)x[k] * y[k];
            out[i * b.rows + j] = (float)s;
        }
    return 1;
}

static int t_transpose(lua_State *L) {
    cref t = check_ref(L, 1, "transpose");
    float *out = new_tensor(L, t.cols, t.rows, "transpose");
    for (int64_t r = 0; r < t.rows; r++)
        for (int64_t c = 0; c < t.cols; c++) out[c * t.rows + r] = t.data[r * t.cols + c];
    return 1;
}

static void check_same_shape(lua_State *L, const cref *a, const cref *b, const char *fname) {
    if (a->rows != b->rows || a->cols != b->cols)
        luaL_error(L, "%s: shapes %s and %s differ (they must be equal)", fname, shape_str(L, a->rows, a->cols),
                   shape_str(L, b->rows, b->cols));
}

/* Sums over every element in double: a.b, a.a and b.b. */
static void dots(const cref *a, const cref *b, double *ab, double *aa, double *bb) {
    double s = 0, sa = 0, sb = 0;
    for (int64_t i = 0, n = a->rows * a->cols; i < n; i++) {
        s += (double)a->data[i] * b->data[i];
        sa += (double)a->data[i] * a->data[i];
        sb += (double)b->data[i] * b->data[i];
    }
    *ab = s;
    *aa = sa;
    *bb = sb;
}

/* a:dot(b) -> number: the sum of the elementwise product of two tensors of one shape. */
static int t_dot(lua_State *L) {
    cref a = check_ref(L, 1, "dot"), b = check_ref(L, 2, "dot");
    check_same_shape(L, &a, &b, "dot");
    double ab, aa, bb;
    dots(&a, &b, &ab, &aa, &bb);
    lua_pushnumber(L, ab);
    return 1;
}

/* a:cosine(b) -> number: a.b / (|a| |b|) over every element; NaN when either is all zeros. */
static int t_cosine(lua_State *L) {
    cref a = check_ref(L, 1, "cosine"), b = check_ref(L, 2, "cosine");
    check_same_shape(L, &a, &b, "cosine");
    double ab, aa, bb;
    dots(&a, &b, &ab, &aa, &bb);
    lua_pushnumber(L, aa > 0 && bb > 0 ? ab / (sqrt(aa) * sqrt(bb)) : NAN);
    return 1;
}

/* ---- elementwise arithmetic with broadcasting -------------------------------------------------- */

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV } arith_op;
static const char *const arith_names[] = {"add", "sub", "mul", "div"};

static float apply(arith_op op, float x, float y) {
    switch (op) {
    case OP_ADD: return x + y;
    case OP_SUB: return x - y;
    case OP_MUL: return x * y;
    case OP_DIV: return x / y;
    }
    return 0;
}

/* One operand: a tensor (shape, data) or a number (1 x 1, broadcast everywhere). */
typedef struct {
    cref t;
    float k;
    bool scalar;
} operand;

static operand check_operand(lua_State *L, int i, const char *fname) {
    operand o = {0};
    if (lua_type(L, i) == LUA_TNUMBER) {
        o.scalar = true;
        o.k = (float)lua_tonumber(L, i);
        return o;
    }
    if (!is_tensor(L, i))
        luaL_error(L, "bad argument #%d to '%s' (ember.Tensor, ember.TensorView or number expected, got %s)", i, fname,
                   luaL_typename(L, i));
    o.t = check_ref(L, i, fname);
    return o;
}

/* Value of o at (r, c) of the result: a one-row operand repeats over rows, a number everywhere. */
static float at(const operand *o, int64_t r, int64_t c) {
    if (o->scalar) return o->k;
    return o->t.data[(o->t.rows == 1 ? 0 : r) * o->t.cols + c];
}

/* a OP b with a and b of one shape, or one of them [1, cols] (a row broadcast over the other's
 * rows), or a number. At least one is a tensor. */
static int arith(lua_State *L, arith_op op) {
    const char *fname = arith_names[op];
    operand a = check_operand(L, 1, fname), b = check_operand(L, 2, fname);
    if (a.scalar && b.scalar)
        return luaL_error(L, "%s: at least one operand must be an ember.Tensor or ember.TensorView", fname);
    int64_t rows, cols;
    if (a.scalar || b.scalar) {
        const cref *t = a.scalar ? &b.t : &a.t;
        rows = t->rows;
        cols = t->cols;
    } else {
        bool ok = a.t.cols == b.t.cols && (a.t.rows == b.t.rows || a.t.rows == 1 || b.t.rows == 1);
        if (!ok)
            return luaL_error(L,
                              "%s: shapes %s and %s do not broadcast (they must be equal, or have the same columns "
                              "with one of them a single row)",
                              fname, shape_str(L, a.t.rows, a.t.cols), shape_str(L, b.t.rows, b.t.cols));
        rows = a.t.rows > b.t.rows ? a.t.rows : b.t.rows;
        cols = a.t.cols;
    }
    float *out = new_tensor(L, rows, cols, fname);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) out[r * cols + c] = apply(op, at(&a, r, c), at(&b, r, c));
    return 1;
}

static int l_add(lua_State *L) { return arith(L, OP_ADD); }
static int l_sub(lua_State *L) { return arith(L, OP_SUB); }
static int l_mul(lua_State *L) { return arith(L, OP_MUL); }
static int l_div(lua_State *L) { return arith(L, OP_DIV); }

static int t_unm(lua_State *L) {
    cref t = check_ref(L, 1, "unm");
    float *out = new_tensor(L, t.rows, t.cols, "unm");
    for (int64_t i = 0, n = t.rows * t.cols; i < n; i++) out[i] = -t.data[i];
    return 1;
}

/* ---- reductions over rows ---------------------------------------------------------------------- */

static int reduce_rows(lua_State *L, bool mean, const char *fname) {
    cref t = check_ref(L, 1, fname);
    double *acc = scratch_doubles(L, t.cols);
    memset(acc, 0, (size_t)t.cols * sizeof(double));
    for (int64_t r = 0; r < t.rows; r++)
        for (int64_t c = 0; c < t.cols; c++) acc[c] += t.data[r * t.cols + c];
    float *out = new_tensor(L, 1, t.cols, fname);
    for (int64_t c = 0; c < t.cols; c++) out[c] = (float)(mean ? acc[c] / (double)t.rows : acc[c]);
    return 1;
}

static int t_sum(lua_State *L) { return reduce_rows(L, false, "sum"); }
static int t_mean(lua_State *L) { return reduce_rows(L, true, "mean"); }

/* ---- selections -------------------------------------------------------------------------------- */

/* t:slice(r0, r1): rows r0..r1, 1-based and inclusive like string.sub; r1 defaults to the last. */
static int t_slice(lua_State *L) {
    cref t = ember_lua_check_ref(L, 1, "slice");
    lua_Integer r0 = luaL_checkinteger(L, 2), r1 = luaL_optinteger(L, 3, (lua_Integer)t.rows);
    if (r0 < 1 || r1 > t.rows || r0 > r1)
        return luaL_error(L, "slice: rows %I..%I out of range for shape %s (1-based, inclusive, r0 <= r1)", r0, r1,
                          shape_str(L, t.rows, t.cols));
    push_rows(L, 1, &t, (int64_t)r0 - 1, (int64_t)(r1 - r0 + 1), "slice");
    return 1;
}

/* t:head(h [, n_heads [, "columns"|"rows"]]): head h (0-based, like layers) of a per-head tensor.
 * "columns": [rows, n_heads*head_dim] -> [rows, head_dim] (attention_heads); "rows":
 * [n_heads*n, n_keys] -> [n, n_keys] (attention_pattern). Of a view, either is a sub-view that
 * writes through (the columns one strided); of a tensor, a copy. A view of a per-head stage (and
 * its clone) knows both; any other tensor needs n_heads. */
static int t_head(lua_State *L) {
    cref t = ember_lua_check_ref(L, 1, "head");
    lua_Integer h = luaL_checkinteger(L, 2);
    int64_t n_heads = t.n_heads;
    ember_lua_heads by = t.heads_by;
    if (!lua_isnoneornil(L, 3)) {
        lua_Integer given = luaL_checkinteger(L, 3);
        if (given < 1) return luaL_error(L, "head: n_heads must be >= 1, got %I", given);
        if (n_heads > 0 && given != n_heads)
            return luaL_error(L, "head: this %s holds %I heads, not %I", t.view ? "view" : "tensor",
                              (lua_Integer)n_heads, given);
        n_heads = given;
    }
    if (!lua_isnoneornil(L, 4)) {
        static const char *const layouts[] = {"columns", "rows", NULL};
        ember_lua_heads want =
            luaL_checkoption(L, 4, NULL, layouts) == 0 ? EMBER_LUA_HEADS_COLUMNS : EMBER_LUA_HEADS_ROWS;
        if (by != EMBER_LUA_HEADS_NONE && by != want)
            return luaL_error(L, "head: this %s lays its heads out by %s", t.view ? "view" : "tensor",
                              by == EMBER_LUA_HEADS_ROWS ? "rows" : "columns");
        by = want;
    }
    if (n_heads < 1)
        return luaL_error(L,
                          "head: this %s carries no head count; pass it: t:head(h, n_heads [, \"columns\"|\"rows\"])",
                          t.view ? "view" : "tensor");
    if (by == EMBER_LUA_HEADS_NONE) by = EMBER_LUA_HEADS_COLUMNS;
    if (h < 0 || h >= n_heads)
        return luaL_error(L, "head: head %I out of range 0..%I (heads are 0-based, like layers)", h,
                          (lua_Integer)n_heads - 1);
    if (by == EMBER_LUA_HEADS_ROWS) {
        if (t.rows % n_heads)
            return luaL_error(L, "head: %I rows do not split into %I heads", (lua_Integer)t.rows, (lua_Integer)n_heads);
        const int64_t per = t.rows / n_heads;
        push_rows(L, 1, &t, h * per, per, "head");
        return 1;
    }
    if (t.cols % n_heads)
        return luaL_error(L, "head: %I columns do not split into %I heads", (lua_Integer)t.cols, (lua_Integer)n_heads);
    const int64_t hd = t.cols / n_heads;
    if (t.view) { /* the head's columns of every row: a strided window on the view's memory */
        ember_lua_push_subview(L, 1, &t, t.data + h * hd, t.rows, hd);
        return 1;
    }
    float *out = new_tensor(L, t.rows, hd, "head");
    for (int64_t r = 0; r < t.rows; r++)
        memcpy(out + r * hd, t.data + r * t.stride + h * hd, (size_t)hd * sizeof(float));
    return 1;
}

/* ---- token space (0-based ids) ----------------------------------------------------------------- */

/* t:token_argmax([row]) -> the 0-based token id of the largest value (lowest id on ties). */
static int t_token_argmax(lua_State *L) {
    cref t = check_ref(L, 1, "token_argmax");
    int64_t r = opt_row(L, 2, &t, "token_argmax");
    lua_pushinteger(L, (lua_Integer)ember_argmax(t.data + r * t.cols, t.cols));
    return 1;
}

/* Order of topk: larger value first, then lower id; NaN after every number. */
static bool better(float va, int64_t ia, float vb, int64_t ib) {
    if (isnan(va) || isnan(vb)) return !isnan(va) || (isnan(vb) && ia < ib);
    return va > vb || (va == vb && ia < ib);
}

/* t:topk(k [, row]) -> ids (0-based), values: the k largest of a row, best first. A min-heap of
 * the k best so far (root = the worst kept), then sorted. */
static int t_topk(lua_State *L) {
    cref t = check_ref(L, 1, "topk");
    lua_Integer k = luaL_checkinteger(L, 2);
    if (k < 1 || k > t.cols)
        return luaL_error(L, "topk: k = %I out of range 1..%I (the row's length)", k, (lua_Integer)t.cols);
    int64_t r = opt_row(L, 3, &t, "topk");
    if (k > INT32_MAX) return luaL_error(L, "topk: k = %I is too many for a Lua table", k);
    const float *x = t.data + r * t.cols;
    int64_t *heap = lua_newuserdatauv(L, (size_t)k * sizeof(int64_t), 0);
    int64_t n = 0;
    for (int64_t i = 0; i < t.cols; i++) {
        if (n == k && !better(x[i], i, x[heap[0]], heap[0])) continue;
        int64_t pos;
        if (n < k) { /* sift up */
            pos = n++;
            while (pos > 0 && better(x[heap[(pos - 1) / 2]], heap[(pos - 1) / 2], x[i], i)) {
                heap[pos] = heap[(pos - 1) / 2];
                pos = (pos - 1) / 2;
            }
        } else { /* replace the worst, sift down */
            pos = 0;
            for (;;) {
                int64_t c = 2 * pos + 1;
                if (c >= n) break;
                if (c + 1 < n && better(x[heap[c]], heap[c], x[heap[c + 1]], heap[c + 1])) c++;
                if (!better(x[i], i, x[heap[c]], heap[c])) break;
                heap[pos] = heap[c];
                pos = c;
            }
        }
        heap[pos] = i;
    }
    /* Pop the worst repeatedly into the back of the answer. */
    lua_createtable(L, (int)k, 0); /* [.., heap, ids] */
    lua_createtable(L, (int)k, 0); /* [.., heap, ids, values] */
    for (int64_t slot = k; slot >= 1; slot--) {
        const int64_t worst = heap[0], last = heap[--n];
        int64_t pos = 0;
        for (;;) {
            int64_t c = 2 * pos + 1;
            if (c >= n) break;
            if (c + 1 < n && better(x[heap[c]], heap[c], x[heap[c + 1]], heap[c + 1])) c++;
            if (!better(x[last], last, x[heap[c]], heap[c])) break;
            heap[pos] = heap[c];
            pos = c;
        }
        if (n > 0) heap[pos] = last;
        lua_pushinteger(L, (lua_Integer)worst);
        lua_rawseti(L, -3, (lua_Integer)slot);
        lua_pushnumber(L, x[worst]);
        lua_rawseti(L, -2, (lua_Integer)slot);
    }
    return 2;
}

/* ---- registration ------------------------------------------------------------------------------ */

static const luaL_Reg methods[] = {
    {"softmax", t_softmax},     {"log_softmax", t_log_softmax},
    {"matmul", t_matmul},       {"matmul_t", t_matmul_t},
    {"transpose", t_transpose}, {"dot", t_dot},
    {"cosine", t_cosine},       {"sum", t_sum},
    {"mean", t_mean},           {"slice", t_slice},
    {"head", t_head},           {"token_argmax", t_token_argmax},
    {"topk", t_topk},           {NULL, NULL},
};

static const luaL_Reg operators[] = {
    {"__add", l_add}, {"__sub", l_sub}, {"__mul", l_mul}, {"__div", l_div}, {"__unm", t_unm}, {NULL, NULL},
};

static const luaL_Reg module_funcs[] = {
    {"add", l_add},           {"sub", l_sub}, {"mul", l_mul},       {"div", l_div}, {"matmul", t_matmul},
    {"matmul_t", t_matmul_t}, {"dot", t_dot}, {"cosine", t_cosine}, {NULL, NULL},
};

void ember_lua_open_tensor_ops(lua_State *L, int module) {
    const char *classes[] = {EMBER_LUA_TENSOR, EMBER_LUA_VIEW};
    for (size_t i = 0; i < 2; i++) {
        luaL_getmetatable(L, classes[i]); /* [mt] */
        luaL_setfuncs(L, operators, 0);
        lua_getfield(L, -1, "__methods"); /* [mt, methods] */
        luaL_setfuncs(L, methods, 0);
        lua_pop(L, 2);
    }
    lua_pushvalue(L, module);
    luaL_setfuncs(L, module_funcs, 0);
    lua_pop(L, 1);
}
