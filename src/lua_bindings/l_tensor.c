/* l_tensor.c — ember.Tensor (owned f32 [rows, cols]) and ember.TensorView (borrowed engine memory).
 * A view must never touch its memory after the hook call that received it: every access checks
 * that the view is alive (its root armed, and for a row the root's call the row was made in), and
 * an expired view raises instead of reading. */
#include "l_tensor.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "bytes(), sha256() and fingerprint() assume the host stores f32 little-endian"
#endif

typedef ember_lua_ref tref;

ember_lua_ref ember_lua_check_ref(lua_State *L, int i, const char *fname) {
    tref t = {0};
    ember_lua_tensor *ot = luaL_testudata(L, i, EMBER_LUA_TENSOR);
    if (ot) {
        t.data = ot->data;
        t.rows = ot->rows;
        t.cols = t.stride = ot->cols;
        t.n_heads = ot->n_heads;
        t.heads_by = ot->heads_by;
        return t;
    }
    ember_lua_view *v = luaL_testudata(L, i, EMBER_LUA_VIEW);
    if (!v) {
        luaL_error(L, "bad argument #%d to '%s' (ember.Tensor or ember.TensorView expected, got %s)", i, fname,
                   luaL_typename(L, i));
        return t; /* not reached */
    }
    if (!ember_lua_view_alive(v)) luaL_error(L, "%s: " EMBER_LUA_EXPIRED_MSG, fname);
    t.data = v->data;
    t.rows = v->rows;
    t.cols = v->cols;
    t.stride = v->stride;
    t.view = v;
    t.n_heads = v->n_heads;
    t.heads_by = v->heads_by;
    return t;
}

static bool contiguous(const tref *t) { return t->stride == t->cols || t->rows == 1; }

/* Copies the rows of t into dst, [rows, cols] contiguous. */
static void gather(const tref *t, float *dst) {
    for (int64_t r = 0; r < t->rows; r++)
        memcpy(dst + r * t->cols, t->data + r * t->stride, (size_t)t->cols * sizeof(float));
}

ember_lua_ref ember_lua_check_dense(lua_State *L, int i, const char *fname) {
    tref t = ember_lua_check_ref(L, i, fname);
    if (contiguous(&t)) {
        t.stride = t.cols;
        return t;
    }
    float *copy = lua_newuserdatauv(L, (size_t)(t.rows * t.cols) * sizeof(float), 0); /* [.., scratch] */
    gather(&t, copy);
    t.data = copy;
    t.stride = t.cols;
    return t;
}

void ember_lua_push_subview(lua_State *L, int idx, const ember_lua_ref *t, float *data, int64_t rows, int64_t cols) {
    ember_lua_view *root = t->view->root;
    ember_lua_view *v = ember_lua_push_view(L, data, rows, cols, root->modified); /* [.., sub] */
    v->stride = t->stride;
    v->root = root;
    v->epoch = root->epoch;       /* expires with the root's current call */
    lua_getiuservalue(L, idx, 1); /* the parent's root, or nil when the parent is the root */
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushvalue(L, idx);
    }
    lua_setiuservalue(L, -2, 1); /* keeps the root (and so v->root) alive */
}

/* Records a write through a view; the run reports it as out.modified. */
static void mark_written(tref *t) {
    if (t->view && t->view->root->modified) *t->view->root->modified = true;
}

static int64_t count(const tref *t) { return t->rows * t->cols; }

/* Element (r, c), 0-based. */
static float *at(const tref *t, int64_t r, int64_t c) { return t->data + r * t->stride + c; }

ember_lua_tensor *ember_lua_push_tensor(lua_State *L, int64_t rows, int64_t cols) {
    size_t bytes = sizeof(ember_lua_tensor) + (size_t)(rows * cols) * sizeof(float);
    ember_lua_tensor *t = lua_newuserdatauv(L, bytes, 0); /* [tensor] */
    t->rows = rows;
    t->cols = cols;
    t->n_heads = 0;
    t->heads_by = EMBER_LUA_HEADS_NONE;
    luaL_setmetatable(L, EMBER_LUA_TENSOR);
    return t;
}

