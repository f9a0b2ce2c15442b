-- ember.run.act_names — the one mapping between ember's stage names and TransformerLens's hook
-- names (HookedTransformer's cache keys, utils.get_act_name; the names themselves are columns of
-- the engine's stage table): ember.act_name, the names a cache answers to, and the stage lists
-- that accept TransformerLens names. Must not know about models or tensors.

local core = require("ember.core")

local M = {}

-- One row per ember stage, in the engine's order, read from the engine's stage table (core.STAGES,
-- src/engine/stages.c, where a stage's TransformerLens names live with its other facts). tl:
-- TransformerLens's hook name, after "blocks.L." for a per-layer stage; short: get_act_name's name
-- for it (aliases: the others it takes). A stage without tl has no TransformerLens hook
-- (sae_features: SAELens names it <the hook it reads>.hook_sae_acts_post; after_logits: the
-- model's output logits).
M.TABLE = {}
for i, row in ipairs(core.STAGES) do
  M.TABLE[i] = { stage = row.name, tl = row.tl_hook, short = row.tl_short, aliases = row.tl_aliases }
end

-- TransformerLens names with no ember stage, and what ember offers instead.
M.NO_STAGE = {
  resid_mid = "before_layer + after_attention (no stage sits between the attention residual add and the MLP)",
  result = "cache:stack_head_results(layer) (each head's z through its slice of W_O)",
  q = "no stage (the queries are not exposed)", k = "no stage (the keys are not exposed)",
  v = "no stage (the values are not exposed)", rot_q = "no stage", rot_k = "no stage",
  attn_scores = "attention_pattern (after the softmax; the scores before it are not exposed)",
  pre = "no stage (mlp_activation is act(gate) * up, TransformerLens's mlp.hook_post)",
  pre_linear = "no stage", mid = "no stage", embed = "before_layer of layer 0 (the whole embedding)",
  pos_embed = "before_layer of layer 0 (embedding and positions together)", scale = "no stage",
}

local PER_LAYER = core.layer_stages
local by_stage, by_short, by_tl = {}, {}, {}
for _, row in ipairs(M.TABLE) do
  by_stage[row.stage] = row
  if row.short then by_short[row.short] = row end
  for _, a in ipairs(row.aliases or {}) do by_short[a] = row end
  if row.tl then by_tl[row.tl] = row end
end

-- Every name a stage answers to, for "did you mean" and the error's list.
local function known_names()
  local out = {}
  for _, row in ipairs(M.TABLE) do
    out[#out + 1] = row.stage
    if row.short then out[#out + 1] = row.short end
  end
  return out
end

local function unknown(name)
  local base = tostring(name):gsub("^blocks%.%d+%.", ""):gsub("^%a+%.hook_", ""):gsub("^hook_", "")
  if M.NO_STAGE[base] then
    return string.format("TransformerLens's '%s' has no ember stage: %s", tostring(name), M.NO_STAGE[base])
  end
  local best = core.internal.closest(base, known_names())
  return string.format("unknown stage '%s' (did you mean '%s'? ember stages: %s; TransformerLens names: "
    .. "resid_pre, pattern, z, attn_out, post, mlp_out, resid_post, normalized, as in blocks.3.hook_resid_post)",
    tostring(name), best, table.concat(core.stages, ", "))
end

-- stage_of(name) -> stage, layer | nil, message: the ember stage a name means, and the layer the
-- name carries (nil when it carries none). name: an ember stage (after_layer), a TransformerLens
-- short name (resid_post) or hook name without its layer (hook_resid_post, attn.hook_z), or a
-- full TransformerLens name (blocks.3.hook_resid_post, ln_final.hook_normalized).
function M.stage_of(name)
  if type(name) ~= "string" then return nil, "a stage name must be a string, got " .. type(name) end
  local row = by_stage[name] or by_short[name] or by_tl[name]
  if row then return row.stage, nil end
  local layer, rest = name:match("^blocks%.(%d+)%.(.+)$")
  row = rest and by_tl[rest]
  if row and PER_LAYER[row.stage] then return row.stage, math.tointeger(tonumber(layer)) end
  return nil, unknown(name)
end

-- stage(name) -> stage | nil, message: as stage_of, for a list of stages (stages = { ... }): a
-- name that carries a layer is refused, the layers being chosen apart.
function M.stage(name)
  local stage, layer = M.stage_of(name)
  if not stage then return nil, layer end
  if layer then
    return nil, string.format("'%s' names layer %d: name the stage alone ('%s') and choose layers apart", name, layer,
      stage)
  end
  return stage
end

-- act_name(name [, layer]) -> the TransformerLens hook name, as utils.get_act_name gives it:
-- act_name("resid_post", 3) and act_name("after_layer", 3) are "blocks.3.hook_resid_post",
-- act_name("normalized") is "ln_final.hook_normalized". A per-layer stage needs its layer; the
-- logits stages take none. Raises naming the problem.
function M.act_name(name, layer)
  local stage, carried = M.stage_of(name)
  if not stage then error("act_name: " .. carried, 2) end
  if carried and layer ~= nil and layer ~= carried then
    error(string.format("act_name: '%s' names layer %d, not %s", name, carried, tostring(layer)), 2)
  end
  layer = layer == nil and carried or layer
  local row = by_stage[stage]
  if not row.tl then error("act_name: " .. stage .. " has no TransformerLens hook (the model's output logits)", 2) end
  if not PER_LAYER[stage] then
    if layer ~= nil then error("act_name: " .. stage .. " has no layer (got " .. tostring(layer) .. ")", 2) end
    return row.tl
  end
  if math.type(layer) ~= "integer" or layer < 0 then
    error(string.format("act_name: %s is per layer: give its 0-based layer (act_name('%s', 3)), got %s", stage,
      row.short, tostring(layer)), 2)
  end
  return string.format("blocks.%d.%s", layer, row.tl)
end

-- tl_name(stage, layer) -> the TransformerLens name of a cached tensor, or nil when the stage has
-- none (after_logits); the name save_tensors writes a cache under.
function M.tl_name(stage, layer)
  local row = by_stage[stage]
  if not (row and row.tl) then return nil end
  if PER_LAYER[stage] then return string.format("blocks.%d.%s", layer, row.tl) end
  return row.tl
end

return M
