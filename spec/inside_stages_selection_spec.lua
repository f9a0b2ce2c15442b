-- Selecting the inside-the-layer stages (attention_pattern, attention_heads, mlp_activation) in
-- capture and activation-stats: by name or with "all", from the engine's one list; the defaults
-- stay the residual-stream stages, so runs that name nothing record what they always did.

local cjson = require("cjson")
local ember = require("ember")
local selectors = require("ember.run.selectors")
local capture = require("ember.run.capture")
local H = require("helpers.artifacts")
local C = require("helpers.cli")
local models = require("helpers.models")

describe("inside stages in selections", function()
  it("parse by name like the residual stages; the default capture selection leaves them out", function()
    assert.are.same({ "attention_pattern", "mlp_activation", "after_logits" },
      selectors.parse_stage_list("after_logits,mlp_activation,attention_pattern"))
    assert.are.same({ "before_layer", "after_attention", "after_mlp", "after_layer", "before_logits", "after_logits" },
      assert(capture.config {}).stages)
    assert.are.same(ember.stages[1], assert(capture.config { stages = "all" }).stages[1])
    -- "all" is every stage a pass of any family calls by itself: sae_features only where an SAE is
    -- spliced in, moe_router only in the MoE families (selected by name)
    local family_only = 0
    for _, row in ipairs(ember.STAGES) do if row.families then family_only = family_only + 1 end end
    assert.are.equal(1, family_only)
    assert.are.equal(#ember.stages - #ember.sae_stages - family_only, #assert(capture.config { stages = "all" }).stages)
    assert.are.same({ "attention_heads" }, assert(capture.config { stages = "attention_heads" }).stages)
  end)

  it("patching by position, sweeps and localisation stay on the residual stream and say why", function()
    assert.are.same({ "before_layer", "after_attention", "after_mlp", "after_layer" }, selectors.RESIDUAL_LAYER_STAGES)
    assert.is_true(selectors.check_residual_layer_stage("after_mlp"))
    local ok, why = selectors.check_residual_layer_stage("attention_heads")
    assert.is_nil(ok)
    assert.are.equal("stage 'attention_heads' is inside a layer's blocks, not on the residual stream "
      .. "(before_layer|after_attention|after_mlp|after_layer)", why)
    local path = C.need_model()
    if not path then return end
    local model <close> = ember.load { model = path }
    local err = select(2, pcall(ember.sweep, { model = model, clean = "The quick brown fox jumps",
      corrupted = "The quick brown fox jumps", stages = { "mlp_activation" } }))
    assert.matches("stage 'mlp_activation' is inside a layer's blocks", tostring(err), 1, true)
  end)

  it("--activation-stats with --capture-stages records the named inside stages with their shapes", function()
    local path = C.need_model()
    if not path then return end
    local model <close> = ember.load { model = path }
    local info = model.info
    local dir = H.tmpdir()
    local N = 2
    local code, out_stats = C.ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N),
      "--activation-stats", dir .. "/stats.json", "--capture-stages", "attention_pattern,mlp_activation",
      "--run-manifest", dir .. "/run.json")
    assert.equal(0, code)
    local _, out_plain = C.ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N))
    assert.equal(out_plain, out_stats) -- observation only: the same text
    local stats = cjson.decode(H.read(dir .. "/stats.json"))
    assert.equal((1 + N) * 2 * info.n_layers, #stats.records)
    for _, r in ipairs(stats.records) do
      local rows = r.sequence_length - r.start_position
      if r.stage == "attention_pattern" then
        assert.are.same({ info.n_heads * rows, r.sequence_length }, r.shape)
      else
        assert.are.equal("mlp_activation", r.stage)
        assert.are.equal(rows, r.shape[1])
      end
    end
  end)

  it("--capture-activations with --capture-stages captures the inside stages: shapes, causal zeros, rows summing to 1",
    function()
    local path = C.need_model()
    if not path then return end
    local model <close> = ember.load { model = path }
    local info = model.info
    local dir = H.tmpdir() .. "/cap"
    local N = 2
    local code, _, err = C.ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N),
      "--capture-activations", dir, "--capture-stages", "attention_pattern,attention_heads,mlp_activation",
      "--capture-layers", "0,2")
    assert.equal(0, code, err)
    local art = require("ember.store.artifact").read(dir)
    assert.equal((1 + N) * 3 * 2, #art.records) -- evaluations x stages x layers
    local seen = {}
    for _, r in ipairs(art.records) do
      seen[r.stage] = (seen[r.stage] or 0) + 1
      assert.is_true(r.layer == 0 or r.layer == 2)
      local rows = r.phase == "prefill" and #model:tokenize(models.PROMPT) or 1
      local keys = r.start_position + rows
      if r.stage == "attention_pattern" then
        assert.are.same({ info.n_heads * rows, keys }, r.shape)
        for row = 1, r.shape[1] do
          local i = (row - 1) % rows -- query i of its head
          local sum = 0
          for c = 1, keys do
            local x = r.tensor:get(row, c)
            if c - 1 > r.start_position + i then assert.equal(0, x) end -- a later key: exactly 0
            sum = sum + x
          end
          assert.near(1, sum, 1e-5)
        end
      elseif r.stage == "attention_heads" then
        assert.are.same({ rows, info.n_heads * info.head_dim }, r.shape)
      else
        assert.equal("mlp_activation", r.stage)
        assert.equal(rows, r.shape[1])
      end
    end
    assert.are.same({ attention_pattern = 6, attention_heads = 6, mlp_activation = 6 }, seen)
  end)

  it("--capture-stages without a capture or statistics output is a usage error naming the flag", function()
    local code, out, err = C.ember("--model", "m.gguf", "--prompt", "x", "--capture-stages", "attention_heads")
    assert.equal(2, code)
    assert.equal("", out)
    assert.matches("--capture-stages needs --capture-activations DIR or --activation-stats FILE", err, 1, true)
  end)

  it("activation-stats refuses an unknown stage, naming it", function()
    local ok, err = pcall(require("ember.run.builtin").experiment, "activation_stats",
      { stages = { "attention_patern" } })
    assert.is_false(ok)
    assert.matches("unknown stage 'attention_patern'", tostring(err), 1, true)
  end)
end)