ember_lua_view *ember_lua_push_view(lua_State *L, float *data, int64_t rows, int64_t cols, bool *modified) {
    ember_lua_view *v = lua_newuserdatauv(L, sizeof *v, 1); /* [view] */
    v->data = data;
    v->rows = rows;
    v->cols = cols;
    v->stride = cols;
    v->alive = true;
    v->epoch = 0;
    v->modified = modified;
    v->root = v;
    v->n_heads = 0;
    v->heads_by = EMBER_LUA_HEADS_NONE;
    v->sequences = NULL;
    v->n_sequences = 0;
    v->one_row_each = false;
    luaL_setmetatable(L, EMBER_LUA_VIEW);
    return v;
}

void ember_lua_arm_view(ember_lua_view *v, float *data, int64_t rows, int64_t cols) {
    v->data = data;
    v->rows = rows;
    v->cols = cols;
    v->stride = cols;
    v->epoch++; /* sub-views taken in the previous call stay expired */
    v->alive = true;
}

void ember_lua_expire_view(ember_lua_view *v) {
    v->alive = false;
    v->data = NULL; /* belt and braces: nothing can reach the engine buffer any more */
}

const float *ember_lua_check_values(lua_State *L, int i, int64_t *rows, int64_t *cols, const char *fname) {
    tref t = ember_lua_check_dense(L, i, fname);
    *rows = t.rows;
    *cols = t.cols;
    return t.data;
}

/* ---- argument helpers -------------------------------------------------------------------------- */

static int64_t check_index(lua_State *L, int arg, int64_t n, const char *what) {
    lua_Integer i = luaL_checkinteger(L, arg);
    if (i < 1 || i > n)
        return luaL_argerror(L, arg, lua_pushfstring(L, "%s %I out of range 1..%I", what, i, (lua_Integer)n));
    return (int64_t)i;
}

static void check_shape(lua_State *L, lua_Integer rows, lua_Integer cols, const char *fname) {
    if (!ember_lua_shape_ok(rows, cols))
        luaL_error(L, "bad argument to '%s' (shape [%I, %I] must have rows, cols >= 1 and at most 2^32 values)", fname,
                   rows, cols);
}

static const char *shape_str(lua_State *L, const tref *t) {
    return lua_pushfstring(L, "[%I, %I]", (lua_Integer)t->rows, (lua_Integer)t->cols);
}

/* ---- reads --------------------------------------------------------------------------------------- */

static int t_shape(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "shape");
    lua_createtable(L, 2, 0);
    lua_pushinteger(L, t.rows);
    lua_rawseti(L, -2, 1);
    lua_pushinteger(L, t.cols);
    lua_rawseti(L, -2, 2);
    return 1;
}

static int t_dtype(lua_State *L) {
    ember_lua_check_ref(L, 1, "dtype");
    lua_pushliteral(L, "f32");
    return 1;
}

static int t_len(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "__len");
    lua_pushinteger(L, count(&t));
    return 1;
}

static int t_get(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "get");
    int64_t r = check_index(L, 2, t.rows, "row"), c = check_index(L, 3, t.cols, "column");
    lua_pushnumber(L, *at(&t, r - 1, c - 1));
    return 1;
}

