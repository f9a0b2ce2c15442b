-- ember.run.patch takes an in-memory capture as its source (capture.experiment after the run it
-- observed) under the same strict rules as an artifact on disk: the restoration criterion holds
-- (zero layer 2's MLP, patch it back from the clean capture: the clean run's logits and ids, bit
-- for bit), and an ambiguous, missing, foreign or malformed source is refused at setup. Every
-- refusal is a message of the patch's own, with no position inside lib/ember.

local capture = require("ember.run.capture")
local compose = require("ember.run.compose")
local patch = require("ember.run.patch")
local models = require("helpers.models")

local need_model = models.lazy_default()
local LAYER = 2
local TARGET = { layer = LAYER, stage = "after_mlp" }

local function run(model, exp)
  return model:generate { prompt = models.PROMPT, max_tokens = 3, temperature = 0, experiment = exp }
end

local function captured(model, stages)
  local cap = capture.experiment(assert(capture.config { stages = stages or { "after_mlp" }, layers = { LAYER } }))
  local out = run(model, cap)
  return cap, out
end

local zero = { name = "zero-mlp" }
function zero:after_mlp(ctx, v) if ctx.layer_index == LAYER then v:zero() end end

-- The error of patch.experiment(opts): a string with no lib/ember position in it.
local function refusal(opts)
  local ok, err = pcall(patch.experiment, opts)
  assert.is_false(ok, "expected a refusal")
  err = tostring(err)
  assert.is_nil(err:match("lib/ember/[%w_/]+%.lua:%d+:"), "internal position in: " .. err)
  assert.is_nil(err:match("%.lua:%d+:"), "a source position in: " .. err)
  assert.matches("^activation%-patch: ", err)
  return err
end

describe("patch.experiment with an in-memory capture", function()
  it("restores a zeroed layer bit for bit, as a patch from an artifact does", function()
    local model = need_model()
    if not model then return end
    local cap, clean = captured(model)
    assert.are.equal(4, #cap.records) -- prefill and three decodes of layer 2's after_mlp
    local broken = run(model, zero)
    assert.is_false(broken.logits:compare(clean.logits).bitwise_equal)
    local p = patch.experiment { source = cap, target = TARGET, model = model }
    local restored = run(model, compose.compose { zero, p })
    assert.is_true(restored.logits:compare(clean.logits).bitwise_equal)
    assert.are.same(clean.ids, restored.ids)
    assert.are.same({ applied = 4, prefill = 1, decode = 3, source_records = 4 }, p.stats)
    -- the patch only restores: applied to the clean run it changes nothing either
    local again = run(model, patch.experiment { source = cap, target = TARGET, model = model })
    assert.is_true(again.logits:compare(clean.logits).bitwise_equal)
  end)

  it("refuses ambiguous, missing and foreign sources as it refuses artifacts", function()
    local model = need_model()
    if not model then return end
    local cap = captured(model)
    local twice = { model = cap.model, records = { cap.records[1], cap.records[1] } }
    assert.matches("ambiguous source: records 0 and 1 of the in-memory capture are both after_mlp layer 2 prefill @0",
      refusal { source = twice, target = TARGET, model = model }, 1, true)
    local other = captured(model, { "after_attention" })
    assert.matches("no source record for after_mlp layer 2 in the in-memory capture (it holds: after_attention "
      .. "layer 2)",
      refusal { source = other, target = TARGET, model = model }, 1, true)
    local foreign = { model = { family = "qwen3" }, records = cap.records }
    assert.matches("family mismatch: source the in-memory capture was captured from a qwen3 model, this model is llama",
      refusal { source = foreign, target = TARGET, model = model }, 1, true)
    local fresh = capture.experiment(assert(capture.config { stages = { "after_mlp" } }))
    assert.matches("has not observed a run yet", refusal { source = fresh, target = TARGET, model = model }, 1, true)
  end)

  it("refuses malformed records and options with a message, never a Lua error inside", function()
    local model = need_model()
    if not model then return end
    local cap = captured(model)
    local r = cap.records[1]
    local function with(field, value)
      local copy = {}
      for k, v in pairs(r) do copy[k] = v end
      copy[field] = value
      return { model = cap.model, records = { copy } }
    end
    assert.matches("record 0: stage after_mlp needs a non-negative integer layer",
      refusal { source = with("layer", -1), target = TARGET, model = model }, 1, true)
    assert.matches("holds no owned ember.Tensor",
      refusal { source = with("tensor", 3), target = TARGET, model = model }, 1, true)
    assert.matches("its tensor is [" .. r.shape[1] .. ", " .. r.shape[2] .. "], the record says [1, ",
      refusal { source = with("shape", { 1, r.shape[2] }), target = TARGET, model = model }, 1, true)
    assert.matches("expected a table of options", refusal(nil), 1, true)
    assert.matches("model = <the loaded model> is required", refusal { source = cap, target = TARGET }, 1, true)
    assert.matches("target = { layer = L, stage = STAGE } is required",
      refusal { source = cap, model = model }, 1, true)
    assert.matches("source = <artifact directory", refusal { target = TARGET, model = model }, 1, true)
    assert.matches("source must be an artifact directory", refusal { source = 42, target = TARGET, model = model }, 1,
      true)
    assert.matches("neither an artifact's manifest nor a capture's records",
      refusal { source = {}, target = TARGET, model = model }, 1, true)
  end)
end)
