/* lbind.h — what the files of the Lua module `ember.core` share: userdata layouts, checkers, the
 * experiment runner. Only src/lua_bindings includes it; the engine never sees a lua_State. */
#ifndef EMBER_LBIND_H
#define EMBER_LBIND_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#include "ember.h"

/* Metatable names (registry keys); `__name` makes luaL_typeerror messages read well. */
#define EMBER_LUA_MODEL "ember.Model"
#define EMBER_LUA_SESSION "ember.Session"
#define EMBER_LUA_TENSOR "ember.Tensor"
#define EMBER_LUA_VIEW "ember.TensorView"
#define EMBER_LUA_CONTEXT "ember.Context"
#define EMBER_LUA_RUNNER "ember.ExperimentRunner"
#define EMBER_LUA_BOX "ember.Box"

/* Set by an embedding host's SIGINT handler (ember-lua); long C loops poll it between tokens so
 * Ctrl-C is seen even when no Lua code runs. Cleared by whoever raises "interrupted". */
extern volatile sig_atomic_t ember_lua_interrupted;

/* The module's entry point (lember.c): preloaded by ember-lua, exported by ember/core.so. */
LUAMOD_API int luaopen_ember_core(lua_State *L);

/* ---- shared helpers (lember.c) ---------------------------------------------------------------- */

/* Creates the metatable `tname` whose __index resolves, in order, `methods` (also kept as
 * mt.__methods so the REPL can complete them) and mt.__getters[key](self) (properties; Lua code
 * may add getters). Leaves the metatable on the stack. */
void ember_lua_new_class(lua_State *L, const char *tname, const luaL_Reg *methods, const luaL_Reg *meta,
                         const luaL_Reg *getters);

/* Raises "bad argument #arg to 'fname' (unknown option 'x'; valid: a, b, c)" for any string key of
 * the table at idx that is not in `valid` (NULL-terminated). Catches typos in option tables. */
void ember_lua_check_options(lua_State *L, int idx, const char *fname, const char *const *valid);
/* The entry of `valid` (NULL-terminated) nearest to word by edit distance, for "did you mean". */
const char *ember_lua_closest(const char *word, const char *const *valid);

/* Optional integer field of the options table at idx; a non-integer raises naming fname/key. */
lua_Integer ember_lua_opt_int_field(lua_State *L, int idx, const char *fname, const char *key, lua_Integer def);
lua_Number ember_lua_opt_num_field(lua_State *L, int idx, const char *fname, const char *key, lua_Number def);
const char *ember_lua_opt_str_field(lua_State *L, int idx, const char *fname, const char *key, const char *def);

/* A GC-managed box for one C resource: pushes a userdata whose __gc/__close call free_fn(ptr)
 * once. Store the pointer in *box after acquiring it; nothing leaks if a later call raises. */
void **ember_lua_box(lua_State *L, void (*free_fn)(void *));

/* Milliseconds from a monotonic clock. */
double ember_lua_now_ms(void);

/* ---- tensors (l_tensor.c) -------------------------------------------------------------------- */

/* Owned tensor: the values live inside the userdata, so Lua's GC owns everything. */
typedef struct {
    int64_t rows, cols;
    float data[]; /* (rows, cols) row-major */
} ember_lua_tensor;

/* Borrowed view over engine memory, valid only while the hook call that received it runs.
 * A row of a view is a sub-view whose `root` is the hook's view (kept alive by its user value),
 * so expiring the root expires every sub-view at once. */
typedef struct ember_lua_view {
    float *data; /* (rows, cols) row-major, not owned */
    int64_t rows, cols;
    bool alive;                  /* meaningful on the root only */
    bool *modified;              /* the run's mutation flag; touched only while alive */
    struct ember_lua_view *root; /* itself for a hook's view */
} ember_lua_view;