static int t_values(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "values");
    int64_t n = count(&t);
    if (n > INT32_MAX) return luaL_error(L, "values: tensor has %I values, too many for a Lua table", (lua_Integer)n);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushnumber(L, t.data[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

static int t_bytes(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "bytes");
    lua_pushlstring(L, (const char *)t.data, (size_t)count(&t) * sizeof(float));
    return 1;
}

/* t:write_bytes(file) -> true, or nil and the reason: t:bytes() written to an open Lua file without
 * making the string (a dump of long prompts streams its views to disk with no copy in Lua). */
static int t_write_bytes(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "write_bytes");
    luaL_Stream *f = luaL_checkudata(L, 2, LUA_FILEHANDLE);
    if (f->closef == NULL) return luaL_argerror(L, 2, "attempt to use a closed file");
    const size_t n = (size_t)count(&t);
    errno = 0;
    if (fwrite(t.data, sizeof(float), n, f->f) != n) {
        luaL_pushfail(L);
        lua_pushstring(L, errno ? strerror(errno) : "short write");
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static double l2_norm(const tref *t) {
    double s = 0;
    for (int64_t i = 0, n = count(t); i < n; i++) s += (double)t->data[i] * t->data[i];
    return sqrt(s);
}

static int t_l2_norm(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "l2_norm");
    lua_pushnumber(L, l2_norm(&t));
    return 1;
}

/* NaN propagates: an activation with a NaN must not look healthy. */
static int t_abs_max(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "abs_max");
    double m = 0;
    for (int64_t i = 0, n = count(&t); i < n; i++) {
        double a = fabs((double)t.data[i]);
        if (isnan(a)) {
            m = a;
            break;
        }
        if (a > m) m = a;
    }
    lua_pushnumber(L, m);
    return 1;
}

/* The value fingerprint (ember_fingerprint_f32, the kernels' one owner: FNV-1a 64 over the raw
 * little-endian f32 bytes, row-major; the shape is not included). Returned as the u64's bit
 * pattern in a Lua integer (negative when the top bit is set). */
static int t_fingerprint(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "fingerprint");
    lua_pushinteger(L, (lua_Integer)ember_fingerprint_f32(t.data, count(&t)));
    return 1;
}

static int t_sha256(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "sha256");
    char hex[65];
    ember_sha256_hex(t.data, (size_t)count(&t) * sizeof(float), hex);
    lua_pushstring(L, hex);
    return 1;
}

/* argmax([row]) -> 1-based column; the row may be omitted only for a one-row tensor. */
static int t_argmax(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "argmax");
    int64_t r = 1;
    if (!lua_isnoneornil(L, 2)) r = check_index(L, 2, t.rows, "row");
    else if (t.rows != 1)
        return luaL_error(L, "argmax: the tensor has %I rows; pass the row (argmax(row))", (lua_Integer)t.rows);
    lua_pushinteger(L, ember_argmax(at(&t, r - 1, 0), t.cols) + 1);
    return 1;
}

/* ---- comparison (for lib/ember/analysis/compare.lua; the measures are in docs/artifacts.md) ------ */

static void set_num(lua_State *L, const char *key, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, key);
}

/* a:compare(b) -> { bitwise_equal, elements, differing_elements, max_abs_diff, mean_abs_diff,
 * rms_abs_diff, l2, rel_l2, cosine } for two tensors of the same shape. The sums run in double,
 * element by element in row-major order (this file is built with -ffp-contract=off: no fused
 * multiply-adds), so the figures are the same on every machine. max/mean/RMS are of |a - b|;
 * l2 = ||a - b||; rel_l2 = ||a - b|| / ||a||; a NaN difference makes max_abs_diff NaN. Undefined
 * values (cosine against a zero vector, rel_l2 with ||a|| = 0 and a difference) are absent. */
