/* l_tensor.h — what other binding files use of ember.Tensor (owned f32) and ember.TensorView
 * (borrowed engine memory that expires): the layouts, the liveness rule, constructors, sub-views
 * and the arm/expire pair. */
#ifndef EMBER_L_TENSOR_H
#define EMBER_L_TENSOR_H

#include "lbind.h"

#define EMBER_LUA_TENSOR "ember.Tensor"
#define EMBER_LUA_VIEW "ember.TensorView"

/* How a view's rows or columns divide into attention heads, for v:head(h) (l_tensor_ops.c). The
 * hook adapter sets it on the views of stages that hold heads, and clone() keeps it; 0/NONE
 * everywhere else. */
typedef enum {
    EMBER_LUA_HEADS_NONE = 0,
    EMBER_LUA_HEADS_COLUMNS, /* [rows, n_heads * head_dim]: head h is columns h*head_dim .. */
    EMBER_LUA_HEADS_ROWS,    /* [n_heads * rows, n_keys]: head h is rows h*rows .. */
} ember_lua_heads;

/* Owned tensor: the values live inside the userdata, so Lua's GC owns everything. */
typedef struct {
    int64_t rows, cols;
    int64_t n_heads; /* from the view it was cloned from (0: none) */
    ember_lua_heads heads_by;
    float data[]; /* (rows, cols) row-major */
} ember_lua_tensor;

/* Borrowed view over engine memory, valid only while the hook call that received it runs.
 * A hook's view (a root) is reused from call to call: expired when its hook returns, re-armed
 * over the next call's buffer. A sub-view (a row, a slice of rows, one head's columns) remembers
 * its root and the root's epoch at creation, so it expires with that call and never comes back
 * to life. Element (r, c) is data[r * stride + c]: a hook's view is contiguous (stride = cols);
 * one head's columns of attention_heads are a strided window on the same memory. */
typedef struct ember_lua_view {
    float *data; /* (rows, stride) row-major, the first cols of each row; not owned; NULL while expired */
    int64_t rows, cols;
    int64_t stride;              /* floats from one row to the next (>= cols) */
    bool alive;                  /* meaningful on the root only */
    uint64_t epoch;              /* root: bumped by every arm; sub-view: the root's at creation */
    bool *modified;              /* the run's mutation flag; touched only while alive */
    struct ember_lua_view *root; /* itself for a hook's view */
    int64_t n_heads;             /* heads in this view (0: not a per-head stage; sub-views: 0) */
    ember_lua_heads heads_by;
    /* root: the sequences whose rows the call's view holds (the engine's, valid while alive), and
     * whether each has one row (the logits stages) instead of its tokens' rows; for v:sequence(i) */
    const ember_sequence *sequences;
    int64_t n_sequences;
    bool one_row_each;
} ember_lua_view;

/* The liveness rule of borrowed views, and its one message: a root is usable between its arm
 * and its expiry; a sub-view only within the call of the root that made it. */
#define EMBER_LUA_EXPIRED_MSG "attempt to use an expired view (it was valid only inside the hook call that received it)"
static inline bool ember_lua_view_alive(const ember_lua_view *v) {
    return v->root->alive && v->epoch == v->root->epoch;
}

/* What a method sees of either type: element (r, c) at data[r * stride + c]. */
typedef struct {
    float *data; /* (rows, stride) */
    int64_t rows, cols, stride;
    ember_lua_view *view; /* NULL for an owned tensor */
    int64_t n_heads;      /* head layout, when the view or the tensor carries one */
    ember_lua_heads heads_by;
} ember_lua_ref;

/* The Tensor or live TensorView at index i. Raises "bad argument #i to 'fname' (...)" for
 * anything else and "fname: attempt to use an expired view (...)" for an expired view. */
ember_lua_ref ember_lua_check_ref(lua_State *L, int i, const char *fname);
/* As ember_lua_check_ref, but always contiguous (stride = cols): a strided view's values are
 * gathered into a scratch userdata pushed on the stack (valid while it stays there). For reads. */
ember_lua_ref ember_lua_check_dense(lua_State *L, int i, const char *fname);
/* Pushes a sub-view of the view t (the argument at idx): rows x cols at data, t's stride, same
 * root, same expiry; writes through it reach the engine and mark the run modified. */
void ember_lua_push_subview(lua_State *L, int idx, const ember_lua_ref *t, float *data, int64_t rows, int64_t cols);

/* The largest tensor the bindings make: 2^32 values (16 GiB). Bigger is surely a mistake. */
#define EMBER_LUA_MAX_ELEMENTS ((int64_t)1 << 32)
/* Whether [rows, cols] is a tensor the bindings may make: both >= 1, at most EMBER_LUA_MAX_ELEMENTS
 * values (through ember_shape_count, so [2^32, 2^32] is refused instead of wrapping to 0). */
static inline bool ember_lua_shape_ok(int64_t rows, int64_t cols) {
    int64_t n;
    return rows >= 1 && cols >= 1 && ember_shape_count((const int64_t[]){rows, cols}, 2, EMBER_LUA_MAX_ELEMENTS, &n);
}

void ember_lua_open_tensor(lua_State *L, int module);
/* Pushes a new owned tensor with uninitialised values (rows, cols >= 1, checked by the caller). */
ember_lua_tensor *ember_lua_push_tensor(lua_State *L, int64_t rows, int64_t cols);
/* Pushes a new root view over data (armed); writes through it set *modified. */
ember_lua_view *ember_lua_push_view(lua_State *L, float *data, int64_t rows, int64_t cols, bool *modified);
/* Points an existing root view at a new buffer and makes it usable again; sub-views made before
 * stay expired. Allocates nothing. */
void ember_lua_arm_view(ember_lua_view *v, float *data, int64_t rows, int64_t cols);
/* After this, every use of the view (and of its rows) raises. Never touches the data. */
void ember_lua_expire_view(ember_lua_view *v);
/* The values of the Tensor or live TensorView at index i, contiguous (ember_lua_check_dense: a
 * strided view leaves its gathered copy on the stack); valid until Lua code runs again. */
const float *ember_lua_check_values(lua_State *L, int i, int64_t *rows, int64_t *cols, const char *fname);

#endif
