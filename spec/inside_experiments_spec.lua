-- The example experiments on the stages inside a layer (scripts/experiments/head_ablation.lua,
-- attention_knockout.lua, neuron_ablation.lua), each checked by an observer composed after it and
-- against consequences known without ember: a zeroed input of a bias-free projection gives exactly
-- zero, the first query sees only key 0, and untouched columns keep the plain run's bytes.

local ember = require("ember")
local compose = require("ember.run.compose")
local models = require("helpers.models")

local function factory(file) return dofile("scripts/experiments/" .. file) end

local model
local need_default = models.lazy_default()
local function need_model()
  model = need_default()
  return model ~= nil
end

-- The default tiny model is a llama: no bias on the O and down projections.
local GEN = { prompt = models.PROMPT, max_tokens = 3, temperature = 0 }
local function gen(exp) return models.generate(model, GEN, exp) end

-- An observer keeping clones of the given stages at one layer (every evaluation, in order).
local function observer(layer, stages)
  local exp = { name = "observer", seen = {} }
  for _, st in ipairs(stages) do
    exp.seen[st] = {}
    exp[st] = function(self, ctx, v)
      if ctx.layer_index == layer then table.insert(self.seen[st], v:clone()) end
    end
  end
  return exp
end

local function all_zero(t)
  for _, x in ipairs(t:values()) do
    if x ~= 0 then return false end
  end
  return true
end

-- Columns [c0, c1] (1-based) of every row of t: zero (want_zero) or equal to u's.
local function columns(t, u, c0, c1, want_zero)
  local rows, cols = t:shape()[1], t:shape()[2]
  for r = 1, rows do
    for c = 1, cols do
      local inside = c >= c0 and c <= c1
      if inside and want_zero then
        if t:get(r, c) ~= 0 then return false, string.format("row %d col %d is %.9g, not 0", r, c, t:get(r, c)) end
      elseif not inside and t:get(r, c) ~= u:get(r, c) then
        return false, string.format("row %d col %d changed: %.9g vs %.9g", r, c, t:get(r, c), u:get(r, c))
      end
    end
  end
  return true
end

describe("head_ablation.lua", function()
  it("zeroes exactly one head's columns of attention_heads at its layer, in every evaluation", function()
    if not need_model() then return end
    local H = model.info.n_heads
    local plain, edited = observer(1, { "attention_heads" }), observer(1, { "attention_heads" })
    local out0 = gen(plain)
    local exp = factory("head_ablation.lua")("layer=1 heads=0")
    local out1 = gen(compose.compose({ exp, edited }))
    assert.are.equal(1 + #out1.ids, exp.stats.ablated)
    local hd = plain.seen.attention_heads[1]:shape()[2] // H
    -- the prefill's other heads are untouched (nothing before layer 1's heads changed)
    assert.is_true(columns(edited.seen.attention_heads[1], plain.seen.attention_heads[1], 1, hd, true))
    for k, t in ipairs(edited.seen.attention_heads) do
      local ok, msg = columns(t, t, 1, hd, true)
      assert.is_true(ok, "evaluation " .. k .. ": " .. tostring(msg))
    end
    assert.is_true(out1.modified)
    assert.are_not.equal(out0.logits:sha256(), out1.logits:sha256())
  end)

  it("heads=all leaves the layer's attention contribution exactly zero (the O projection has no bias)", function()
    if not need_model() then return end
    local obs = observer(2, { "after_attention" })
    gen(compose.compose({ factory("head_ablation.lua")({ layer = "2", heads = "all" }), obs }))
    assert.is_true(#obs.seen.after_attention > 1)
    for _, t in ipairs(obs.seen.after_attention) do assert.is_true(all_zero(t)) end
  end)

  it("takes a list after '=' from the command line (heads=0,3): the same run as zeroing those heads by hand",
    function()
      local C = require("helpers.cli")
      local path = C.need_model()
      if not need_model() then return end
      local H = model.info.n_heads
      local hand = { name = "by-hand" }
      function hand:attention_heads(ctx, z)
        if ctx.layer_index ~= 1 then return end
        local hd = z:shape()[2] // H
        for _, h in ipairs({ 0, 3 }) do
          for r = 1, z:shape()[1] do for c = h * hd + 1, (h + 1) * hd do z:set(r, c, 0) end end
        end
      end
      local want = gen(hand)
      local code, _, err = C.ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", "3",
        "--experiment", "scripts/experiments/head_ablation.lua", "--experiment-args", "layer=1 heads=0,3")
      assert.equal(0, code, err)
      assert.matches("head-ablation", err, 1, true) -- the run names the experiment that modified it
      local got = gen(factory("head_ablation.lua")(require("ember.run.builtin").args("layer=1 heads=0,3")))
      assert.equal(want.logits:sha256(), got.logits:sha256())
      assert.same(want.ids, got.ids)
    end)

  it("refuses a layer outside the model, naming it", function()
    if not need_model() then return end
    local ok, err = pcall(gen, factory("head_ablation.lua")("layer=99 heads=0"))
    assert.is_false(ok)
    assert.matches("head-ablation: layer 99 is out of range", tostring(err), 1, true)
  end)
end)