static int t_compare(lua_State *L) {
    tref a = ember_lua_check_dense(L, 1, "compare"), b = ember_lua_check_dense(L, 2, "compare");
    if (a.rows != b.rows || a.cols != b.cols)
        return luaL_error(L, "compare: shape mismatch: [%I, %I] vs [%I, %I]", (lua_Integer)a.rows, (lua_Integer)a.cols,
                          (lua_Integer)b.rows, (lua_Integer)b.cols);
    int64_t n = a.rows * a.cols;
    lua_createtable(L, 0, 9);
    lua_pushinteger(L, n);
    lua_setfield(L, -2, "elements");
    if (memcmp(a.data, b.data, (size_t)n * sizeof(float)) == 0) {
        /* identical bits: nothing to measure (a restored run is mostly this case) */
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "bitwise_equal");
        lua_pushinteger(L, 0);
        lua_setfield(L, -2, "differing_elements");
        const char *zeros[] = {"max_abs_diff", "mean_abs_diff", "rms_abs_diff", "l2", "rel_l2"};
        for (size_t i = 0; i < sizeof zeros / sizeof zeros[0]; i++) set_num(L, zeros[i], 0.0);
        set_num(L, "cosine", 1.0);
        return 1;
    }
    double max_d = 0, sum_d = 0, sum_d2 = 0, dot = 0, na2 = 0, nb2 = 0;
    int64_t differing = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a.data[i], y = b.data[i];
        double d = fabs(x - y);
        if (d > max_d || isnan(d)) max_d = d;
        sum_d += d;
        sum_d2 += d * d;
        dot += x * y;
        na2 += x * x;
        nb2 += y * y;
        uint32_t ua, ub; /* bit equality: -0 and 0 differ, a NaN equals only the same NaN */
        memcpy(&ua, &a.data[i], sizeof ua);
        memcpy(&ub, &b.data[i], sizeof ub);
        differing += ua != ub;
    }
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "bitwise_equal");
    lua_pushinteger(L, differing);
    lua_setfield(L, -2, "differing_elements");
    double l2 = sqrt(sum_d2), na = sqrt(na2), nb = sqrt(nb2);
    set_num(L, "max_abs_diff", max_d);
    set_num(L, "mean_abs_diff", sum_d / (double)n);
    set_num(L, "rms_abs_diff", sqrt(sum_d2 / (double)n));
    set_num(L, "l2", l2);
    if (na > 0 && nb > 0) set_num(L, "cosine", dot / (na * nb));
    else if (na == 0 && nb == 0) set_num(L, "cosine", 1.0); /* two zero vectors point the same (no) way */
    if (na > 0) set_num(L, "rel_l2", l2 / na);
    else if (l2 == 0) set_num(L, "rel_l2", 0.0);
    return 1;
}

/* t:top1() -> { id, ... }: per row the 0-based column of the largest value (a token id when the
 * rows are logits); the lowest column on ties, and NaN never wins, as greedy sampling. A row
 * that is all NaN has no entry. */
static int t_top1(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "top1");
    if (t.rows > INT32_MAX)
        return luaL_error(L, "top1: tensor has %I rows, too many for a Lua table", (lua_Integer)t.rows);
    lua_createtable(L, (int)t.rows, 0);
    for (int64_t r = 0; r < t.rows; r++) {
        const float *row = at(&t, r, 0);
        int64_t best = -1;
        for (int64_t c = 0; c < t.cols; c++)
            if (!isnan(row[c]) && (best < 0 || row[c] > row[best])) best = c;
        if (best < 0) continue;
        lua_pushinteger(L, best);
        lua_rawseti(L, -2, (lua_Integer)r + 1);
    }
    return 1;
}

static int t_clone(lua_State *L) {
    tref t = ember_lua_check_dense(L, 1, "clone");
    ember_lua_tensor *c = ember_lua_push_tensor(L, t.rows, t.cols);
    memcpy(c->data, t.data, (size_t)count(&t) * sizeof(float));
    c->n_heads = t.n_heads; /* a clone of a per-head view keeps v:head(h) */
    c->heads_by = t.heads_by;
    return 1;
}

/* A row of a view is a sub-view (same memory, same expiry); a row of a tensor is a copy. */
static int t_row(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "row");
    int64_t r = check_index(L, 2, t.rows, "row");
    float *src = at(&t, r - 1, 0);
    if (t.view) {
        ember_lua_push_subview(L, 1, &t, src, 1, t.cols); /* [self, r, sub] */
        return 1;
    }
    ember_lua_tensor *c = ember_lua_push_tensor(L, 1, t.cols);
    memcpy(c->data, src, (size_t)t.cols * sizeof(float));
    return 1;
}

/* ---- writes ------------------------------------------------------------------------------------ */

/* The first and one-past-last float a tensor's values span. */
static uintptr_t span_lo(const tref *t) { return (uintptr_t)t->data; }
static uintptr_t span_hi(const tref *t) { return (uintptr_t)at(t, t->rows - 1, t->cols); }

