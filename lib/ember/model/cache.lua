-- ember.model.cache — model:run_with_cache{...}: one prefill pass on a fresh session that returns the
-- chosen activations as an ActivationCache (ember.model.activation_cache) of owned Tensors, plus
-- the logits; with prompts= (or ids= a list of id lists) one batched pass (model:batch) that
-- returns one ActivationCache per prompt, each bit for bit what the prompt gives alone. Built on
-- the ordinary experiment hooks (a read-only experiment that clones the views it was asked for),
-- so the pass computes exactly what an uninstrumented prefill computes. Keeps only what was asked
-- for.

local options = require("ember.model.options")
local act_names = require("ember.run.act_names")
local activation_cache = require("ember.model.activation_cache")
local selectors = require("ember.run.selectors")

local M = {}

local OPTIONS = { ids = true, prompt = true, prompts = true, bos = true, stages = true, layers = true,
  all_logits = true }

-- Level 0: the message names the function and the option; a library position would only mislead.
local function fail(msg) error("run_with_cache: " .. msg, 0) end

-- stages= a list of stage names: the engine's own (core.stages, as ember.selectors exports it) or
-- TransformerLens's (resid_post, attn.hook_z, ...; ember.run.act_names); absent: all a pass calls
-- by itself (sae_features only when named). Returns the ember names, each once, in the engine's
-- order.
local function stage_list(opts)
  if opts.stages == nil then return { table.unpack(selectors.PASS_STAGES) } end
  if type(opts.stages) ~= "table" then fail("stages must be a list of stage names, got " .. type(opts.stages)) end
  local chosen = {}
  for _, s in ipairs(opts.stages) do
    local stage, err = act_names.stage(s)
    if not stage then fail(err) end
    chosen[stage] = true
  end
  local out = {}
  for _, s in ipairs(selectors.STAGES) do if chosen[s] then out[#out + 1] = s end end
  return out
end

-- layers= a list of 0-based layer indices; absent: every layer. Returns a set.
local function layer_set(opts, n_layers)
  local set = {}
  if opts.layers == nil then
    for l = 0, n_layers - 1 do set[l] = true end
    return set
  end
  if type(opts.layers) ~= "table" then
    fail("layers must be a list of 0-based layer indices, got " .. type(opts.layers))
  end
  for _, l in ipairs(opts.layers) do
    if math.type(l) ~= "integer" or l < 0 or l >= n_layers then
      fail("layer " .. tostring(l) .. " out of range 0.." .. (n_layers - 1) .. " (layers are 0-based)")
    end
    set[l] = true
  end
  return set
end

-- run_with_cache(model, opts) -> an ActivationCache (docs/lua-api.md)
--   opts: { ids = {...} | prompt = "text", bos = bool, stages = {...}, layers = {...}, all_logits = bool }
--   cache:get(stage, layer), cache[stage][layer] for per-layer stages (0-based layer keys),
--   cache.before_logits and cache.after_logits (Tensors), cache.logits ([1, n_vocab] of the last
--   position, or [P, n_vocab] with all_logits), cache.ids (the prompt ids), cache.stages,
--   cache.layers (sorted lists; cache:layers() iterates).
--   With prompts = {"text", ...} or ids = {{...}, {...}}: one batched pass; returns the list of
--   caches (one per prompt, in order) and the list of their logits.
-- The prompts of a batched call: prompts= (texts) or ids= a list of id lists; nil for one prompt.
local function batch_ids(model, opts)
  local many_ids = type(opts.ids) == "table" and type(opts.ids[1]) == "table"
  if opts.prompts == nil and not many_ids then return nil end
  if opts.prompts ~= nil and (opts.ids ~= nil or opts.prompt ~= nil) then
    fail("give one of ids=, prompt= or prompts=")
  end
  local list = opts.prompts or opts.ids
  if type(list) ~= "table" or #list == 0 then fail("prompts must be a non-empty list") end
  local out = {}
  for i, p in ipairs(list) do
    local ok, ids = pcall(options.prompt_ids, model, opts.prompts and { prompt = p, bos = opts.bos } or { ids = p },
      function(msg) error(msg, 0) end)
    if not ok then fail("prompt " .. i .. ": " .. ids) end
    out[i] = ids
  end
  return out
end

-- The batched run_with_cache: one pass of a batch over every prompt, each sequence's rows of every
-- view cloned into its own cache (view:sequence(i)). Returns the caches and their logits.
local function run_batched(model, opts, prompts, stages, layers)
  local last_layer = model.info.n_layers - 1
  local caches, all_logits, longest = {}, {}, 1
  for i, ids in ipairs(prompts) do
    caches[i] = activation_cache.new { ids = ids, stages = stages, layers = options.sorted_keys(layers), model = model }
    longest = math.max(longest, #ids)
  end
  local hold = activation_cache.hold
  local function each(ctx, view, f)
    for _, q in ipairs(ctx.sequences) do f(q.index, view:sequence(q.index)) end
  end
  local exp = { name = "run_with_cache" }
  for _, stage in ipairs(stages) do
    if selectors.LAYER_STAGE_SET[stage] then
      exp[stage] = function(_, ctx, view)
        if layers[ctx.layer_index] then
          each(ctx, view, function(i, v) hold(caches[i], stage, ctx.layer_index, v:clone()) end)
        end
      end
    else
      exp[stage] = function(_, ctx, view) each(ctx, view, function(i, v) hold(caches[i], stage, nil, v:clone()) end) end
    end
  end
  if opts.all_logits then
    local keep = exp.after_layer
    exp.after_layer = function(self, ctx, view)
      if keep then keep(self, ctx, view) end
      if ctx.layer_index == last_layer then each(ctx, view, function(i, v) all_logits[i] = model:unembed(v) end) end
    end
  end
  local b <close> = model:batch { size = #prompts, context = longest }
  local logits = b:prefill(prompts, { experiment = exp })
  for i, c in ipairs(caches) do
    logits[i] = all_logits[i] or logits[i]
    rawset(c, "logits", logits[i])
  end
  return caches, logits
end

-- The batched call with attention_pattern among its stages: each prompt in a pass of its own (a
-- batch gives the same bits; its hooks see one sequence's keys only). The caches and their logits.
local run_each
function run_each(model, opts, prompts)
  local caches, logits = {}, {}
  for i, ids in ipairs(prompts) do
    local one = {}
    for k, v in pairs(opts) do
      if k ~= "prompts" and k ~= "prompt" and k ~= "ids" and k ~= "bos" then one[k] = v end
    end
    one.ids = ids -- as batch_ids read them (the BOS already there when asked)
    caches[i] = M.run_with_cache(model, one)
    logits[i] = caches[i].logits
  end
  return caches, logits
end

function M.run_with_cache(model, opts)
  options.check(opts, OPTIONS, fail)
  local info = model.info
  local prompts = batch_ids(model, opts)
  if prompts then
    local stages = stage_list(opts)
    for _, s in ipairs(stages) do
      -- a pattern has each prompt's own key count: the prompts one after another (the same bits)
      if s == "attention_pattern" then return run_each(model, opts, prompts) end
    end
    return run_batched(model, opts, prompts, stages, layer_set(opts, info.n_layers))
  end
  local ids = options.prompt_ids(model, opts, fail)
  local stages = stage_list(opts)
  local layers = layer_set(opts, info.n_layers)
  local last_layer = info.n_layers - 1

  local cache = activation_cache.new { ids = ids, stages = stages, layers = options.sorted_keys(layers), model = model }
  local hold = activation_cache.hold
  local exp = { name = "run_with_cache" }
  for _, stage in ipairs(stages) do
    if selectors.LAYER_STAGE_SET[stage] then
      exp[stage] = function(_, ctx, view)
        if layers[ctx.layer_index] then hold(cache, stage, ctx.layer_index, view:clone()) end
      end
    else
      exp[stage] = function(_, _, view) hold(cache, stage, nil, view:clone()) end
    end
  end
  -- Every position's logits: the last layer's residual through the unembedding, read in place
  -- inside the hook (no copy of the residual is kept unless after_layer was asked for).
  local all_logits
  if opts.all_logits then
    local keep = exp.after_layer
    exp.after_layer = function(self, ctx, view)
      if keep then keep(self, ctx, view) end
      if ctx.layer_index == last_layer then all_logits = model:unembed(view) end
    end
  end

  local s <close> = model:session { context = #ids }
  local logits = s:prefill(ids, { experiment = exp })
  rawset(cache, "logits", all_logits or logits)
  return cache
end

return M
