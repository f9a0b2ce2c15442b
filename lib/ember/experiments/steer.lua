-- ember.experiments.steer — built-in intervention: adds vectors, each times a scale, to the rows of
-- chosen per-layer stages (every prompt row in prefill, the token's row in every decode step).
-- The one owner of steering: --steer, --control-vector and scripts/experiments/steering_vector.lua
-- all go through it. Must not be quiet: it counts every addition and says on stderr that the run
-- was modified, and its manifest entry names each vector (sha256, shape, scale, layers, stage).
--
-- Use: require("ember.experiments.steer"){ layer = 3, stage = "after_layer", vector = t, scale = 4 }
--      or { additions = { { layer = ..., stage = ..., vector = ..., scale = ... }, ... } }
-- layer: a 0-based number, a list of numbers, or a layer list in the selector grammar ("2-4",
--   "all"); stage: a per-layer stage (after_layer by default). The residual stages take a
--   [hidden] vector; attention_heads ([rows, n_heads * head_dim]) and mlp_activation ([rows, n_ff])
--   take one of their own width, checked at the first call; attention_pattern is refused (its width
--   is the sequence length, which grows with every token).
-- vector: an ember.Tensor/TensorView of one row, a list of numbers, or a source string for
--   ember.store.vector_file ("v.npy", "v.safetensors#name", "ARTIFACT_DIR#record@row").
-- A vector whose scaled values are all zero (scale 0) is never added: such a run is bit-identical
-- to one without it, and is not marked modified.

local selectors = require("ember.run.selectors")
local core = require("ember.core")

local M = {}

local function is_tensor(v)
  local mt = getmetatable(v)
  local name = type(mt) == "table" and rawget(mt, "__name")
  return name == "ember.Tensor" or name == "ember.TensorView"
end

-- vector_of(v, where) -> ember.Tensor [1, n] (owned copy), and its source record for the manifest.
local function vector_of(v, where)
  if type(v) == "string" then
    local ok, r = pcall(require("ember.store.vector_file").read, v)
    if not ok then error(where .. ": " .. tostring(r), 0) end
    return r.tensor, r.source
  end
  if is_tensor(v) then
    local shape = v:shape()
    if shape[1] ~= 1 then
      error(string.format("%s: vector is [%d, %d]; give one row (t:row(r))", where, shape[1], shape[2]), 0)
    end
    return v:clone(), "tensor"
  end
  if type(v) == "table" and #v > 0 then
    for i, x in ipairs(v) do
      if type(x) ~= "number" then error(string.format("%s: vector[%d] is not a number", where, i), 0) end
    end
    return core.tensor(1, #v, v), "table"
  end
  error(where .. ": vector must be an ember.Tensor of one row, a list of numbers or a file (.npy, "
    .. ".safetensors, ARTIFACT_DIR#RECORD)", 0)
end

-- layers_of(l, where) -> "all" | sorted list of layer numbers
local function layers_of(l, where)
  if l == nil then error(where .. ": layer is required", 0) end
  if math.type(l) == "integer" then
    if l < 0 then error(string.format("%s: layer %d is negative", where, l), 0) end
    return { l }
  end
  if type(l) == "table" then
    local out = {}
    for i, x in ipairs(l) do
      if math.type(x) ~= "integer" or x < 0 then
        error(string.format("%s: layer[%d] is not a layer number", where, i), 0)
      end
      out[#out + 1] = x
    end
    table.sort(out)
    return out
  end
  local list, err = selectors.parse_index_list(tostring(l), "layer")
  if not list then error(where .. ": layer: " .. err, 0) end
  return list
end

-- stage_of(s, where) -> the full stage name (short names attention|mlp|layer are accepted)
local function stage_of(s, where)
  s = s or "after_layer"
  s = selectors.ZERO_STAGES[s] or selectors.stage_name(s) or s
  if s == "attention_pattern" then
    error(where .. ": attention_pattern cannot be steered: its rows are [n_heads * rows, sequence_length], a width "
      .. "that grows with every token (add to attention_heads instead, or knock keys out with "
      .. "scripts/experiments/attention_knockout.lua)", 0)
  end
  if not selectors.LAYER_STAGE_SET[s] then
    error(string.format("%s: stage '%s' is not a per-layer stage (%s)", where, tostring(s),
      table.concat(selectors.LAYER_STAGES, "|")), 0)
  end
  return s
end

-- addition(spec, i) -> the checked, scaled addition
local function addition(spec, i)
  local where = "steer" .. (i and ("[" .. i .. "]") or "")
  if type(spec) ~= "table" then error(where .. ": expected a table { layer =, stage =, vector =, scale = }", 0) end
  local scale = spec.scale == nil and 1.0 or spec.scale
  if type(scale) == "string" then
    local x, err = selectors.parse_float(scale)
    if x == nil then error(where .. ": scale: " .. err, 0) end
    scale = x
  end
  if type(scale) ~= "number" or scale ~= scale or scale == math.huge or scale == -math.huge then
    error(where .. ": scale must be a finite number", 0)
  end
  local layers = layers_of(spec.layer, where)
  local stage = stage_of(spec.stage, where)
  local t, source = vector_of(spec.vector, where)
  local a = {
    layers = layers, stage = stage, scale = scale + 0.0, source = spec.source or source,
    sha256 = t:sha256(), cols = t:shape()[2], label = spec.label,
    prefill = 0, decode = 0,
  }
  -- the vector as added: v * scale in f32, computed once (never per call)
  a.scaled = t:clone():scale(scale)
  a.zero = a.scaled:abs_max() == 0
  a.layer_set = {}
  if layers ~= "all" then for _, l in ipairs(layers) do a.layer_set[l] = true end end
  return a
end

local function layers_text(layers)
  if layers == "all" then return "all" end
  local parts, i = {}, 1
  while i <= #layers do
    local j = i
    while j < #layers and layers[j + 1] == layers[j] + 1 do j = j + 1 end
    parts[#parts + 1] = j > i and (layers[i] .. "-" .. layers[j]) or tostring(layers[i])
    i = j + 1
  end
  return table.concat(parts, ",")
end
M.layers_text = layers_text

-- Residual-stream stages have hidden_size columns; the others are checked when first seen.
local RESIDUAL = selectors.RESIDUAL_LAYER_STAGE_SET

-- Checked again before anything runs (the CLI checks too): layers the model does not have, and a
-- residual vector of the wrong width, fail with both numbers.
local function check_model(list, model)
  local n, hidden = model.n_layers, model.hidden_size
  for _, a in ipairs(list) do
    if a.layers ~= "all" then
      for _, l in ipairs(a.layers) do
        if l >= n then
          error(string.format("steer: layer %d is out of range (the model has %d layers: 0-%d)", l, n, n - 1), 0)
        end
      end
    end
    if RESIDUAL[a.stage] and a.cols ~= hidden then
      error(string.format("steer: vector %s has %d values but %s is %d wide (the model's hidden size)",
        a.source, a.cols, a.stage, hidden), 0)
    end
  end
end

-- stage_hook(stage, adds, stats) -> the hook of one stage: it walks only that stage's additions
local function stage_hook(stage, adds, stats)
  return function(_, ctx, view)
    local L = ctx.layer_index
    for _, a in ipairs(adds) do
      if a.layers == "all" or a.layer_set[L] then
        local cols = view:shape()[2]
        if cols ~= a.cols then
          error(string.format("steer: vector %s has %d values but %s of layer %d is %d wide", a.source, a.cols,
            stage, L, cols), 0)
        end
        if not a.zero then
          view:add(a.scaled) -- [1, cols] added to every row
          a[ctx.phase] = a[ctx.phase] + 1
          stats.additions = stats.additions + 1
          stats[ctx.phase] = stats[ctx.phase] + 1
        end
      end
    end
  end
end

-- announce(name, list, notice): each addition said once the generation completes
local function announce(name, list, notice)
  for _, a in ipairs(list) do
    local what = a.label or string.format("%s:%s:%s:%g", layers_text(a.layers), a.stage, a.source, a.scale)
    if a.zero then
      notice(string.format("ember: %s %s: the scaled vector is zero (scale %g); nothing was added", name, what,
        a.scale))
    else
      notice(string.format("ember: this run was MODIFIED by %s %s: vector [1, %d] (sha256 %s) times %g added to "
        .. "%s of %s, %d times (prefill %d, decode %d)", name, what, a.cols, a.sha256:sub(1, 12),
        a.scale, a.stage, a.layers == "all" and "every layer"
          or ((#a.layers > 1 and "layers " or "layer ") .. layers_text(a.layers)),
        a.prefill + a.decode, a.prefill, a.decode))
    end
  end
end

-- make(args) -> the experiment. args: one addition's fields, or { additions = {...} }; optional
-- name (default "steer"), notice = fn(msg) (default: stderr), what = text for the notice.
function M.make(args)
  if type(args) ~= "table" then
    error("steer: expected a table { layer =, stage =, vector =, scale = } or { additions = {...} }", 0)
  end
  local notice = args.notice or function(msg) io.stderr:write(msg, "\n") end
  local list = {}
  if args.additions ~= nil then
    if type(args.additions) ~= "table" or #args.additions == 0 then
      error("steer: additions must be a non-empty list", 0)
    end
    for i, spec in ipairs(args.additions) do list[i] = addition(spec, i) end
  else
    list[1] = addition(args)
  end

  local exp = { name = args.name or "steer", additions = list,
    stats = { additions = 0, prefill = 0, decode = 0, vectors = #list } }

  -- the manifest's record of each vector (ember.store.manifest writes `details` as given)
  exp.details = {}
  for i, a in ipairs(list) do
    exp.details[i] = { layers = a.layers == "all" and "all" or layers_text(a.layers), stage = a.stage,
      source = a.source, sha256 = a.sha256, shape = { 1, a.cols }, scale = a.scale, label = a.label }
  end
  function exp:on_model_loaded(ctx) check_model(list, ctx.model) end
  -- one hook per stage that has additions
  local by_stage = {}
  for _, a in ipairs(list) do
    by_stage[a.stage] = by_stage[a.stage] or {}
    table.insert(by_stage[a.stage], a)
  end
  for stage, adds in pairs(by_stage) do exp[stage] = stage_hook(stage, adds, exp.stats) end
  function exp:on_generation_complete() announce(exp.name, list, notice) end
  return exp
end

return setmetatable(M, { __call = function(_, args) return M.make(args) end })