/* The source operand of a write into t, contiguous and safe to read while t is written: a source
 * sharing memory with t (v:add(v:row(1)), a head copied onto a neighbour) is copied first, unless
 * it is t itself element for element (v:add(v) doubles v). */
static tref write_source(lua_State *L, int i, const tref *t, const char *fname) {
    tref s = ember_lua_check_dense(L, i, fname);
    bool same = s.data == t->data && s.stride == t->stride && s.rows == t->rows && s.cols == t->cols;
    if (same || span_hi(&s) <= span_lo(t) || span_hi(t) <= span_lo(&s)) return s;
    float *copy = lua_newuserdatauv(L, (size_t)count(&s) * sizeof(float), 0); /* [.., scratch] */
    memcpy(copy, s.data, (size_t)count(&s) * sizeof(float));
    s.data = copy;
    return s;
}

static int t_set(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "set");
    int64_t r = check_index(L, 2, t.rows, "row"), c = check_index(L, 3, t.cols, "column");
    float v = (float)luaL_checknumber(L, 4);
    *at(&t, r - 1, c - 1) = v;
    mark_written(&t);
    return 0;
}

static int t_zero(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "zero");
    for (int64_t r = 0; r < t.rows; r++) memset(at(&t, r, 0), 0, (size_t)t.cols * sizeof(float));
    mark_written(&t);
    lua_settop(L, 1);
    return 1;
}

static int t_scale(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "scale");
    float k = (float)luaL_checknumber(L, 2);
    for (int64_t r = 0; r < t.rows; r++)
        for (int64_t c = 0; c < t.cols; c++) *at(&t, r, c) *= k;
    mark_written(&t);
    lua_settop(L, 1);
    return 1;
}

/* add(x [, k]): x is a number (added to every value), a tensor of the same shape, or a one-row
 * tensor added to every row (a steering vector over all positions). k scales x (default 1). */
static int t_add(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "add");
    float k = (float)luaL_optnumber(L, 3, 1.0);
    if (lua_type(L, 2) == LUA_TNUMBER) {
        float x = (float)lua_tonumber(L, 2) * k;
        for (int64_t r = 0; r < t.rows; r++)
            for (int64_t c = 0; c < t.cols; c++) *at(&t, r, c) += x;
    } else {
        tref s = write_source(L, 2, &t, "add");
        bool same = s.rows == t.rows && s.cols == t.cols, bcast = s.rows == 1 && s.cols == t.cols;
        if (!same && !bcast)
            return luaL_error(L, "add: shape mismatch: target is %s, source is %s (must be equal, or [1, %I])",
                              shape_str(L, &t), shape_str(L, &s), (lua_Integer)t.cols);
        for (int64_t r = 0; r < t.rows; r++) {
            const float *src = s.data + (same ? r * s.stride : 0);
            float *dst = at(&t, r, 0);
            for (int64_t c = 0; c < t.cols; c++) dst[c] += k * src[c];
        }
    }
    mark_written(&t);
    lua_settop(L, 1);
    return 1;
}

/* copy_from(src): exact shape match; never resizes. */
static int t_copy_from(lua_State *L) {
    tref t = ember_lua_check_ref(L, 1, "copy_from"), s = write_source(L, 2, &t, "copy_from");
    if (s.rows != t.rows || s.cols != t.cols)
        return luaL_error(L, "copy_from: shape mismatch: target is %s, source is %s", shape_str(L, &t),
                          shape_str(L, &s));
    for (int64_t r = 0; r < t.rows; r++) memcpy(at(&t, r, 0), s.data + r * s.stride, (size_t)t.cols * sizeof(float));
    mark_written(&t);
    lua_settop(L, 1);
    return 1;
}

/* v:expired() -> bool: lets code check a view it kept without provoking the error. */
static int v_expired(lua_State *L) {
    ember_lua_view *v = luaL_checkudata(L, 1, EMBER_LUA_VIEW);
    lua_pushboolean(L, !ember_lua_view_alive(v));
    return 1;
}

