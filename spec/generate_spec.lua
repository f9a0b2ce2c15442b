-- generate's building blocks and the lists the core owns: the stage and hook names exported once
-- (checked against the names SPEC §4 gives), the sampler userdata (against hand-made logits and
-- against generate itself), the typo checker shared by attach and compose, and views re-armed
-- from call to call without bringing an older call's rows back to life.

local ember = require("ember")
local fx = require("helpers.fixtures")

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

-- SPEC §4.1 and the inside-the-layer stages of LUA_API.md (with the MoE layers' moe_router), written
-- out here as the independent expectation.
local STAGES = { "before_layer", "attention_pattern", "attention_heads", "after_attention", "moe_router",
  "mlp_activation", "after_mlp", "after_layer", "sae_features", "before_logits", "after_logits" }
local LAYER_STAGES = { table.unpack(STAGES, 1, 8) } -- a pass's own (sae_features is an SAE's)
local INSIDE = { "attention_pattern", "attention_heads", "moe_router", "mlp_activation" }
local SAE = { "sae_features" }
local RESIDUAL = { "before_layer", "after_attention", "after_mlp", "after_layer", "before_logits", "after_logits" }
local HOOKS = { "on_model_loaded", "before_prefill", "before_layer", "attention_pattern", "attention_heads",
  "after_attention", "moe_router", "mlp_activation", "after_mlp", "after_layer", "sae_features", "before_logits",
  "after_logits", "on_generation_complete" }

describe("name lists", function()
  it("exports the engine's stages, the per-layer ones and every hook, in order and as sets", function()
    local function list(t)
      local out = {}
      for i, v in ipairs(t) do out[i] = v end
      return out
    end
    assert.are.same(STAGES, list(ember.stages))
    assert.are.same(LAYER_STAGES, list(ember.layer_stages))
    assert.are.same(INSIDE, list(ember.inside_stages))
    assert.are.same(SAE, list(ember.sae_stages))
    assert.are.same(HOOKS, list(ember.hooks))
    for i, st in ipairs(STAGES) do assert.are.equal(i, ember.stages[st]) end
    assert.is_nil(ember.stages.after_mpl)
    assert.is_nil(ember.layer_stages.after_logits)
  end)

  it("is what selectors and compose use", function()
    assert.are.same(STAGES, require("ember.run.selectors").STAGES)
    assert.are.same(LAYER_STAGES, require("ember.run.selectors").LAYER_STAGES)
    assert.are.same(RESIDUAL, require("ember.run.selectors").RESIDUAL_STAGES)
    assert.are.same(HOOKS, require("ember.run.compose").HOOKS)
  end)

  it("exports the kernel sets (docs/kernels.md's four) and --kernels accepts exactly those", function()
    assert.are.same({ "auto", "reference", "avx2", "avx512" }, ember.kernel_sets)
    local flags = require("ember.cli.flags")
    assert.are.equal(ember.kernel_sets, flags.KERNEL_SETS)
    for _, name in ipairs(ember.kernel_sets) do assert.are.equal(name, (flags.kernels(name))) end
    local v, msg = flags.kernels("avx3")
    assert.is_nil(v)
    assert.truthy(tostring(msg):find("avx512", 1, true))
  end)
end)

describe("ember.sampler", function()
  it("is greedy at temperature 0, ties to the lowest id", function()
    local smp = ember.sampler { n_vocab = 5 }
    assert.are.equal(3, smp:sample(ember.tensor(1, 5, { 0.5, -1, 2, 7, 7 })))
    assert.are.equal(0, smp:sample(ember.tensor(1, 5, { 9, -1, 2, 7, 7 })))
    assert.are.equal(5, smp.n_vocab)
  end)

  it("samples reproducibly for a seed and only among the top_k", function()
    local logits = ember.tensor(1, 6, { 1, 3, 2, 3.5, 0, 2.5 })
    local function draws(seed, k)
      local smp = ember.sampler { n_vocab = 6, temperature = 1.5, top_k = k, seed = seed }
      local out = {}
      for i = 1, 40 do out[i] = smp:sample(logits) end
      return out
    end
    assert.are.same(draws(3, 0), draws(3, 0))
    assert.are_not.same(draws(3, 0), draws(4, 0))
    for _, id in ipairs(draws(5, 2)) do assert.is_truthy(id == 3 or id == 1, "top_k=2 drew " .. id) end
  end)

  it("refuses bad parameters and logits of the wrong shape", function()
    assert.are.equal("bad argument to 'sampler' (temperature must be >= 0, got -1.0)",
      error_of(ember.sampler, { n_vocab = 4, temperature = -1 }))
    assert.is_truthy(error_of(ember.sampler, { n_vocab = 4, top_p = 0 }):find("top_p must be in (0, 1]", 1, true))
    assert.is_truthy(error_of(ember.sampler, { n_vocab = 4, topk = 1 }):find("did you mean 'top_k'", 1, true))
    assert.is_truthy(error_of(ember.sampler, { n_vocab = 0 }):find("n_vocab must be >= 1", 1, true))
    local smp = ember.sampler { n_vocab = 4 }
    assert.are.equal("sample: logits must be [1, 4], got [2, 2]", error_of(smp.sample, smp, ember.tensor(2, 2)))
    smp:close()
    smp:close()
    assert.is_true(smp.closed)
    assert.are.equal("attempt to use a closed sampler", error_of(smp.sample, smp, ember.tensor(1, 4)))
  end)
end)