describe("attention_knockout.lua", function()
  it("zeroes key 0 for every head; the first query, which sees only key 0, then mixes nothing", function()
    if not need_model() then return end
    local stages = { "attention_pattern", "attention_heads" }
    local plain, edited = observer(0, stages), observer(0, stages)
    local out0 = gen(plain)
    local exp = factory("attention_knockout.lua")("layers=0 keys=0")
    local out1 = gen(compose.compose({ exp, edited }))
    assert.are.equal(1 + #out1.ids, exp.stats.knocked)
    for k, p in ipairs(edited.seen.attention_pattern) do
      local ok, msg = columns(p, plain.seen.attention_pattern[k], 1, 1, true)
      if k == 1 then assert.is_true(ok, tostring(msg)) end -- later evaluations follow the edited prefill
      local rows = p:shape()[1]
      for r = 1, rows do assert.are.equal(0, p:get(r, 1)) end
    end
    local z = edited.seen.attention_heads[1]
    for c = 1, z:shape()[2] do assert.are.equal(0, z:get(1, c)) end -- query 0: nothing left to mix
    assert.are_not.equal(out0.logits:sha256(), out1.logits:sha256())
  end)

  it("keys=all at a layer leaves its attention contribution exactly zero", function()
    if not need_model() then return end
    local obs = observer(1, { "after_attention" })
    gen(compose.compose({ factory("attention_knockout.lua")("layers=1 keys=all"), obs }))
    for _, t in ipairs(obs.seen.after_attention) do assert.is_true(all_zero(t)) end
  end)
end)

describe("neuron_ablation.lua", function()
  it("zeroes exactly the chosen columns of mlp_activation at its layer", function()
    if not need_model() then return end
    local L = model.info.n_layers - 1
    local plain, edited = observer(L, { "mlp_activation" }), observer(L, { "mlp_activation" })
    local out0 = gen(plain)
    local exp = factory("neuron_ablation.lua")({ layer = tostring(L), neurons = "0-9" })
    local out1 = gen(compose.compose({ exp, edited }))
    assert.are.equal(1 + #out1.ids, exp.stats.ablated)
    assert.is_true(columns(edited.seen.mlp_activation[1], plain.seen.mlp_activation[1], 1, 10, true))
    assert.are_not.equal(out0.logits:sha256(), out1.logits:sha256())
  end)

  it("neurons=all leaves the layer's MLP contribution exactly zero (the down projection has no bias)", function()
    if not need_model() then return end
    local obs = observer(0, { "after_mlp" })
    gen(compose.compose({ factory("neuron_ablation.lua")("layer=0 neurons=all"), obs }))
    for _, t in ipairs(obs.seen.after_mlp) do assert.is_true(all_zero(t)) end
  end)
end)

describe("views of the attention stages", function()
  it("carry their head layout: v:head(h) takes head h's rows of the pattern, its columns of the heads", function()
    if not need_model() then return end
    local H = model.info.n_heads
    local got = {}
    local exp = {
      name = "heads-of-views",
      attention_pattern = function(_, ctx, p)
        if ctx.layer_index ~= 1 then return end
        local rows = ctx.input_token_count
        local h1 = p:head(1)
        got.pattern = { shape = h1:shape(), first = h1:get(1, 1), want_first = p:get(rows + 1, 1),
          last = h1:get(rows, ctx.sequence_length), want_last = p:get(2 * rows, ctx.sequence_length) }
      end,
      attention_heads = function(_, ctx, z)
        if ctx.layer_index ~= 1 then return end
        local hd = z:shape()[2] // H
        local c = z:head(H - 1)
        got.heads = { shape = c:shape(), v = c:get(2, hd), want = z:get(2, H * hd), rows = z:shape()[1], hd = hd }
      end,
    }
    local s <close> = model:session { context = 16 }
    s:prefill({ 3, 4, 5, 6, 7 }, { experiment = exp })
    assert.are.same({ 5, 5 }, got.pattern.shape)
    assert.are.equal(got.pattern.want_first, got.pattern.first)
    assert.are.equal(got.pattern.want_last, got.pattern.last)
    assert.are.same({ got.heads.rows, got.heads.hd }, got.heads.shape)
    assert.are.equal(got.heads.want, got.heads.v)
  end)
end)
