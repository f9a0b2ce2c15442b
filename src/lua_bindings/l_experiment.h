/* l_experiment.h — what other binding files use of the experiment runner: attaching an
 * experiment table, the engine hook table it fills, the lifecycle calls and the failure path. */
#ifndef EMBER_L_EXPERIMENT_H
#define EMBER_L_EXPERIMENT_H

#include "lbind.h"

#define EMBER_LUA_CONTEXT "ember.Context"
#define EMBER_LUA_RUNNER "ember.ExperimentRunner"

/* Hooks: the engine's tensor stages (ember_stage values), then the lifecycle of a generation. */
typedef enum {
    EMBER_HOOK_ON_MODEL_LOADED = EMBER_STAGE_COUNT,
    EMBER_HOOK_BEFORE_PREFILL,
    EMBER_HOOK_ON_GENERATION_COMPLETE,
    EMBER_HOOK_COUNT
} ember_lua_hook;

typedef struct ember_lua_runner ember_lua_runner;

/* Registers ember.Context and ember.ExperimentRunner, and core.stages, core.layer_stages,
 * core.hooks, core.check_experiment and core.attach. */
void ember_lua_open_experiment(lua_State *L, int module);

/* Inspects the experiment table at exp_idx once (name, hook methods, typos) and pushes a runner
 * userdata that must stay reachable while the runner is used. model_idx is the ember.Model;
 * fname names the caller in errors. */
ember_lua_runner *ember_lua_runner_attach(lua_State *L, int exp_idx, int model_idx, const char *fname);
/* The runner at index i (an ember.ExperimentRunner userdata). */
ember_lua_runner *ember_lua_check_runner(lua_State *L, int i);
/* The engine hook table for an evaluation that runs on thread L: only the stages the experiment
 * defines are set; NULL if none is. */
const ember_hooks *ember_lua_runner_hooks(lua_State *L, ember_lua_runner *r);
bool ember_lua_runner_modified(const ember_lua_runner *r);

/* The lifecycle hooks, when the experiment defines them (else nothing happens); a failing hook
 * raises its experiment failure. before_prefill gets a prefill context of n tokens at start. */
void ember_lua_runner_on_model_loaded(lua_State *L, ember_lua_runner *r);
void ember_lua_runner_before_prefill(lua_State *L, ember_lua_runner *r, int64_t n, int64_t start);

/* True when a hook of this runner failed; then ember_lua_runner_raise raises
 * "experiment '<name>' failed in <hook> (phase=<p>, layer=<n>): <message>". */
bool ember_lua_runner_failed(const ember_lua_runner *r);
int ember_lua_runner_raise(lua_State *L, ember_lua_runner *r);

#endif
