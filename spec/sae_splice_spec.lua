-- SAEs spliced into a run (generate{ sae = }): an attached SAE nobody edits leaves every logit and
-- every captured activation bit-identical to the run without it, on every kernel set this CPU
-- runs; sae_features edits land as x + (decode(f_edited) - decode(f_clean)), checked bit for bit
-- against the same change made by hand at the host stage (the feature's decoder row times the
-- change); splice = "reconstruction" equals writing decode(encode(x)) by hand; a transcoder writes
-- its output stage; what does not fit the model is refused naming the field.

local ember = require("ember")
local cases = require("helpers.sae_cases")
local models = require("helpers.models")
local H = require("helpers.artifacts")

local PROMPT = "The quick brown fox"
local need_model = models.lazy_default()

-- The after_layer residuals of every layer and the run's logits, as sha256s.
local function run(model, opts)
  local seen = {}
  local cap = { name = "cap" }
  function cap:after_layer(ctx, v)
    if ctx.phase == "prefill" then seen[#seen + 1] = v:sha256() end
  end
  local list = { cap }
  if opts.experiment then list = { opts.experiment, cap } end
  local o = { prompt = PROMPT, max_tokens = 3, experiment = require("ember.run.compose").compose(list) }
  for k, v in pairs(opts) do if k ~= "experiment" then o[k] = v end end
  local out = model:generate(o)
  return out, seen
end

local function kernel_sets()
  local out = {}
  for _, k in ipairs({ "reference", "avx2", "avx512" }) do
    if k == "reference" or ember.cpu()[k] then out[#out + 1] = k end
  end
  return out
end

describe("an SAE spliced into generate", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("changes nothing when nobody edits its features (every kernel set, read-only hook too)", function()
    local path = models.default_model()
    if not path then return pending("the default tiny model is not available") end
    local e = cases.copy("saelens_standard_v6")
    for _, k in ipairs(kernel_sets()) do
      local model = ember.load { model = path, kernels = k, threads = 2 }
      local sae = ember.sae.load(e.sae, { model = model })
      local base, a = run(model, {})
      local reader = { name = "reader", seen = 0 }
      function reader:sae_features(ctx, f)
        self.seen = self.seen + 1
        assert(f:shape()[2] == sae.d_sae and f:l2_norm() > 0)
      end
      for _, opts in ipairs({ { sae = sae }, { sae = sae, experiment = reader } }) do
        local out, b = run(model, opts)
        assert.are.same(a, b, k)
        assert.are.equal(base.logits:sha256(), out.logits:sha256(), k)
        assert.are.same(base.ids, out.ids)
        assert.is_false(out.modified)
        assert.are.equal(1 + out.stats.decode_count, out.sae[1].calls)
        assert.are.equal(0, out.sae[1].changed_rows)
      end
      assert.are.equal(4, reader.seen) -- the prefill and three decodes
      sae:close()
      model:close()
    end
  end)

  it("changes nothing unedited and something edited in every family", function()
    local fx = require("helpers.fixtures")
    local e = cases.copy("gemma_scope") -- names no model: it may sit on any family's 64-wide residual
    for _, family in ipairs({ "llama", "qwen3", "qwen2", "gemma4", "gpt2" }) do
      local path, why = fx.tiny_model("--family " .. family .. " --dtype f32 --seed 3")
      if not path then return pending("make-tiny-model: " .. tostring(why)) end
      local model = ember.load { model = path, kernels = "reference", threads = 1 }
      local sae = ember.sae.load(e.sae, { model = model, hook = "blocks.2.hook_resid_post" })
      local base = run(model, {})
      local same = run(model, { sae = sae })
      assert.are.equal(base.logits:sha256(), same.logits:sha256(), family)
      local edit = { name = "edit" }
      function edit:sae_features(_, f) f:scale(0.5) end
      local edited = run(model, { sae = sae, experiment = edit })
      assert.are_not.equal(base.logits:sha256(), edited.logits:sha256(), family)
      sae:close()
      model:close()
    end
  end)

  it("adds decode(f_edited) - decode(f_clean): an ablated feature's row is subtracted, as by hand", function()
    local model = need_model()
    if not model then return end
    local e = cases.copy("saelens_standard_v6")
    local sae = ember.sae.load(e.sae, { model = model })
    local FEATURE = 5
    local ablate = { name = "ablate", ctxs = {} }
    function ablate:sae_features(ctx, f)
      self.ctxs[#self.ctxs + 1] = { layer = ctx.layer_index, sae = ctx.sae_index, stage = ctx.stage, phase = ctx.phase }
      for r = 1, f:shape()[1] do f:set(r, FEATURE + 1, 0) end
    end
    local spliced = run(model, { sae = sae, experiment = ablate })
    assert.are.same({ layer = 1, sae = 1, stage = "sae_features", phase = "prefill" }, ablate.ctxs[1])
    assert.is_true(spliced.modified)
    assert.is_true(spliced.sae[1].changed_rows > 0)
    -- by hand at after_layer 1: x += (0 - f_clean[r, FEATURE]) * W_dec[FEATURE]
    local dir = sae:direction(FEATURE)
    local by_hand = { name = "by-hand" }
    function by_hand:after_layer(ctx, v)
      if ctx.layer_index ~= 1 then return end
      local f = sae:encode(v)
      for r = 1, f:shape()[1] do
        local c = f:get(r, FEATURE + 1)
        if c ~= 0 then v:row(r):add(dir:clone():scale(-c)) end
      end
    end
    local hand = run(model, { experiment = by_hand })
    assert.are.equal(hand.logits:sha256(), spliced.logits:sha256())
    assert.are.same(hand.ids, spliced.ids)
    assert.are_not.equal(run(model, {}).logits:sha256(), spliced.logits:sha256()) -- the ablation did something
  end)

  it("writes decode(encode(x)) with splice = 'reconstruction'", function()
    local model = need_model()
    if not model then return end
    local e = cases.copy("saelens_topk_f16")
    local sae = ember.sae.load(e.sae, { model = model })
    local spliced = run(model, { sae = sae, splice = "reconstruction" })
    assert.is_true(spliced.modified)
    local by_hand = { name = "by-hand" }
    function by_hand:after_layer(ctx, v)
      if ctx.layer_index == 1 then v:copy_from(sae:decode(sae:encode(v), v)) end
    end
    local hand = run(model, { experiment = by_hand })
    assert.are.equal(hand.logits:sha256(), spliced.logits:sha256())
    local plain = run(model, {})
    assert.are_not.equal(plain.logits:sha256(), spliced.logits:sha256())
  end)

  it("reads attn.hook_z: every head (reshape_activations = hook_z) or one head's columns", function()
    local model = need_model()
    if not model then return end
    for _, c in ipairs({ { "saelens_hook_z" }, { "saelens_hook_z_head", head = 2 } }) do
      local e = cases.copy(c[1])
      local sae = ember.sae.load(e.sae, { model = model })
      local spliced = run(model, { sae = { { sae = sae, splice = "reconstruction" } } })
      local by_hand = { name = "by-hand" }
      function by_hand:attention_heads(ctx, v)
        if ctx.layer_index ~= 1 then return end
        local z = c.head and v:head(c.head) or v
        z:copy_from(sae:decode(sae:encode(z), z))
      end
      local hand = run(model, { experiment = by_hand })
      local plain = run(model, {})
      assert.are.equal(hand.logits:sha256(), spliced.logits:sha256(), c[1])
      assert.are_not.equal(plain.logits:sha256(), spliced.logits:sha256(), c[1])
      sae:close()
    end
  end)

  it("reads a transcoder's input stage and writes its output stage", function()
    local model = need_model()
    if not model then return end
    local e = cases.copy("saelens_transcoder_model")
    local tc = ember.sae.load(e.sae, { model = model })
    assert.is_true(tc.transcoder)
    local spliced = run(model, { sae = { { sae = tc, splice = "reconstruction" } } })
    local saved
    local by_hand = { name = "by-hand" }
    function by_hand:before_layer(ctx, v) if ctx.layer_index == 1 then saved = v:clone() end end
    function by_hand:after_mlp(ctx, v)
      if ctx.layer_index == 1 then v:copy_from(tc:decode(tc:encode(saved), saved)) end
    end
    local hand = run(model, { experiment = by_hand })
    assert.are.equal(hand.logits:sha256(), spliced.logits:sha256())
  end)

  it("refuses what does not fit the model, naming the field", function()
    local model = need_model()
    if not model then return end
    local e = cases.copy("gemma_scope")
    local function refusal(hook)
      local sae = ember.sae.load(e.sae, { hook = hook })
      local ok, err = pcall(model.generate, model, { prompt = PROMPT, max_tokens = 1, sae = sae })
      assert.is_false(ok)
      return tostring(err)
    end
    assert.matches("hook 'blocks.1.hook_mlp_in' has no ember stage", refusal("blocks.1.hook_mlp_in"), nil, true)
    assert.matches("is layer 9, but the model has 6 layers", refusal("blocks.9.hook_resid_post"), nil, true)
    assert.matches("mlp_activation of layer 1 has 128 columns, the SAE reads 64 (d_in)",
      refusal("blocks.1.mlp.hook_post"), nil, true)
    local z = cases.copy("saelens_standard_v6")
    cases.edit_cfg(z, function(c) c.metadata.hook_name = "blocks.1.attn.hook_z"; c.metadata.hook_head_index = 2 end)
    local ok, err = pcall(model.generate, model, { prompt = PROMPT, max_tokens = 1, sae = ember.sae.load(z.sae) })
    assert.is_false(ok)
    assert.matches("d_in = 64, but blocks.1.attn.hook_z (attention_heads of layer 1) is 16 wide", tostring(err), nil,
      true)
    cases.edit_cfg(z, function(c)
      c.metadata.hook_name = "blocks.1.hook_resid_post"
      c.metadata.model_name = "gpt2-small"
    end)
    ok, err = pcall(model.generate, model, { prompt = PROMPT, max_tokens = 1, sae = ember.sae.load(z.sae) })
    assert.is_false(ok)
    assert.matches("model_name 'gpt2-small' is a gpt2 model, but", tostring(err), nil, true)
    ok, err = pcall(model.generate, model, { prompt = PROMPT, sae = ember.sae.load(e.sae, { hook =
      "blocks.1.hook_resid_post" }), splice = "replace" })
    assert.is_false(ok)
    assert.matches("splice 'replace' of sae[1] is not one of error, reconstruction", tostring(err), nil, true)
  end)
end)