describe("check_experiment", function()
  it("returns the hooks an experiment defines: inherited and callable ones count", function()
    local class = { after_logits = function() end }
    class.__index = class
    local callable = setmetatable({}, { __call = function() end })
    local hooks = ember.check_experiment(setmetatable({ name = "x", after_mlp = callable }, class))
    assert.are.equal(callable, hooks.after_mlp)
    assert.are.equal(class.after_logits, hooks.after_logits)
    assert.is_nil(hooks.before_layer)
  end)

  it("refuses misspelt hooks, callable tables and inherited ones included", function()
    local callable = setmetatable({}, { __call = function() end })
    assert.are.equal("compose: experiment 'x' defines 'after_mpl', which is not a hook (did you mean 'after_mlp'?); "
      .. "a helper's name starts with '_'",
      error_of(ember.check_experiment, { name = "x", after_mpl = callable }, "compose"))
    local class = { on_generation_complet = function() end }
    class.__index = class
    assert.is_truthy(error_of(require("ember.run.compose").compose,
      { { name = "a" }, setmetatable({ name = "b" }, class) })
      :find("did you mean 'on_generation_complete'", 1, true))
    assert.is_truthy(error_of(ember.check_experiment, { name = "x", after_mlp = 5 })
      :find("hook 'after_mlp' must be a function, got number", 1, true))
  end)
end)

describe("generate on the primitives", function()
  local model_path = fx.need_api_model()
  if not model_path then return end
  local model
  setup(function() model = ember.load { model = model_path, kernels = "reference" } end)
  teardown(function() model:close() end)

  it("draws its first id with the same sampler a script can use", function()
    local opts = { temperature = 0.9, top_k = 30, top_p = 0.95, seed = 1234 }
    local out = model:generate { ids = { 3, 1, 4 }, max_tokens = 1, eos = false, temperature = opts.temperature,
      top_k = opts.top_k, top_p = opts.top_p, seed = opts.seed }
    local s = model:session { context = 8 }
    local smp = ember.sampler { n_vocab = model.info.n_vocab, temperature = opts.temperature, top_k = opts.top_k,
      top_p = opts.top_p, seed = opts.seed }
    assert.are.equal(out.ids[1], smp:sample(s:prefill({ 3, 1, 4 })))
    s:close()
  end)

  it("composes callable-table hooks instead of dropping them", function()
    local n = 0
    local counter = setmetatable({}, { __call = function() n = n + 1 end })
    local exp = require("ember.run.compose").compose({ { name = "a", after_logits = counter }, { name = "b" } })
    local N = 3
    model:generate { ids = { 1, 2 }, max_tokens = N, eos = false, experiment = exp }
    assert.are.equal(1 + N, n) -- prefill + one decode per generated token
  end)

  it("keeps a row of an earlier call expired although the hook's view is handed out again", function()
    local kept, calls, msg = nil, 0, nil
    model:generate { ids = { 1, 2 }, max_tokens = 2, eos = false, experiment = { name = "rows",
      after_logits = function(_, _, v)
        calls = calls + 1
        if not kept then
          kept = v:row(1)
        else
          local ok, err = pcall(kept.get, kept, 1, 1)
          if not ok then msg = msg or err end
          assert(not v:expired() and v:get(1, 1) == v:get(1, 1))
        end
      end } }
    assert.are.equal(3, calls)
    assert.is_truthy(msg and msg:find("expired view", 1, true), tostring(msg))
    assert.is_true(kept:expired())
  end)

  it("finishes with every logits tensor when a hook closes the model", function()
    local m = ember.load { model = model_path, kernels = "reference" }
    local out = m:generate { ids = { 1, 2, 3 }, max_tokens = 3, eos = false, all_logits = true, experiment = {
      name = "closer", after_logits = function(_, ctx) if ctx.phase == "decode" then m:close() end end } }
    assert.is_true(m.closed)
    assert.are.equal(3, #out.all_logits)
    assert.are.same({ 1, model.info.n_vocab }, out.logits:shape())
  end)
end)