void ember_lua_open_tensor(lua_State *L, int module);
/* Pushes a new owned tensor with uninitialised values (rows, cols >= 1, checked by the caller). */
ember_lua_tensor *ember_lua_push_tensor(lua_State *L, int64_t rows, int64_t cols);
/* Pushes a view over data; writes through it set *modified. */
ember_lua_view *ember_lua_push_view(lua_State *L, float *data, int64_t rows, int64_t cols, bool *modified);
/* After this, every use of the view (and of its rows) raises. Never touches the data. */
void ember_lua_expire_view(ember_lua_view *v);

/* ---- models (l_model.c) ---------------------------------------------------------------------- */

typedef struct {
    ember_model *m;     /* NULL once freed */
    bool closed;        /* what Lua sees: closed models raise even while sessions keep m alive */
    int64_t n_sessions; /* open engine sessions point into m, so m is freed after the last one */
} ember_lua_model;

void ember_lua_open_model(lua_State *L, int module);
/* The open model at index i, or raises "attempt to use a closed model". */
ember_lua_model *ember_lua_check_model(lua_State *L, int i);
/* A session that pointed into the model was freed; frees the model if it was closed meanwhile. */
void ember_lua_model_release(ember_lua_model *lm);
/* Pushes the model's tokenizer, or raises "<fname>: the model has no tokenizer (<why>) ...". */
void ember_lua_model_need_tokenizer(lua_State *L, int idx, const char *fname);
/* Pushes model.tokenizer: the tokenizer, or nil when the model has none. */
void ember_lua_model_push_tokenizer(lua_State *L, int idx);
/* Pushes model.info (a table built once at load). */
void ember_lua_push_model_info(lua_State *L, int model_idx);

/* ---- sessions and generation (l_session.c) --------------------------------------------------- */

typedef struct {
    ember_session *s;         /* NULL once closed */
    ember_lua_model *model;   /* kept alive by the session's user value */
    bool busy;                /* an evaluation (and so maybe a hook) is running on this session */
} ember_lua_session;

void ember_lua_open_session(lua_State *L, int module);
/* Pushes a new session over the model at model_idx (n_ctx <= 0: engine default). */
ember_lua_session *ember_lua_new_session(lua_State *L, int model_idx, int64_t n_ctx, const char *fname);
/* model:generate{...}; registered as a Model method by l_model.c. */
int ember_lua_generate(lua_State *L);

/* ---- experiments (l_experiment.c) ------------------------------------------------------------ */

typedef enum {
    EMBER_HOOK_ON_MODEL_LOADED = EMBER_STAGE_COUNT, /* tensor hooks use the ember_stage values */
    EMBER_HOOK_BEFORE_PREFILL,
    EMBER_HOOK_ON_GENERATION_COMPLETE,
    EMBER_HOOK_COUNT
} ember_lua_hook;

typedef struct ember_lua_runner ember_lua_runner;

/* Inspects the experiment table at exp_idx once (name, hook methods, typos) and pushes a runner
 * userdata that must stay on the stack while the runner is used. fname names the caller in errors. */
ember_lua_runner *ember_lua_runner_attach(lua_State *L, int exp_idx, int model_idx, const char *fname);
/* The engine hook table: only the stages the experiment defines are set; NULL if none is. */
const ember_hooks *ember_lua_runner_hooks(ember_lua_runner *r);
bool ember_lua_runner_modified(const ember_lua_runner *r);

/* Counters a generation context reports. */
typedef struct {
    int64_t prompt_tokens, generated_tokens, decode_count;
} ember_lua_gen_counts;

/* Calls a lifecycle hook if the experiment defines it. ev is used by before_prefill, counts by
 * on_generation_complete. Returns EMBER_OK, or EMBER_ERR_HOOK with the failure kept in the runner. */
ember_status ember_lua_runner_lifecycle(lua_State *L, ember_lua_runner *r, ember_lua_hook hook,
                                        const ember_eval_ctx *ev, const ember_lua_gen_counts *counts);
/* True when a hook of this runner failed; then ember_lua_runner_raise raises
 * "experiment '<name>' failed in <hook> (phase=<p>, layer=<n>): <message>". */
bool ember_lua_runner_failed(const ember_lua_runner *r);
int ember_lua_runner_raise(lua_State *L, ember_lua_runner *r);

void ember_lua_open_context(lua_State *L, int module);

#endif
