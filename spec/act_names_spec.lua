-- ember.act_name and the one table between ember's stages and TransformerLens's hook names
-- (ember.run.act_names): the names utils.get_act_name gives (written out here by hand), every
-- ember stage in the table, and TransformerLens names accepted wherever a stage is named.

local ember = require("ember")
local act_names = require("ember.run.act_names")
local capture = require("ember.run.capture")
local selectors = require("ember.run.selectors")
local models = require("helpers.models")

local need_model = models.lazy_default()

local error_of = require("helpers.errors").error_of
local H = require("helpers.artifacts")

teardown(function() H.cleanup() end)

describe("ember.act_name", function()
  it("gives TransformerLens's names (utils.get_act_name) for its short names and for ember's stages", function()
    local want = {
      { "resid_pre", 0, "blocks.0.hook_resid_pre" }, { "resid_post", 3, "blocks.3.hook_resid_post" },
      { "attn_out", 1, "blocks.1.hook_attn_out" }, { "mlp_out", 2, "blocks.2.hook_mlp_out" },
      { "pattern", 4, "blocks.4.attn.hook_pattern" }, { "attn", 4, "blocks.4.attn.hook_pattern" },
      { "z", 5, "blocks.5.attn.hook_z" }, { "post", 6, "blocks.6.mlp.hook_post" },
      { "mlp_post", 6, "blocks.6.mlp.hook_post" }, { "normalized", nil, "ln_final.hook_normalized" },
      { "after_layer", 3, "blocks.3.hook_resid_post" }, { "before_layer", 0, "blocks.0.hook_resid_pre" },
      { "attention_heads", 2, "blocks.2.attn.hook_z" }, { "before_logits", nil, "ln_final.hook_normalized" },
      { "blocks.7.hook_resid_post", nil, "blocks.7.hook_resid_post" }, { "hook_mlp_out", 1, "blocks.1.hook_mlp_out" },
    }
    for _, w in ipairs(want) do assert.are.equal(w[3], ember.act_name(w[1], w[2]), w[1]) end
  end)

  it("maps back to the ember stage and layer, for every stage with a TransformerLens hook", function()
    for _, stage in ipairs(ember.stages) do
      local name = act_names.tl_name(stage, 2)
      if name then
        local st, layer = ember.stage_of(name)
        assert.are.equal(stage, st)
        assert.are.equal(ember.layer_stages[stage] and 2 or nil, layer)
        assert.are.equal(name, ember.act_name(stage, ember.layer_stages[stage] and 2 or nil))
      end
    end
    assert.are.same({ "after_layer" }, { ember.stage_of("resid_post") })
  end)

  it("has a row for every ember stage (a new stage must be given one)", function()
    local rows = {}
    for _, row in ipairs(act_names.TABLE) do rows[row.stage] = true end
    for _, stage in ipairs(ember.stages) do assert.is_true(rows[stage] == true, stage .. " has no row") end
    assert.are.equal(#ember.stages, #act_names.TABLE)
  end)

  it("refuses what has no answer, saying why", function()
    assert.matches("after_layer is per layer: give its 0%-based layer", error_of(ember.act_name, "resid_post"))
    assert.matches("before_logits has no layer", error_of(ember.act_name, "normalized", 3))
    assert.matches("after_logits has no TransformerLens hook", error_of(ember.act_name, "after_logits"))
    assert.matches("'resid_mid' has no ember stage: before_layer %+ after_attention",
      error_of(ember.act_name, "resid_mid", 1))
    assert.matches("'result' has no ember stage: cache:stack_head_results", error_of(ember.act_name, "result", 1))
    assert.matches("unknown stage 'resid_psot' %(did you mean 'resid_post'%?",
      error_of(ember.act_name, "resid_psot", 1))
    assert.matches("names layer 7, not 2", error_of(ember.act_name, "blocks.7.hook_resid_post", 2))
  end)
end)

describe("TransformerLens names where a stage is named", function()
  it("work in stage lists: run_with_cache, capture, the command line's lists and LAYER:STAGE", function()
    assert.are.same({ "before_layer", "attention_pattern", "after_layer" },
      selectors.parse_stage_list("resid_post, attn.hook_pattern,hook_resid_pre"))
    assert.are.equal("after_layer", selectors.parse_layer_stage("2:resid_post", "patch").stage)
    assert.are.equal("attention_heads", selectors.parse_layer_stage("2:attn.hook_z", "patch").stage)
    local cfg = assert(capture.config { stages = { "mlp_out", "z" } })
    assert.are.same({ "after_mlp", "attention_heads" }, cfg.stages) -- a list keeps its order
    assert.matches("names layer 2", select(2, capture.config { stages = { "blocks.2.hook_resid_post" } }))
    local model = need_model()
    if not model then return end
    local c = model:run_with_cache { ids = { 1, 2, 3 }, stages = { "resid_post", "attn.hook_z" }, layers = { 1 } }
    assert.are.same({ "attention_heads", "after_layer" }, c.stages)
    assert.is_truthy(c.after_layer[1] and c.attention_heads[1])
    assert.matches("run_with_cache: 'blocks.2.hook_resid_post' names layer 2",
      error_of(model.run_with_cache, model, { ids = { 1 }, stages = { "blocks.2.hook_resid_post" } }))
  end)

  it("steer and patch at resid_post act exactly as at after_layer", function()
    local model = need_model()
    if not model then return end
    local v = ember.tensor(1, model.info.hidden_size)
    for c = 1, model.info.hidden_size do v:set(1, c, (c % 5) - 2) end
    local function logits(exp)
      local s <close> = model:session { context = 8 }
      return s:prefill({ 1, 2, 3, 4 }, { experiment = exp })
    end
    local steer = ember.experiments.steer
    local a = logits(steer { layer = 1, stage = "resid_post", vector = v, scale = 2 })
    local b = logits(steer { layer = 1, stage = "after_layer", vector = v, scale = 2 })
    assert.is_true(a:compare(b).bitwise_equal)
    assert.is_false(a:compare(logits(nil)).bitwise_equal)
    local stats = ember.experiments.activation_stats { stages = { "resid_post" } }
    logits(stats)
    assert.are.equal("after_layer", stats.records[1].stage)
  end)
  it("work in --steer and in a sweep's stages, which then act exactly as with ember's names", function()
    assert.are.equal("after_layer", selectors.parse_steer("3:resid_post:v.npy").stage)
    assert.are.equal("attention_heads", selectors.parse_steer("1-2:z:v.npy:2").stage)
    local model = need_model()
    if not model then return end
    local function sweep(stage, name)
      return ember.sweep { model = model, clean = { 1, 2, 3 }, corrupted = { 4, 5, 6 }, metric = "kl",
        stages = { stage }, layers = { 0 }, positions = { 1 }, out = H.tmpdir() .. "/" .. name, checkpoint_seconds = 0 }
    end
    local a, b = sweep("resid_post", "tl"), sweep("after_layer", "ember")
    assert.are.equal("after_layer", a.cells[1].stage)
    assert.are.equal(b.cells[1].value, a.cells[1].value)
    assert.is_true(a.cells[1].value > 0)
    assert.matches("sweep: stages: unknown stage 'resid_psot'", error_of(sweep, "resid_psot", "bad"), 1, true)
  end)
end)