/* "ember.Tensor[1, 8192] f32 {0.1, -2, 3.5, ..., 0.25} l2=12.5" */
static int t_tostring(lua_State *L) {
    ember_lua_view *v = luaL_testudata(L, 1, EMBER_LUA_VIEW);
    if (v && !ember_lua_view_alive(v)) {
        lua_pushliteral(L, "ember.TensorView (expired)");
        return 1;
    }
    tref t = ember_lua_check_dense(L, 1, "tostring");
    int64_t n = count(&t);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s[%lld, %lld] f32 {", v ? EMBER_LUA_VIEW : EMBER_LUA_TENSOR, (long long)t.rows,
             (long long)t.cols);
    luaL_addstring(&b, tmp);
    int64_t head = n <= 6 ? n : 4;
    for (int64_t i = 0; i < head; i++) {
        snprintf(tmp, sizeof tmp, "%s%.6g", i ? ", " : "", (double)t.data[i]);
        luaL_addstring(&b, tmp);
    }
    if (n > head) {
        snprintf(tmp, sizeof tmp, ", ..., %.6g", (double)t.data[n - 1]);
        luaL_addstring(&b, tmp);
    }
    snprintf(tmp, sizeof tmp, "} l2=%.6g", l2_norm(&t));
    luaL_addstring(&b, tmp);
    luaL_pushresult(&b);
    return 1;
}

/* ---- constructors ------------------------------------------------------------------------------ */

/* ember.tensor(rows, cols [, values]): values flat (row-major) or nested ({ {row1...}, ... });
 * absent means zeros. Everything is checked before the tensor is made. */
static int l_tensor(lua_State *L) {
    lua_Integer rows = luaL_checkinteger(L, 1), cols = luaL_checkinteger(L, 2);
    check_shape(L, rows, cols, "tensor");
    bool has = !lua_isnoneornil(L, 3);
    if (has) luaL_checktype(L, 3, LUA_TTABLE);
    bool nested = has && lua_rawgeti(L, 3, 1) == LUA_TTABLE;
    if (has) lua_pop(L, 1);
    if (has) {
        lua_Integer want = nested ? rows : rows * cols, got = (lua_Integer)lua_rawlen(L, 3);
        if (got != want)
            return luaL_error(L, "bad argument #3 to 'tensor' (expected %I %s, got %I)", want,
                              nested ? "rows" : "values", got);
    }
    ember_lua_tensor *t = ember_lua_push_tensor(L, rows, cols); /* [rows, cols, values?, t] */
    if (!has) {
        memset(t->data, 0, (size_t)(rows * cols) * sizeof(float));
        return 1;
    }
    for (lua_Integer r = 0; r < (nested ? rows : 1); r++) {
        int src = 3;
        if (nested) {
            lua_rawgeti(L, 3, r + 1);
            src = lua_gettop(L);
            if (!lua_istable(L, src) || (lua_Integer)lua_rawlen(L, src) != cols)
                return luaL_error(L, "bad argument #3 to 'tensor' (row %I must be a table of %I numbers)", r + 1, cols);
        }
        lua_Integer n = nested ? cols : rows * cols;
        for (lua_Integer i = 0; i < n; i++) {
            lua_rawgeti(L, src, i + 1);
            int isnum;
            lua_Number x = lua_tonumberx(L, -1, &isnum);
            if (!isnum || lua_type(L, -1) != LUA_TNUMBER)
                return luaL_error(L, "bad argument #3 to 'tensor' (value %I%s is a %s, not a number)",
                                  nested ? r * cols + i + 1 : i + 1, nested ? " (flat index)" : "",
                                  luaL_typename(L, -1));
            t->data[r * cols + i] = (float)x;
            lua_pop(L, 1);
        }
        if (nested) lua_pop(L, 1);
    }
    return 1;
}

