-- ember.model.gradients — model:gradients{ prompt | ids, metric, stages, freeze, values }: one
-- evaluation of a prompt with a backward pass (the engine's ember_session_gradients on a session of
-- its own), the gradient of a metric of the last position's logits at every stage asked for, as
-- owned Tensors in a cache-like object (g:get(stage, layer)). Parses and checks the options; the
-- arithmetic is the engine's. Must not run experiments: gradients are of the model as it is.

local core = require("ember.core")
local distribution = require("ember.analysis.distribution")
local metric_mod = require("ember.sweep.metric")
local options = require("ember.model.options")
local selectors = require("ember.run.selectors")

local M = {}

-- The stages a gradient can be taken at: every stage a pass calls by itself, and the embedding
-- rows (the token embeddings as looked up, before any scaling or position); on the families that
-- have them, their own stages too (moe_router), which the default list adds for those models.
M.STAGES = { "embeddings" }
for _, s in ipairs(selectors.PASS_STAGES) do M.STAGES[#M.STAGES + 1] = s end
local STAGE_SET = {}
for _, s in ipairs(M.STAGES) do STAGE_SET[s] = true end
for s in pairs(selectors.FAMILY_STAGES) do STAGE_SET[s] = true end

-- the family stages model has (the stage table's families column), in the table's order
local function own_stages(model)
  local out = {}
  for _, row in ipairs(require("ember.core").STAGES) do
    for _, f in ipairs(row.families or {}) do
      if f == model.info.family then out[#out + 1] = row.name end
    end
  end
  return out
end
M.FREEZE = { "attention", "norm" }

local OPTIONS = { ids = true, prompt = true, bos = true, metric = true, stages = true, freeze = true, values = true,
  reference = true }

local function raise(msg) error("gradients: " .. msg, 0) end
local function fail(msg, ...) raise(string.format(msg, ...)) end

-- The metric as the core takes it: { kind, a, b, reference } from a metric string
-- ("logit-diff:A,B" | "logit:A" | "logprob:A" | "prob:A" | "kl") or its parsed table.
local function core_metric(model, opts)
  if opts.metric == nil then fail("metric is required (logit-diff:A,B | logit:A | logprob:A | prob:A | kl)") end
  local m, err = metric_mod.parse(opts.metric)
  if not m then fail("%s", err:gsub("^metric: ", "")) end
  -- token strings (logit:" Paris") through the tokenizer, each exactly one token, as in sweeps
  local ok, ids = pcall(metric_mod.token_ids, m, function(text) return model:to_single_token(text) end)
  if not ok then fail("%s", tostring(ids)) end
  m = ids
  local n_vocab = model.info.n_vocab
  local want = m.kind == "logit-diff" and 2 or m.kind == "kl" and 0 or 1
  if #m.tokens ~= want then
    fail("metric %s needs %d token id%s (e.g. %s)", m.kind, want, want == 1 and "" or "s",
      want == 2 and "logit-diff:12,40" or m.kind .. ":12")
  end
  for _, id in ipairs(m.tokens) do
    if math.type(id) ~= "integer" or id < 0 or id >= n_vocab then
      fail("metric token %s is outside the vocabulary (0..%d)", tostring(id), n_vocab - 1)
    end
  end
  local out = { kind = m.kind, a = m.tokens[1], b = m.tokens[2] }
  if m.kind == "kl" then -- KL(reference || p): the reference run's logits, as probabilities in double
    local ref = opts.reference
    if ref == nil then fail("the kl metric needs reference = the reference run's logits ([1, %d])", n_vocab) end
    local shape = ref.shape and ref:shape()
    if not shape or shape[1] * shape[2] ~= n_vocab then fail("reference must be a [1, %d] logits Tensor", n_vocab) end
    out.reference = core.tensor(1, n_vocab, distribution.softmax(ref:values()))
  elseif opts.reference ~= nil then
    fail("reference is only for the kl metric")
  end
  return out, m
end

local function stage_list(opts, model)
  if opts.stages == nil then
    local all = { table.unpack(M.STAGES) }
    for _, s in ipairs(own_stages(model)) do all[#all + 1] = s end
    return all
  end
  if type(opts.stages) ~= "table" then fail("stages must be a list of stage names, got %s", type(opts.stages)) end
  for _, s in ipairs(opts.stages) do
    if not STAGE_SET[s] then
      fail("no gradient at stage '%s' (stages: %s)", tostring(s), table.concat(M.STAGES, ", "))
    end
  end
  return opts.stages
end

local function freeze_set(opts)
  local set = {}
  if opts.freeze == nil then return set end
  if type(opts.freeze) ~= "table" then fail("freeze must be a list of modes (attention, norm)") end
  for _, f in ipairs(opts.freeze) do
    if f ~= "attention" and f ~= "norm" then
      fail("unknown frozen mode '%s' (modes: %s)", tostring(f), table.concat(M.FREEZE, ", "))
    end
    set[f] = true
  end
  return set
end

-- ---- the result ----------------------------------------------------------------------------------

local Gradients = {}
local meta = { __name = "ember.Gradients", __index = Gradients }

local function lookup(self, tables, what, stage, layer)
  if stage == "embeddings" then
    if layer ~= nil then fail("embeddings has no layer (got %s)", tostring(layer)) end
    local t = tables.embeddings
    if not t then fail("%s of embeddings was not kept (stages = { 'embeddings', ... })", what) end
    return t
  end
  if not STAGE_SET[stage] then
    fail("no gradient at stage '%s' (stages: %s)", tostring(stage), table.concat(M.STAGES, ", "))
  end
  local held = tables[stage]
  if held == nil then fail("%s at %s was not kept (stages: %s)", what, stage, table.concat(self.stages, ", ")) end
  if selectors.LAYER_STAGE_SET[stage] then
    if math.type(layer) ~= "integer" or held[layer] == nil then
      fail("%s is per layer: give a 0-based layer 0..%d, got %s", stage, self.n_layers - 1, tostring(layer))
    end
    return held[layer]
  end
  if layer ~= nil then fail("%s has no layer (got %s)", stage, tostring(layer)) end
  return held
end

-- g:get(stage [, layer]) -> Tensor: d metric / d activation at (stage, layer), the stage's view
-- shape (docs/hooks.md); "embeddings" for the embedding rows.
function Gradients:get(stage, layer) return lookup(self, self.gradients, "the gradient", stage, layer) end

-- g:value(stage [, layer]) -> Tensor: the forward's own activation there (values = true).
function Gradients:value(stage, layer)
  if not self.values then fail("values were not kept (model:gradients{ values = true, ... })") end
  return lookup(self, self.values, "the value", stage, layer)
end

-- gradients(model, opts) -> Gradients: { metric = value, kind, tokens, ids, stages, freeze, n_layers,
-- gradients = { stage = { [layer] = Tensor } | Tensor }, values = (same, when asked) }
function M.gradients(model, opts)
  if type(opts) == "table" and opts.experiment ~= nil then
    fail("experiments are refused: the gradients are of the model as it is, and a hook that edits the forward "
      .. "pass has no derivative the backward could follow")
  end
  options.check(opts, OPTIONS, raise)
  local ids = options.prompt_ids(model, opts, raise)
  local cm, parsed = core_metric(model, opts)
  local stages, freeze = stage_list(opts, model), freeze_set(opts)
  local engine_stages, embeddings = {}, false
  for _, s in ipairs(stages) do
    if s == "embeddings" then embeddings = true else engine_stages[#engine_stages + 1] = s end
  end
  local r = core.internal.gradients(model, ids, { metric = cm, stages = engine_stages, embeddings = embeddings,
    values = opts.values and true or false, freeze_attention = freeze.attention, freeze_norm = freeze.norm })
  r.gradients.embeddings = r.embeddings
  if r.values then r.values.embeddings = nil end
  local g = { metric = r.metric, kind = parsed.kind, tokens = parsed.tokens, ids = ids, stages = stages,
    freeze = options.sorted_keys(freeze), n_layers = model.info.n_layers, gradients = r.gradients,
    values = r.values }
  return setmetatable(g, meta)
end

return M
