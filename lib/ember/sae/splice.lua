-- ember.sae.splice — where an SAE sits in a loaded model and the engine sites that splice it into
-- a run: its TransformerLens hook (and a transcoder's output hook) resolved to an ember stage,
-- layer and columns, checked against the model (width, layer, the family the cfg names), and
-- the generate/run_with_cache option `sae =` turned into core.sae_sites. Must not run a model.

local core = require("ember.core")
local act_names = require("ember.run.act_names")

local M = {}

-- The ember stages an SAE can sit on; its TransformerLens hook name ("blocks.L.hook_resid_post",
-- "ln_final.hook_normalized") is read through the one name table (ember.run.act_names).
M.SITE_STAGES = { "before_layer", "after_layer", "after_attention", "after_mlp", "attention_heads", "mlp_activation",
  "before_logits" }
local SITE = {}
for _, stage in ipairs(M.SITE_STAGES) do SITE[stage] = true end

M.SPLICES = { "error", "reconstruction" }

local function fail(sae, msg, ...) error(string.format("sae %s: " .. msg, sae.path, ...), 0) end

local function known_hooks()
  local names = {}
  for _, stage in ipairs(M.SITE_STAGES) do
    names[#names + 1] = core.layer_stages[stage] and act_names.tl_name(stage, 0):gsub("^blocks%.0%.", "blocks.L.")
      or act_names.tl_name(stage)
  end
  table.sort(names)
  return table.concat(names, ", ")
end

-- hook_site(sae, hook, head, info) -> { stage, layer, col0, width, sliced }: the columns of the
-- stage's view the hook's activation is (a head of attention_heads when head is given).
local function hook_site(sae, hook, head, info)
  local stage, layer = act_names.stage_of(hook)
  -- a full TransformerLens name: with its layer for a per-layer stage, none for the others
  local per_layer = stage and core.layer_stages[stage]
  local full = stage and SITE[stage] and (per_layer and layer ~= nil or not per_layer and layer == nil)
    and hook == act_names.tl_name(stage, layer)
  if not full then fail(sae, "hook '%s' has no ember stage (ember reads %s)", hook, known_hooks()) end
  layer = layer or -1
  if layer >= info.n_layers then
    fail(sae, "hook '%s' is layer %d, but the model has %d layers (0-%d)", hook, layer, info.n_layers,
      info.n_layers - 1)
  end
  local site = { stage = stage, layer = layer, col0 = 0, hook = hook }
  if stage == "attention_heads" then
    site.width = info.n_heads * info.head_dim
    if head ~= nil then
      if math.type(head) ~= "integer" or head < 0 or head >= info.n_heads then
        fail(sae, "hook_head_index %s is not a head of the model (0-%d)", tostring(head), info.n_heads - 1)
      end
      site.col0, site.width, site.sliced = head * info.head_dim, info.head_dim, true
    end
  elseif stage ~= "mlp_activation" then -- (the MLP's width is checked by the engine on first use)
    site.width = info.hidden_size
  end
  return site
end

-- The family a cfg's model_name names ("gpt2-small" -> gpt2), or nil when it says nothing ember
-- can tell; gemma generations are told apart (Gemma Scope is Gemma 2).
local NAME_FAMILIES = {
  { "qwen3", "qwen3" }, { "qwen2", "qwen2" }, { "qwen1%.5", "qwen2" }, { "gemma%-?2", "gemma2" },
  { "gemma%-?3", "gemma3" }, { "gemma%-?4", "gemma4" }, { "llama", "llama" }, { "gpt%-?2", "gpt2" },
  { "pythia", "gpt_neox" }, { "gpt%-neo", "gpt_neo" },
}
local function family_of_name(name)
  if type(name) ~= "string" then return nil end
  local n = name:lower()
  for _, p in ipairs(NAME_FAMILIES) do
    if n:find(p[1]) then return p[2] end
  end
  return nil
end

-- check(sae, model) -> the input site and the output site (the same table for an SAE), after
-- checking that the SAE fits the model: d_in (and d_out) against the stage's width, the layers,
-- and the family its metadata names.
function M.check(sae, model)
  local info = model.info
  local named = family_of_name(sae.model_name)
  if named and named ~= info.family then
    fail(sae, "its metadata's model_name '%s' is a %s model, but %s is %s", sae.model_name, named,
      tostring(info.path or "the model"), info.family)
  end
  local site = hook_site(sae, sae.hook, sae.hook_head_index, info)
  if site.width and site.width ~= sae.d_in then
    fail(sae, "d_in = %d, but %s (%s of layer %d) is %d wide", sae.d_in, sae.hook, site.stage, site.layer,
      site.width)
  end
  local out = site
  if sae.transcoder then
    out = hook_site(sae, sae.hook_out, nil, info)
    if out.width and out.width ~= sae.d_out then
      fail(sae, "d_out = %d, but %s (%s of layer %d) is %d wide", sae.d_out, sae.hook_out, out.stage, out.layer,
        out.width)
    end
  end
  return site, out
end

-- whether v is an SAE object of ember.sae, known by its class's name: ember.sae requires this module,
-- so requiring it back would close a require cycle (tests/check_requires.lua)
local function is_sae(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__name") == "ember.sae.SAE"
end

-- The entries of the `sae =` option: an SAE, a list of SAEs, or entries { sae = SAE, splice = }.
local function entries(opt, splice, fname)
  local list = {}
  if is_sae(opt) then
    list[1] = { sae = opt }
  elseif type(opt) == "table" and opt.sae ~= nil then
    list[1] = opt
  elseif type(opt) == "table" and #opt > 0 then
    for i, e in ipairs(opt) do
      if is_sae(e) then list[i] = { sae = e }
      elseif type(e) == "table" and is_sae(e.sae) then list[i] = e
      else error(string.format("bad argument to '%s' (sae[%d] is not an SAE (ember.sae.load))", fname, i), 0) end
    end
  else
    error(string.format("bad argument to '%s' (sae must be an SAE (ember.sae.load), a list of them, or "
      .. "{ sae =, splice = } entries; got %s)", fname, type(opt)), 0)
  end
  for i, e in ipairs(list) do
    e.splice = e.splice or splice or "error"
    if e.splice ~= "error" and e.splice ~= "reconstruction" then
      error(string.format("bad argument to '%s' (splice '%s' of sae[%d] is not one of error, reconstruction)", fname,
        tostring(e.splice), i), 0)
    end
  end
  return list
end

-- sites(opt, model, splice, fname) -> { sites = ember.SAESites, list = { { sae, splice, site, out } } }
-- for the option `sae =` of generate and run_with_cache (splice: their `splice =`, the default of
-- every entry).
function M.sites(opt, model, splice, fname)
  local list = entries(opt, splice, fname)
  local specs = {}
  for i, e in ipairs(list) do
    local site, out = M.check(e.sae, model)
    e.site, e.out = site, out
    specs[i] = { sae = e.sae.handle, stage = site.stage, layer = site.layer, col0 = site.col0,
      sliced = site.sliced or false, stage_out = out.stage, layer_out = out.layer, col0_out = out.col0,
      sliced_out = out.sliced or false, splice = e.splice }
  end
  return { sites = core.sae_sites(specs), list = list }
end

-- report(s) -> per site { hook, hook_out, splice, calls, changed_rows }: what the run's splices did.
function M.report(s)
  local out = {}
  for i, e in ipairs(s.list) do
    local calls, changed = s.sites:counts(i)
    out[i] = { hook = e.sae.hook, hook_out = e.sae.transcoder and e.sae.hook_out or nil, splice = e.splice,
      calls = calls, changed_rows = changed }
  end
  return out
end

return M