/* ember.tensor_from_bytes(bytes, rows, cols): little-endian f32, exactly rows*cols*4 bytes. */
static int l_tensor_from_bytes(lua_State *L) {
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    lua_Integer rows = luaL_checkinteger(L, 2), cols = luaL_checkinteger(L, 3);
    check_shape(L, rows, cols, "tensor_from_bytes");
    if ((lua_Integer)len != rows * cols * (lua_Integer)sizeof(float))
        return luaL_error(L, "bad argument #1 to 'tensor_from_bytes' (%I bytes given, [%I, %I] f32 needs %I)",
                          (lua_Integer)len, rows, cols, rows * cols * (lua_Integer)sizeof(float));
    ember_lua_tensor *t = ember_lua_push_tensor(L, rows, cols);
    memcpy(t->data, s, len);
    return 1;
}

static const luaL_Reg shared_methods[] = {
    {"shape", t_shape},
    {"dtype", t_dtype},
    {"get", t_get},
    {"set", t_set},
    {"row", t_row},
    {"values", t_values},
    {"bytes", t_bytes},
    {"write_bytes", t_write_bytes},
    {"l2_norm", t_l2_norm},
    {"abs_max", t_abs_max},
    {"fingerprint", t_fingerprint},
    {"sha256", t_sha256},
    {"argmax", t_argmax},
    {"clone", t_clone},
    {"zero", t_zero},
    {"scale", t_scale},
    {"add", t_add},
    {"copy_from", t_copy_from},
    {"compare", t_compare},
    {"top1", t_top1},
    {NULL, NULL},
};

/* v:sequence(i) -> the rows of sequence i (its number in the batch, 1-based) as a writable sub-view
 * of a hook's view: its tokens' rows, or its one row at the logits stages. */
static int v_sequence(lua_State *L) {
    ember_lua_view *v = luaL_checkudata(L, 1, EMBER_LUA_VIEW);
    const lua_Integer i = luaL_checkinteger(L, 2);
    if (!ember_lua_view_alive(v)) return luaL_error(L, "sequence: " EMBER_LUA_EXPIRED_MSG);
    if (v->root != v || !v->sequences)
        return luaL_error(L, "sequence: only a hook's own view holds sequences (not a row, slice or head of it)");
    for (int64_t k = 0; k < v->n_sequences; k++) {
        const ember_sequence *q = &v->sequences[k];
        if (q->index + 1 != i) continue;
        const int64_t first = v->one_row_each ? k : q->first_row, rows = v->one_row_each ? 1 : q->length;
        if (first + rows > v->rows)
            return luaL_error(L, "sequence: this stage's rows are not split by sequence (%I rows)",
                              (lua_Integer)v->rows);
        tref t = ember_lua_check_ref(L, 1, "sequence");
        ember_lua_push_subview(L, 1, &t, at(&t, first, 0), rows, t.cols);
        return 1;
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int64_t k = 0; k < v->n_sequences; k++) {
        lua_pushfstring(L, "%s%I", k ? ", " : "", (lua_Integer)v->sequences[k].index + 1);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    return luaL_error(L, "sequence: sequence %I is not in this evaluation (its sequences: %s)", i, lua_tostring(L, -1));
}

static const luaL_Reg view_only[] = {{"expired", v_expired}, {"sequence", v_sequence}, {NULL, NULL}};

static const luaL_Reg meta[] = {{"__len", t_len}, {"__tostring", t_tostring}, {NULL, NULL}};

void ember_lua_open_tensor(lua_State *L, int module) {
    ember_lua_new_class(L, EMBER_LUA_TENSOR, shared_methods, meta, NULL); /* [mt] */
    lua_pop(L, 1);
    ember_lua_new_class(L, EMBER_LUA_VIEW, shared_methods, meta, NULL); /* [mt] */
    lua_getfield(L, -1, "__methods");
    luaL_setfuncs(L, view_only, 0);
    lua_pop(L, 2);
    lua_pushcfunction(L, l_tensor);
    lua_setfield(L, module, "tensor");
    lua_pushcfunction(L, l_tensor_from_bytes);
    lua_setfield(L, module, "tensor_from_bytes");
}
