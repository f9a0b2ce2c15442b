-- A misspelt hook would attach silently and never run: every field of an experiment table whose
-- name is a near miss of a hook (case, '_', a plural, up to two edits) is refused when the
-- experiment is attached, with the hook it misspells. The misspellings are made here from the
-- engine's own hook list (ember.hooks), so every stage, the ones inside a layer and any added
-- later, is covered. A leading '_' marks a helper, which is never taken for a hook.

local ember = require("ember")
local compose = require("ember.run.compose")
local models = require("helpers.models")

local need_model = models.lazy_default()

local error_of = require("helpers.errors").error_of

local function title_case(s)
  return (s:gsub("^%l", string.upper):gsub("_(%l)", function(c) return "_" .. c:upper() end))
end

-- Misspellings of hook h: case, underscores, plural or singular, one deletion, one substitution,
-- two letters swapped, an underscore lost together with a typo.
local function misspellings(h)
  local out = {
    h:upper(), title_case(h), h:gsub("_", ""), h .. "s", h:sub(1, 2) .. h:sub(4),
    h:sub(1, 4) .. "x" .. h:sub(6), h:sub(1, 1) .. h:sub(3, 3) .. h:sub(2, 2) .. h:sub(4),
    h:gsub("_", "", 1):sub(1, -2),
  }
  if h:sub(-1) == "s" then out[#out + 1] = h:sub(1, -2) end
  return out
end

local function fn() end

describe("misspelt hook names", function()
  it("are refused for every hook, with the hook they misspell", function()
    local missed = {}
    for _, h in ipairs(ember.hooks) do
      for _, typo in ipairs(misspellings(h)) do
        if not ember.hooks[typo] then
          local ok, err = pcall(ember.check_experiment, { name = "t", [typo] = fn })
          local want = "defines '" .. typo .. "', which is not a hook (did you mean '" .. h .. "'?)"
          if ok or not tostring(err):find(want, 1, true) then
            missed[#missed + 1] = typo .. " -> " .. (ok and "accepted" or tostring(err))
          end
        end
      end
    end
    assert.are.same({}, missed)
  end)

  it("stop a generation before it starts (the misspellings of the report)", function()
    local model = need_model()
    if not model then return end
    local cases = { mlp_activations = "mlp_activation", attention_head = "attention_heads",
      afterlayer = "after_layer", Attention_Pattern = "attention_pattern" }
    for typo, hook in pairs(cases) do
      local ran = false
      local exp = { name = "typo", [typo] = function() ran = true end }
      local msg = error_of(model.generate, model, { prompt = models.PROMPT, max_tokens = 1, experiment = exp })
      assert.are.equal("generate: experiment 'typo' defines '" .. typo .. "', which is not a hook (did you mean '"
        .. hook .. "'?); a helper's name starts with '_'", msg)
      assert.is_false(ran)
      local s <close> = model:session { context = 8 }
      assert.matches("did you mean '" .. hook .. "'", error_of(s.prefill, s, { 1, 2 }, { experiment = exp }))
    end
  end)

  it("are refused in data fields, inherited methods and members of a composition too", function()
    assert.matches("did you mean 'after_layer'",
      error_of(ember.check_experiment, { name = "t", after_layers = { 1, 2 } }))
    local class = { AfterMlp = fn }
    class.__index = class
    assert.matches("did you mean 'after_mlp'", error_of(ember.check_experiment, setmetatable({ name = "t" }, class)))
    assert.matches("did you mean 'attention_heads'",
      error_of(compose.compose, { { name = "a", after_mlp = fn }, { name = "b", attentionheads = fn } }))
  end)

  it("leave helpers (a leading '_') and names far from every hook alone", function()
    local exp = { name = "helpers", _after_layer = fn, _attention_heads = fn, __index = {}, _ = fn,
      summarize = fn, record = fn, layers = { 1 }, heads = { 0, 3 }, after_mlp = fn, stats = {} }
    local hooks = ember.check_experiment(exp)
    assert.are.same({ "after_mlp" }, (function()
      local ks = {}
      for k in pairs(hooks) do ks[#ks + 1] = k end
      return ks
    end)())
  end)

  it("still refuse any callable named like a hook (before_*, after_*, on_*), however far", function()
    assert.matches("did you mean", error_of(ember.check_experiment, { name = "t", after_everything = fn }))
    assert.has_no.errors(function() ember.check_experiment({ name = "t", after_everything = 3 }) end)
  end)
end)

-- TransformerLens users name hooks as TransformerLens does (hook_resid_post, resid_post); a
-- method so named would attach silently and never run. The names are the engine's stage table's
-- (ember.STAGES), so every stage with a TransformerLens hook is covered; the expected stage of the
-- report's cases is written out by hand.
describe("TransformerLens names as hook methods", function()
  it("are refused for every stage that has one, naming the ember hook to define", function()
    local missed, n = {}, 0
    for _, row in ipairs(ember.STAGES) do
      if row.tl_hook then
        local names = { row.tl_short, row.tl_hook, table.unpack(row.tl_aliases) }
        if row.in_layer then names[#names + 1] = "blocks.3." .. row.tl_hook end
        for _, tl in ipairs(names) do
          n = n + 1
          local ok, msg = pcall(ember.check_experiment, { name = "t", [tl] = fn })
          msg = ok and "accepted" or tostring(msg)
          local want = "defines '" .. tl .. "', TransformerLens's name for "
          if not (msg:find(want, 1, true) and msg:find("define " .. row.name, 1, true)) then
            missed[#missed + 1] = tl .. " -> " .. tostring(msg)
          end
        end
      end
    end
    assert.are.same({}, missed)
    assert.is_true(n >= 20, "only " .. n .. " names tried")
  end)

  it("stop a generation before it starts, and leave data fields of those names alone", function()
    assert.are.equal("check_experiment: experiment 't' defines 'blocks.3.hook_resid_post', TransformerLens's name "
      .. "for layer 3's 'after_layer': hooks take ember's stage names (define after_layer and test "
      .. "ctx.layer_index == 3); a helper's name starts with '_'",
      error_of(ember.check_experiment, { name = "t", ["blocks.3.hook_resid_post"] = fn }))
    assert.matches("'z', TransformerLens's name for the hook 'attention_heads'",
      error_of(ember.check_experiment, { name = "t", z = fn }))
    assert.has_no.errors(function()
      ember.check_experiment { name = "t", z = 3, pattern = "%d+", post = { 1 }, _resid_post = fn }
    end)
    local model = need_model()
    if not model then return end
    local ran = false
    local exp = { name = "tl", resid_post = function() ran = true end }
    assert.matches("generate: experiment 'tl' defines 'resid_post', TransformerLens's name for the hook "
      .. "'after_layer'", error_of(model.generate, model, { prompt = models.PROMPT, max_tokens = 1, experiment = exp }))
    local s <close> = model:session { context = 8 }
    assert.matches("define after_layer", error_of(s.prefill, s, { 1, 2 }, { experiment = exp }))
    assert.is_false(ran)
  end)
end)
