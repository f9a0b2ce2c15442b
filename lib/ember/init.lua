-- ember — the public Lua API (`require("ember")`, documented in docs/lua-api.md): the C core
-- `ember.core` re-exported, plus the pieces that are simpler in Lua (tokenizer files, experiment
-- files). Must not hide core errors: they already name the function and the argument.

local core = require("ember.core")

local M = {}
for k, v in pairs(core) do
  if k ~= "internal" then M[k] = v end -- core.internal: building blocks of lib/ember, not API
end
M.core = core

-- model:generate and model:run_with_cache are Lua, added to the core's class by ember.model
local model = require("ember.model")
-- ember.act_name("resid_post", 3) -> "blocks.3.hook_resid_post" (TransformerLens's utils.get_act_name);
-- ember.stage_of(name) -> ember stage, layer (lib/ember/run/act_names.lua, the one table of both)
M.act_name = require("ember.run.act_names").act_name
M.stage_of = require("ember.run.act_names").stage_of

-- ember.tokenizer{ file = "tokenizer.json" } / { gguf = "vocab.gguf" } -> ember.Tokenizer
M.tokenizer = require("ember.model.tokenizer")

-- ember.trace(path [, model [, filter]]) -> ember.Trace (lib/ember/model/trace.lua, docs/inspection.md)
M.trace = require("ember.model.trace").open
-- ember.fingerprint(t) -> the value fingerprint of a tensor or view (t:fingerprint())
function M.fingerprint(t)
  local mt = getmetatable(t)
  local name = type(mt) == "table" and rawget(mt, "__name")
  if name ~= "ember.Tensor" and name ~= "ember.TensorView" then
    error("bad argument #1 to 'fingerprint' (ember.Tensor or ember.TensorView expected, got " .. type(t) .. ")", 2)
  end
  return t:fingerprint()
end

-- ember.sae.load(path [, opts]) -> an SAE (SAELens, Gemma Scope, Llama Scope; docs/sae.md)
M.sae = require("ember.sae")

-- ember.selectors: the command line's parsers (parse_kv, parse_uint, ...), for experiments
M.selectors = require("ember.run.selectors")
-- ember.experiments.<name>: the built-in experiment factories (activation_stats, zero_layer_output,
-- ablate_expert, steer), loaded on first use: ember.experiments.steer{ layer =, stage =, vector =, scale = }
M.experiments = setmetatable({}, { __index = function(t, name)
  local ok, factory = pcall(require, "ember.experiments." .. tostring(name))
  if not ok then error("ember.experiments: no built-in experiment '" .. tostring(name) .. "'", 2) end
  rawset(t, name, factory)
  return factory
end })

-- ember.load{...} -> ember.Model, and the list of its options (lib/ember/model/init.lua)
M.load, M.LOAD_OPTIONS = model.load, model.LOAD_OPTIONS

-- ember.default_model() -> the path of the model commands use when given none: the project's tiny
-- llama (Q8_0, seed 7), made on first use in $XDG_CACHE_HOME/ember (else ~/.cache/ember)
function M.default_model() return require("ember.model.default_model").path() end

-- ember.save_tensors(path, { name = tensor, ... } [, metadata]) / ember.load_tensors(path) ->
-- { name = tensor }, metadata: named tensors in one safetensors file (lib/ember/store/tensor_file.lua)
local tensor_file = require("ember.store.tensor_file")
M.save_tensors, M.load_tensors = tensor_file.save, tensor_file.load

-- ember.plot.heatmap(t, { out = "DIR/name", xtokens =, ytokens =, ... }) -> { svg, png }: any 2-D
-- tensor as a heatmap (gnuplot); ember.plot.attention{ model =, prompt =, layer =, heads =, out = }:
-- a layer's attention pattern, one figure per head (docs/lua-api.md, docs/inspection.md)
M.plot = {
  heatmap = function(t, opts) return require("ember.analysis.plot").heatmap(t, opts) end,
  attention = function(opts) return require("ember.analysis.attention").draw(opts) end,
}

-- ember.probe.train{ x = T | { T, ... }, y = { labels }, holdout =, seed =, iterations =, l2 =,
-- control =, pool = } -> probe (probe:predict(t), probe:save(path, { layer = })), ember.probe.load(path):
-- the linear probes of `ember probe`, on tensors (docs/probes.md)
M.probe = {
  train = function(opts) return require("ember.analysis.probe").train_probe(opts) end,
  load = function(path) return require("ember.analysis.probe").load_probe(path) end,
}

-- ember.sweep{ model =, clean =, corrupted =, metric =, stages =, layers =, positions =, out =, ... }
-- -> the causal sweep's result (lib/ember/sweep/init.lua, docs/sweeps.md)
function M.sweep(opts) return require("ember.sweep").run(opts) end
-- ember.attribute{ model =, clean =, corrupted =, metric =, components =, verify = K, ... } -> AtP
-- scores ranked, with exact patching of the top K when asked (lib/ember/analysis/attribute.lua,
-- docs/attribution.md)
function M.attribute(opts) return require("ember.analysis.attribute").run(opts) end

-- ember.extract_hidden{ model =, prompts =, layers = } -> per prompt { prompt, label, ids, hidden =
-- { [layer] = Tensor } }: the residual stream after layers, every prompt token (docs/extraction.md)
function M.extract_hidden(opts) return require("ember.analysis.extract").hidden(opts) end

-- ember.load_experiment(path [, args [, model]]) -> experiment table
-- An experiment file returns a factory `function(args, model) return exp end` (or the table
-- itself); model (optional) is passed to the factory as the `ember` command passes it: a handle
-- with info, tokenize, detokenize (and unembed).
function M.load_experiment(path, args, model)
  if type(path) ~= "string" then
    error("bad argument #1 to 'load_experiment' (file path expected, got " .. type(path) .. ")", 2)
  end
  -- the one loader of experiment files (the CLI's too): errors name the file
  local builtin = require("ember.run.builtin")
  local ok, made = pcall(builtin.load, path, args, model and builtin.handle(model))
  if not ok then error("load_experiment: " .. tostring(made), 2) end
  return made
end

return M
