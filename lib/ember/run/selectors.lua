-- ember.run.selectors — LPeg grammars for everything a user types: flags, numbers, `4:mlp`, layer and
-- position ranges, stage and phase filters, key=value experiment arguments.
-- Must not know about models or files: callers check ranges against a loaded model.
--
-- Every parse_* function returns the value, or nil and a message that says what was expected;
-- callers prefix the flag or file name. Grammars are anchored at both ends so that trailing junk
-- ("4:mlpx", "3,") is an error and never silently ignored.

local lpeg = require("lpeg")
local core = require("ember.core")
local act_names = require("ember.run.act_names")
local P, R, S, C, Ct = lpeg.P, lpeg.R, lpeg.S, lpeg.C, lpeg.Ct

local M = {}

-- The tensor stages in execution order (SPEC §4.1) and those that belong to a layer: the
-- engine's list (ember_stage_name), exported by the core; copied so callers may not alter it.
local function list_of(names)
  local t = {}
  for i, n in ipairs(names) do t[i] = n end
  return t
end
M.STAGES = list_of(core.stages)
M.LAYER_STAGES = list_of(core.layer_stages)
-- The stages inside a layer's attention or MLP block (attention_pattern, ...; the engine says which),
-- those only an SAE splice calls (sae_features), and the residual-stream stages, the rest: what
-- capture and activation-stats select by default.
M.INSIDE_STAGES = list_of(core.inside_stages)
M.SAE_STAGES = list_of(core.sae_stages)
M.RESIDUAL_STAGES, M.RESIDUAL_LAYER_STAGES = {}, {}
local function residual(n) return not core.inside_stages[n] and not core.sae_stages[n] end
for _, n in ipairs(M.STAGES) do
  if residual(n) then M.RESIDUAL_STAGES[#M.RESIDUAL_STAGES + 1] = n end
end
for _, n in ipairs(M.LAYER_STAGES) do
  if residual(n) then M.RESIDUAL_LAYER_STAGES[#M.RESIDUAL_LAYER_STAGES + 1] = n end
end
-- The stages only some families have (moe_router: the MoE families'), selected by name only.
M.FAMILY_STAGES = {}
for _, row in ipairs(core.STAGES) do
  if row.families then M.FAMILY_STAGES[row.name] = true end
end
-- Every stage a pass of any family calls by itself (STAGES without the SAE's and the family ones):
-- what "all stages" selects.
M.PASS_STAGES = {}
for _, n in ipairs(M.STAGES) do
  if not core.sae_stages[n] and not M.FAMILY_STAGES[n] then M.PASS_STAGES[#M.PASS_STAGES + 1] = n end
end
-- STAGES without the family ones: every stage any model may be hooked at.
M.ALL_FAMILY_STAGES = {}
for _, n in ipairs(M.STAGES) do
  if not M.FAMILY_STAGES[n] then M.ALL_FAMILY_STAGES[#M.ALL_FAMILY_STAGES + 1] = n end
end
M.PHASES = { "prefill", "decode" }
-- zero-layer-output's short names: the attention or MLP contribution, or the finished layer.
M.ZERO_STAGES = { attention = "after_attention", mlp = "after_mlp", layer = "after_layer" }

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end
M.STAGE_SET = set_of(M.STAGES)
M.LAYER_STAGE_SET = set_of(M.LAYER_STAGES)
M.INSIDE_STAGE_SET = set_of(M.INSIDE_STAGES)
M.RESIDUAL_LAYER_STAGE_SET = set_of(M.RESIDUAL_LAYER_STAGES)

-- check_residual_layer_stage(s) -> true, or nil and why s is not a per-layer stage of the residual
-- stream (what patching by position and cross-model localisation work on: one row per token,
-- hidden_size wide).
function M.check_residual_layer_stage(s)
  if M.RESIDUAL_LAYER_STAGE_SET[s] then return true end
  local list = table.concat(M.RESIDUAL_LAYER_STAGES, "|")
  if M.INSIDE_STAGE_SET[s] then
    return nil, string.format("stage '%s' is inside a layer's blocks, not on the residual stream (%s)", s, list)
  end
  return nil, string.format("stage '%s' is not a per-layer stage (%s)", tostring(s), list)
end

-- stage_name(s) -> the ember stage s names, or nil and why: an ember stage, or a TransformerLens
-- name without a layer (resid_post, hook_resid_post, attn.hook_z; ember.run.act_names), so a
-- TransformerLens user's names work wherever a stage is named.
function M.stage_name(s)
  if M.STAGE_SET[s] then return s end
  return act_names.stage(s)
end

local digit = R("09")
local space = S(" \t") ^ 0
local ident = (R("az", "AZ") + P("_")) * (R("az", "AZ", "09") + S("_-")) ^ 0

-- Non-negative decimal integer; leading zeros allowed ("007"), signs and blanks are not.
local uint_text = digit ^ 1
local int_text = P("-") ^ -1 * uint_text
local float_text = P("-") ^ -1 * (digit ^ 1 * (P(".") * digit ^ 0) ^ -1 + P(".") * digit ^ 1)
  * (S("eE") * S("+-") ^ -1 * digit ^ 1) ^ -1

local function to_integer(s)
  local n = math.tointeger(tonumber(s))
  -- tonumber turns 20-digit strings into floats; refuse rather than wrap or round
  if n == nil or #s:gsub("^-?0*", "") > 18 then return nil end
  return n
end

local function whole(patt) return patt * -1 end

local uint_patt = whole(C(uint_text))
local int_patt = whole(C(int_text))
local float_patt = whole(C(float_text))

function M.parse_uint(s)
  local m = type(s) == "string" and uint_patt:match(s)
  local n = m and to_integer(m)
  if not n then return nil, "expected a non-negative integer, got '" .. tostring(s) .. "'" end
  return n
end

function M.parse_int(s)
  local m = type(s) == "string" and int_patt:match(s)
  local n = m and to_integer(m)
  if not n then return nil, "expected an integer, got '" .. tostring(s) .. "'" end
  return n
end

function M.parse_float(s)
  local m = type(s) == "string" and float_patt:match(s)
  local x = m and tonumber(m)
  if not x or x ~= x or x == math.huge or x == -math.huge then
    return nil, "expected a finite number, got '" .. tostring(s) .. "'"
  end
  return x + 0.0
end

-- ---- flags ---------------------------------------------------------------------------------------

-- `--name` or `--name=value`; names are lower-case words joined by '-'.
local flag_name = R("az", "09") ^ 1 * (P("-") * R("az", "09") ^ 1) ^ 0
local flag_patt = whole(P("--") * C(flag_name) * (P("=") * C(P(1) ^ 0)) ^ -1)
local flaglike = P("-") * (P(1) ^ 1)

-- parse_flag(token) -> name, value|nil for a flag; nil if the token is not flag-shaped at all;
-- false, message if it starts with '-' but is malformed ("-x", "--Bad_Flag").
function M.parse_flag(token)
  local name, value = flag_patt:match(token)
  if name then return name, value end
  if token ~= "-" and flaglike:match(token) and not float_patt:match(token) then
    return false, "malformed flag '" .. token .. "' (flags look like --name or --name=value)"
  end
  return nil
end

-- ---- layer:stage ---------------------------------------------------------------------------------

-- a stage name: ember's, or TransformerLens's with dots (attn.hook_z)
local stage_ident = ident * (P(".") * ident) ^ 0
local layer_stage_patt = whole(C(uint_text) * P(":") * C(stage_ident))

-- parse_layer_stage(s, "zero" | "patch") -> { layer = n, stage = "after_mlp", short = "mlp" }
--   zero:  STAGE is attention | mlp | layer (zero-layer-output, SPEC §5)
--   patch: STAGE is one of the four per-layer stage names, or the short names above
function M.parse_layer_stage(s, kind)
  local form = kind == "zero" and "LAYER:STAGE with STAGE attention|mlp|layer"
    or "LAYER:STAGE with STAGE before_layer|after_attention|after_mlp|after_layer (or attention|mlp|layer)"
  if type(s) ~= "string" then return nil, "expected " .. form end
  local layer_s, stage = layer_stage_patt:match(s)
  if not layer_s then return nil, "expected " .. form .. ", got '" .. s .. "'" end
  local layer = to_integer(layer_s)
  if not layer then return nil, "layer '" .. layer_s .. "' is out of range" end
  local full = M.ZERO_STAGES[stage]
  if kind ~= "zero" and not full then
    local named = M.stage_name(stage)
    if M.LAYER_STAGE_SET[named] then full = named end
  end
  if not full then
    return nil, "unknown stage '" .. stage .. "' in '" .. s .. "' (expected " .. form .. ")"
  end
  local short
  for k, v in pairs(M.ZERO_STAGES) do if v == full then short = k end end
  return { layer = layer, stage = full, short = short }
end

-- parse_layer_expert(s) -> { layer = L, expert = E } from "L:E" (both 0-based, --ablate-expert).
local layer_expert_patt = whole(C(uint_text) * P(":") * C(uint_text))
function M.parse_layer_expert(s)
  local l, e = layer_expert_patt:match(type(s) == "string" and s or "")
  l, e = l and to_integer(l), e and to_integer(e)
  if not l or not e then return nil, "expected LAYER:EXPERT (two integers from 0), got '" .. tostring(s) .. "'" end
  return { layer = l, expert = e }
end

-- ---- steering ------------------------------------------------------------------------------------

-- split_scale(s) -> text, scale: "TEXT:SCALE" when what follows the last ':' is a number (the
-- scale), else s and 1.0. So a path may hold ':' as long as its last part is not a number.
local function split_scale(s)
  local text, num = s:match("^(.+):([^:]*)$")
  if text then
    local x = M.parse_float(num)
    if x ~= nil then return text, x end
  end
  return s, 1.0
end

-- parse_steer(s) -> { layers = "all" | {n...}, stage = full name, source = "FILE", scale = x } from
-- --steer's L:STAGE:FILE[:SCALE]. L is a layer list (3, 2-4, 0,5, all); STAGE a per-layer stage
-- name (TransformerLens's too: resid_post) or attention|mlp|layer; attention_pattern is refused
-- (its width changes every token).
function M.parse_steer(s)
  local form = "L:STAGE:FILE[:SCALE] (e.g. 3:after_layer:v.npy:4)"
  if type(s) ~= "string" then return nil, "expected " .. form end
  local layers_s, stage, rest = s:match("^([^:]*):([^:]*):(.+)$")
  if not layers_s then return nil, "expected " .. form .. ", got '" .. s .. "'" end
  local layers, lerr = M.parse_index_list(layers_s, "layer")
  if not layers then return nil, "layers: " .. lerr end
  local full = M.ZERO_STAGES[stage] or M.stage_name(stage) or stage
  if full == "attention_pattern" then
    return nil, "attention_pattern cannot be steered (its width is the sequence length, which grows with every "
      .. "token); steer attention_heads, or knock keys out with scripts/experiments/attention_knockout.lua"
  end
  if not M.LAYER_STAGE_SET[full] then
    return nil, string.format("unknown stage '%s' in '%s' (expected %s, or attention|mlp|layer)", stage, s,
      table.concat(M.LAYER_STAGES, "|"))
  end
  local source, scale = split_scale(rest)
  return { layers = layers, stage = full, source = source, scale = scale }
end

-- parse_sae_steer(s) -> { sae = DIR, feature = n, scale = x } from DIR:FEATURE:SCALE (DIR may hold
-- ':'; FEATURE is 0-based).
function M.parse_sae_steer(s)
  local form = "DIR:FEATURE:SCALE (e.g. saes/blocks.6.hook_resid_post:1234:8)"
  if type(s) ~= "string" then return nil, "expected " .. form end
  local dir, feature, scale_s = s:match("^(.+):(%d+):([^:]+)$")
  if not dir then return nil, "expected " .. form .. ", got '" .. s .. "'" end
  local scale, err = M.parse_float(scale_s)
  if scale == nil then return nil, "scale: " .. err end
  return { sae = dir, feature = math.tointeger(tonumber(feature)), scale = scale }
end

-- parse_control_vector(s) -> { path = "FILE.gguf", scale = x } from FILE.gguf[:SCALE].
function M.parse_control_vector(s)
  if type(s) ~= "string" or s == "" then return nil, "expected FILE.gguf[:SCALE]" end
  local path, scale = split_scale(s)
  return { path = path, scale = scale }
end

-- ---- lists and ranges ----------------------------------------------------------------------------

-- "all" | item ("," item)* with item = N | N-M (inclusive); blanks around items are allowed.
local range_item = Ct(C(uint_text) * (P("-") * C(uint_text)) ^ -1)
local range_list = whole(space * (C(P("all")) + Ct(range_item * (space * P(",") * space * range_item) ^ 0)) * space)

-- parse_index_list(s, what) -> "all" | sorted list of unique integers
function M.parse_index_list(s, what)
  what = what or "index"
  local form = "expected 'all' or a list of " .. what .. " numbers like 0,2,4-6"
  if type(s) ~= "string" then return nil, form end
  local m = range_list:match(s)
  if m == nil then return nil, form .. ", got '" .. s .. "'" end
  if m == "all" then return "all" end
  local seen, out = {}, {}
  for _, item in ipairs(m) do
    local lo, hi = to_integer(item[1]), to_integer(item[2] or item[1])
    if not lo or not hi then return nil, what .. " out of range in '" .. s .. "'" end
    if lo > hi then return nil, string.format("empty range %d-%d in '%s'", lo, hi, s) end
    if hi - lo > 1000000 then return nil, "range too large in '" .. s .. "'" end
    -- the whole list is bounded too: many large ranges must not build a huge table
    if #out + (hi - lo) > 1000000 then return nil, "more than 1000000 " .. what .. " numbers in '" .. s .. "'" end
    for i = lo, hi do
      if not seen[i] then seen[i] = true; out[#out + 1] = i end
    end
  end
  table.sort(out)
  return out
end

local name_list = whole(space * Ct(C(stage_ident) * (space * P(",") * space * C(stage_ident)) ^ 0) * space)

-- parse_stage_list(s) -> "all" | list of stage names in execution order
function M.parse_stage_list(s)
  local form = "expected 'all' or a comma-separated list of " .. table.concat(M.STAGES, "|")
  if type(s) ~= "string" then return nil, form end
  local names = name_list:match(s)
  if not names then return nil, form .. ", got '" .. s .. "'" end
  if #names == 1 and names[1] == "all" then return "all" end
  local chosen = {}
  for _, n in ipairs(names) do
    local stage, why = M.stage_name(n)
    if not stage then return nil, why end
    chosen[stage] = true
  end
  local out = {}
  for _, n in ipairs(M.STAGES) do if chosen[n] then out[#out + 1] = n end end
  return out
end

-- parse_phase(s) -> "prefill" | "decode" | "all"
function M.parse_phase(s)
  if s == "prefill" or s == "decode" or s == "all" then return s end
  return nil, "expected prefill|decode|all, got '" .. tostring(s) .. "'"
end

-- parse_choice(s, list, what) -> s if it is one of list
function M.parse_choice(s, list, what)
  for _, v in ipairs(list) do if s == v then return s end end
  return nil, string.format("unknown %s '%s' (expected %s)", what or "value", tostring(s), table.concat(list, "|"))
end

-- ---- key=value arguments -------------------------------------------------------------------------

-- "layer=3 scale=0.5,vector=v.f32 heads=0,3" -> { layer = "3", scale = "0.5", vector = "v.f32",
-- heads = "0,3" }. Values run to the next blank, or to a comma that starts the next pair
-- (`,key=`); a comma followed by anything else belongs to the value, so lists need no quotes.
-- Quote with '...' to keep blanks inside a value.
local kv_value_comma = P(",") * -(ident * P("=")) * #(P(1) - S(" \t,"))
local kv_value = P("'") * C((P(1) - P("'")) ^ 0) * P("'") + C(((P(1) - S(" \t,")) + kv_value_comma) ^ 1)
local kv_pair = Ct(C(ident) * P("=") * kv_value)
local kv_sep = (space * P(",") * space) + S(" \t") ^ 1
local kv_list = whole(space * Ct((kv_pair * (kv_sep * kv_pair) ^ 0) ^ -1) * space)

function M.parse_kv(s)
  if s == nil or s == "" then return {} end
  local pairs_ = kv_list:match(s)
  if not pairs_ then
    return nil, "expected key=value pairs separated by blanks or commas (a list is one value: heads=0,3; quote "
      .. "a value holding blanks: name='a b'), got '" .. s .. "'"
  end
  local out = {}
  for _, p in ipairs(pairs_) do
    if out[p[1]] ~= nil then return nil, "key '" .. p[1] .. "' given twice in '" .. s .. "'" end
    out[p[1]] = p[2]
  end
  return out
end

-- ---- compare classes -----------------------------------------------------------------------------

-- Strictest first (SPEC §6.3); kept here because the CLI parses --require with it.
M.CLASSES = { "exact", "exact-semantic", "output-equivalent", "top1-equivalent", "failed" }

function M.parse_class(s)
  return M.parse_choice(s, M.CLASSES, "comparison class")
end

return M
