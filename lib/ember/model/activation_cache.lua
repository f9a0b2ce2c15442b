-- ember.model.activation_cache — the ActivationCache model:run_with_cache returns: the owned
-- Tensors of one prompt's prefill by stage and layer, looked up by ember or TransformerLens names,
-- stacked, and taken apart (accumulated and decomposed residual, per-head results, the final norm
-- with a frozen scale, direct logit attribution). Reads the tensors it holds and the model's
-- weights; never runs the model (run_with_cache did) and never changes a tensor it holds.

local core = require("ember.core")
local act_names = require("ember.run.act_names")

local M = {}

local PER_LAYER = core.layer_stages

local function fail(msg, ...) error("cache: " .. string.format(msg, ...), 0) end

-- ---- the per-stage table: cache.after_layer[3] -------------------------------------------------

-- A per-layer stage's tensors keyed by their 0-based layer, as before; # counts them (a table
-- keyed from 0 would say one less) and pairs() runs through them in layer order.
local StageLayers = { __name = "ember.ActivationCache.stage" }

local function sorted_layers(t)
  local out = {}
  for l in next, t do if math.type(l) == "integer" then out[#out + 1] = l end end
  table.sort(out)
  return out
end

StageLayers.__len = function(t) return #sorted_layers(t) end
StageLayers.__pairs = function(t)
  local layers, i = sorted_layers(t), 0
  return function()
    i = i + 1
    local l = layers[i]
    if l ~= nil then return l, rawget(t, l) end
  end, t, nil
end

local function range_text(layers)
  if #layers == 0 then return "no layers" end
  local contiguous = layers[#layers] - layers[1] + 1 == #layers
  if contiguous then return string.format("layers %d-%d", layers[1], layers[#layers]) end
  local s = {}
  for i, l in ipairs(layers) do s[i] = tostring(l) end
  return "layers " .. table.concat(s, ",")
end

StageLayers.__tostring = function(t)
  local layers = sorted_layers(t)
  local first = layers[1] and rawget(t, layers[1])
  local shape = first and first:shape()
  return string.format("%s: %s (%d), each [%s]", rawget(getmetatable(t), "__stage") or "stage", range_text(layers),
    #layers, shape and (shape[1] .. ", " .. shape[2]) or "")
end

local function new_stage_table(stage)
  local mt = {}
  for k, v in pairs(StageLayers) do mt[k] = v end
  mt.__stage = stage
  return setmetatable({}, mt)
end

-- ---- the cache ---------------------------------------------------------------------------------

local Cache = {}
local meta = { __name = "ember.ActivationCache", __methods = Cache }

-- What the cache holds, for messages: "after_layer at layers 0-5, before_logits".
local function holds(self)
  local parts = {}
  for _, st in ipairs(core.stages) do
    local held = rawget(self, st)
    if held ~= nil then
      parts[#parts + 1] = PER_LAYER[st] and (st .. " at " .. range_text(sorted_layers(held))) or st
    end
  end
  return "it holds " .. (#parts > 0 and table.concat(parts, ", ") or "no stages")
end

-- The cached (stage, layer) pairs in execution order: layer by layer, the stages of each layer in
-- the engine's order, then the logits stages.
local function entries(self)
  local out = {}
  for _, l in ipairs(self.layers) do
    for _, st in ipairs(core.layer_stages) do
      local held = rawget(self, st)
      if held and rawget(held, l) then out[#out + 1] = { stage = st, layer = l, tensor = rawget(held, l) } end
    end
  end
  for _, st in ipairs(core.stages) do
    if not PER_LAYER[st] and rawget(self, st) then out[#out + 1] = { stage = st, tensor = rawget(self, st) } end
  end
  return out
end


-- cache:get(stage [, layer]) -> Tensor: stage an ember stage, a TransformerLens short or hook
-- name, or a full name carrying its layer (blocks.3.hook_resid_post). Raises when the tensor was
-- not cached, saying what is.
function Cache:get(stage, layer)
  local name = stage
  local st, carried = act_names.stage_of(stage)
  if not st then fail("%s", carried) end
  if carried ~= nil then
    if layer ~= nil and layer ~= carried then fail("'%s' names layer %d, not %s", name, carried, tostring(layer)) end
    layer = carried
  end
  local held = rawget(self, st)
  if not PER_LAYER[st] then
    if layer ~= nil then fail("%s has no layer (got %s)", st, tostring(layer)) end
    if held == nil then fail("%s is not in the cache (%s)", st, holds(self)) end
    return held
  end
  if math.type(layer) ~= "integer" then fail("%s is per layer: give the 0-based layer, got %s", st, tostring(layer)) end
  local t = held and rawget(held, layer)
  if t == nil then fail("%s of layer %d is not in the cache (%s)", st, layer, holds(self)) end
  return t
end

-- cache:keys() -> the TransformerLens names of the cached tensors, in execution order (a tensor
-- of a stage TransformerLens has no hook for is named by the stage: after_logits).
function Cache:keys()
  local out = {}
  for i, e in ipairs(entries(self)) do out[i] = act_names.tl_name(e.stage, e.layer) or e.stage end
  return out
end

-- rows stacked: one [sum of rows, cols] Tensor of the given tensors in order (all cols wide).
local function vstack(list, what)
  local parts, rows, cols = {}, 0, nil
  for i, t in ipairs(list) do
    local shape = t:shape()
    if cols and shape[2] ~= cols then fail("%s: widths differ (%d and %d)", what, cols, shape[2]) end
    cols = shape[2]
    rows = rows + shape[1]
    parts[i] = t:bytes()
  end
  return core.tensor_from_bytes(table.concat(parts), rows, cols)
end
M.vstack = vstack

-- cache:stack(stage) -> Tensor [n * rows, width], layers: the stage's tensors of the n cached
-- layers one after another (block k, rows k*rows+1 .. (k+1)*rows, is layers[k+1]), and the list
-- of those layers. Per-layer stages only; every layer's tensor must have the same width.
function Cache:stack(stage)
  local st, carried = act_names.stage_of(stage)
  if not st then fail("%s", carried) end
  if not PER_LAYER[st] then fail("stack: %s has no layers to stack", st) end
  if carried then fail("stack: '%s' names one layer; stack takes the stage alone ('%s')", stage, st) end
  local held = rawget(self, st)
  if held == nil then fail("stack: %s is not in the cache (%s)", st, holds(self)) end
  local layers, list = sorted_layers(held), {}
  for i, l in ipairs(layers) do list[i] = rawget(held, l) end
  return vstack(list, "stack " .. st), layers
end

-- ---- the residual stream taken apart --------------------------------------------------------------

local function need_layer(self, layer, what)
  local n = self.n_layers
  if layer == nil then return n end
  if math.type(layer) ~= "integer" or layer < 0 or layer > n then
    fail("%s: layer %s out of range 0..%d (%d: after the last layer)", what, tostring(layer), n, n)
  end
  return layer
end

-- The residual stream entering layer l (l = n_layers: after the last one): before_layer of l, or
-- after_layer of l - 1 (the same values).
local function resid_pre(self, l, what)
  local pre, post = rawget(self, "before_layer"), rawget(self, "after_layer")
  local t = l < self.n_layers and pre and rawget(pre, l) or (l > 0 and post and rawget(post, l - 1))
  if not t then
    fail("%s needs the residual entering layer %d: cache before_layer (or after_layer of layer %d) "
      .. "(stages = { 'before_layer', 'after_layer', ... }); %s", what, l, l - 1, holds(self))
  end
  return t
end

-- cache:accumulated_resid([layer]) -> Tensor [(layer + 1) * rows, hidden], labels: the residual
-- stream entering each layer 0 .. layer (TransformerLens's accumulated_resid: "0_pre", "1_pre",
-- ...; layer = n_layers, the default, ends with the last layer's output, "final_post").
function Cache:accumulated_resid(layer)
  layer = need_layer(self, layer, "accumulated_resid")
  local list, labels = {}, {}
  for l = 0, layer do
    list[#list + 1] = resid_pre(self, l, "accumulated_resid")
    labels[#labels + 1] = l == self.n_layers and "final_post" or (l .. "_pre")
  end
  return vstack(list, "accumulated_resid"), labels
end

local function stage_tensor(self, stage, l, what)
  local held = rawget(self, stage)
  local t = held and rawget(held, l)
  if not t then fail("%s needs %s of layer %d in the cache; %s", what, stage, l, holds(self)) end
  return t
end

-- cache:decompose_resid([layer]) -> Tensor [(1 + 2 * layer) * rows, hidden], labels: the residual
-- entering `layer` (default: after the last one) as the sum of its parts — the embedding
-- ("embed": before_layer of layer 0, positions and scaling included) and each earlier layer's
-- attention and MLP outputs ("0_attn_out", "0_mlp_out", ...). Gemma 4 is refused: its layers add a
-- per-layer-embedding step and scale the whole residual, so it is no such sum.
function Cache:decompose_resid(layer)
  layer = need_layer(self, layer, "decompose_resid")
  if self.family == "gemma4" then
    fail("decompose_resid: on gemma4 the residual is not a sum of attention and MLP outputs (each layer adds a "
      .. "per-layer-embedding step and multiplies the whole residual by layer_output_scale)")
  end
  local list, labels = { resid_pre(self, 0, "decompose_resid") }, { "embed" }
  for l = 0, layer - 1 do
    list[#list + 1] = stage_tensor(self, "after_attention", l, "decompose_resid")
    labels[#labels + 1] = l .. "_attn_out"
    list[#list + 1] = stage_tensor(self, "after_mlp", l, "decompose_resid")
    labels[#labels + 1] = l .. "_mlp_out"
  end
  return vstack(list, "decompose_resid"), labels
end

-- cache:stack_head_results([layer]) -> Tensor [(layer * n_heads) * rows, hidden], labels: every
-- head of layers 0 .. layer - 1 (default: all) through its slice of the O projection, z_h W_O[:, h]^T
-- (TransformerLens's stack_head_results, "L0H0", "L0H1", ...), without the O projection's bias.
-- Gemma 4: before its post-attention norm, as attention_heads is.
function Cache:stack_head_results(layer)
  layer = need_layer(self, layer, "stack_head_results")
  local model = self.model
  if not model or model.closed then fail("stack_head_results: the model this cache came from is closed") end
  local n_heads = model.info.n_heads
  local list, labels = {}, {}
  for l = 0, layer - 1 do
    local z = stage_tensor(self, "attention_heads", l, "stack_head_results")
    local w_o = model:weight("blk." .. l .. ".attn_output") -- [hidden, n_heads * head_dim]
    for h = 0, n_heads - 1 do
      list[#list + 1] = z:head(h, n_heads):matmul_t(w_o:head(h, n_heads))
      labels[#labels + 1] = string.format("L%dH%d", l, h)
    end
  end
  if #list == 0 then fail("stack_head_results: layer 0 has no earlier heads (give a layer >= 1)") end
  return vstack(list, "stack_head_results"), labels
end

-- The last layer's output, [rows, hidden]: the residual the final norm sees.
local function final_resid(self, what)
  local post = rawget(self, "after_layer")
  local t = post and rawget(post, self.n_layers - 1)
  if not t then
    fail("%s needs the final residual: cache after_layer of layer %d; %s", what, self.n_layers - 1, holds(self))
  end
  return t
end

-- cache:apply_ln_to_stack(t [, pos]) -> Tensor: a stack [k * rows, hidden] (what accumulated_resid,
-- decompose_resid and stack_head_results return) through the final norm with the scale of the final
-- residual frozen (TransformerLens's apply_ln_to_stack: each component's share of the normed
-- residual). With pos (0-based), [k, hidden]: every component at that position, scaled as the
-- final residual at pos; without, [k * rows, hidden], each row scaled as its own position.
function Cache:apply_ln_to_stack(t, pos)
  local final = final_resid(self, "apply_ln_to_stack")
  local rows, hidden = final:shape()[1], final:shape()[2]
  local shape = t:shape()
  if shape[2] ~= hidden or shape[1] % rows ~= 0 then
    fail("apply_ln_to_stack: expected a stack [k * %d, %d] (k components of the cache's %d positions), got [%d, %d]",
      rows, hidden, rows, shape[1], shape[2])
  end
  local k = shape[1] // rows
  if pos == nil then
    local refs = {}
    for i = 1, k do refs[i] = final end
    return self.model:final_norm_frozen(t, vstack(refs, "apply_ln_to_stack"))
  end
  if math.type(pos) ~= "integer" or pos < 0 or pos >= rows then
    fail("apply_ln_to_stack: position %s out of range 0..%d (positions are 0-based)", tostring(pos), rows - 1)
  end
  local at = {}
  for i = 0, k - 1 do at[#at + 1] = t:row(i * rows + pos + 1) end
  return self.model:final_norm_frozen(vstack(at, "apply_ln_to_stack"), final:row(pos + 1))
end

-- The LM head's name: output, or token_embd when the head is tied to the embedding.
local function head_name(model)
  for _, d in ipairs(model:tensors()) do
    if d.name == "output.weight" or d.name == "output" then return "output" end
  end
  return "token_embd"
end

local function token_ids(model, tokens, what)
  if type(tokens) ~= "table" then tokens = { tokens } end
  if #tokens == 0 then fail("%s: no tokens given", what) end
  local ids = {}
  for i, t in ipairs(tokens) do
    if type(t) == "string" then t = model:to_single_token(t) end
    if math.type(t) ~= "integer" or t < 0 or t >= model.info.n_vocab then
      fail("%s: token %s is not a token id in 0..%d (or a string of one token)", what, tostring(t),
        model.info.n_vocab - 1)
    end
    ids[i] = t
  end
  return ids
end

-- cache:logit_attrs(t, tokens [, incorrect]) -> Tensor [k, #tokens]: direct logit attribution,
-- TransformerLens's logit_attrs: each row of t (normed components, e.g. apply_ln_to_stack(stack,
-- pos)) dotted with the LM head's row of each token — or, with incorrect tokens (as many), with the
-- difference of the two rows (a logit difference). tokens: ids (0-based) or one-token strings, a
-- list or one. The head's bias (none in these families) and the final logit softcap (Gemma 2 and 4;
-- Gemma 3 when its file sets one) are left out.
function Cache:logit_attrs(t, tokens, incorrect)
  local model = self.model
  if not model or model.closed then fail("logit_attrs: the model this cache came from is closed") end
  local ids = token_ids(model, tokens, "logit_attrs")
  local name = head_name(model)
  local dirs = model:weight(name, ids) -- [#ids, hidden]
  if incorrect ~= nil then
    local other = token_ids(model, incorrect, "logit_attrs")
    if #other ~= #ids then fail("logit_attrs: %d tokens and %d incorrect tokens (give as many)", #ids, #other) end
    dirs = dirs - model:weight(name, other)
  end
  return t:matmul_t(dirs)
end

-- ---- iteration, length, printing ----------------------------------------------------------------

-- cache.layers: the cached layers in order (a list, as before), and cache:layers() an iterator
-- over them: for l, stages in cache:layers() do ... stages.after_layer ... end.
local LayerList = { __name = "ember.ActivationCache.layers" }
LayerList.__call = function(list, cache)
  local i = 0
  return function()
    i = i + 1
    local l = list[i]
    if l == nil then return nil end
    local at = {}
    for _, st in ipairs(core.layer_stages) do
      local held = rawget(cache, st)
      if held then at[st] = rawget(held, l) end
    end
    return l, at
  end
end

-- cache:layers() (a method too, so help and completion list it; the field answers first)
function Cache:layers() return rawget(self, "layers")(self) end

meta.__len = function(self) return #entries(self) end

meta.__tostring = function(self)
  local lines = { string.format("ember.ActivationCache: %d tokens, %d layers, %d tensors", #self.ids,
    self.n_layers, #self) }
  for _, st in ipairs(core.stages) do
    local held = rawget(self, st)
    if held ~= nil then
      local tl = act_names.tl_name(st, 0)
      tl = tl and (PER_LAYER[st] and tl:gsub("^blocks%.0%.", "blocks.L.") or tl) or "(no TransformerLens hook)"
      if PER_LAYER[st] then
        local layers = sorted_layers(held)
        local shape = rawget(held, layers[1]) and rawget(held, layers[1]):shape()
        lines[#lines + 1] = string.format("  %-18s %s, each [%d, %d]  %s", st, range_text(layers),
          shape and shape[1] or 0, shape and shape[2] or 0, tl)
      else
        local shape = held:shape()
        lines[#lines + 1] = string.format("  %-18s [%d, %d]  %s", st, shape[1], shape[2], tl)
      end
    end
  end
  local ls = self.logits:shape()
  lines[#lines + 1] = string.format("  %-18s [%d, %d]", "logits", ls[1], ls[2])
  return table.concat(lines, "\n")
end

-- Old fields (cache.after_layer, cache.ids, ...) are plain fields; a stage that was not cached
-- reads as nil, as it always did. A TransformerLens name (cache["blocks.3.hook_resid_post"]) is
-- cache:get of it. A near miss of a method or field raises with the one meant; any other key is nil.
local FIELDS = { "ids", "stages", "layers", "logits", "model", "n_layers", "family" }
meta.__index = function(self, k)
  local method = Cache[k]
  if method ~= nil then return method end
  if type(k) ~= "string" or core.stages[k] then return nil end
  local stage, why = act_names.stage_of(k)
  if stage then return self:get(k) end
  if k:find("hook_", 1, true) or k:match("^blocks%.") then fail("%s", why) end
  local names = { table.unpack(FIELDS) }
  for name in pairs(Cache) do names[#names + 1] = name end
  for _, st in ipairs(core.stages) do names[#names + 1] = st end
  local near, d = core.internal.closest(k, names)
  if near and d <= 2 and #k >= 3 then fail("no method or field '%s' (did you mean '%s'?)", k, near) end
  return nil
end

-- new{ ids, stages, layers, model } -> an empty cache the prefill fills: M.hold stores each
-- tensor, and cache.logits is set at the end.
function M.new(opts)
  local layers = setmetatable(opts.layers, LayerList)
  local cache = { ids = opts.ids, stages = opts.stages, layers = layers, model = opts.model,
    n_layers = opts.model.info.n_layers, family = opts.model.info.family }
  for _, st in ipairs(opts.stages) do
    if PER_LAYER[st] then cache[st] = new_stage_table(st) end
  end
  return setmetatable(cache, meta)
end

-- hold(cache, stage, layer, tensor): stores one tensor (layer nil for a logits stage).
function M.hold(cache, stage, layer, tensor)
  if PER_LAYER[stage] then rawset(rawget(cache, stage), layer, tensor) else rawset(cache, stage, tensor) end
end

M.Cache = Cache
return M
