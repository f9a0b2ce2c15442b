-- moe_spec.lua — the mixture-of-experts stages on tiny qwen3moe models: moe_router's view (the router
-- logits, [rows, n_experts]); the routing the engine makes of it (ctx:expert at mlp_activation)
-- against the softmax and top-k computed here from that view; forcing and banning an expert through
-- the view; mlp_activation's slots; --ablate-expert; a router hook refused on a dense model.

local ember = require("ember")
local fx = require("helpers.fixtures")
local H = require("helpers.cli")

local ARGS = "--family qwen3moe --dtype f32 --seed 5 --layers 2 --experts 6 --experts-used 2 --expert-ff 16"
local E, K, F = 6, 2, 16
local IDS = { 2, 17, 250, 31, 402, 77, 5 }

-- The routing of one router row as qwen3moe defines it: softmax over every expert, the K most
-- probable (a tie: the lower index), their probabilities over their sum.
local function expected_route(logits)
  local max = -math.huge
  for _, x in ipairs(logits) do max = math.max(max, x) end
  local p, total = {}, 0
  for e, x in ipairs(logits) do
    p[e] = math.exp(x - max)
    total = total + p[e]
  end
  local order = {}
  for e = 1, #logits do order[e] = e end
  table.sort(order, function(a, b) return p[a] > p[b] or (p[a] == p[b] and a < b) end)
  local ids, w, sum = {}, {}, 0
  for j = 1, K do
    ids[j], w[j] = order[j] - 1, p[order[j]] / total
    sum = sum + w[j]
  end
  for j = 1, K do w[j] = w[j] / sum end
  return ids, w
end

describe("mixture of experts (qwen3moe)", function()
  local path, why = fx.tiny_model(ARGS)
  if not path then
    pending(why)
    return
  end
  local model
  before_each(function() model = model or ember.load { model = path, kernels = "reference", threads = 1 } end)

  -- a prefill with `edit` applied to the router view of layer 1, returning each row's choice and
  -- the last row's logits
  local function routed(edit)
    local choices, checked = {}, 0
    local exp = { name = "routing" }
    local router = {}
    function exp:moe_router(ctx, v)
      assert.are.same({ ctx.input_token_count, E }, v:shape())
      assert.is_nil(ctx.n_experts_used) -- the choice is made after this hook
      if edit and ctx.layer_index == 1 then edit(v) end
      router[ctx.layer_index] = v:clone()
    end
    function exp:mlp_activation(ctx, v)
      assert.are.same({ ctx.input_token_count, K * F }, v:shape())
      assert.equal(K, ctx.n_experts_used)
      for row = 1, ctx.input_token_count do
        local want_ids, want_w = expected_route(router[ctx.layer_index]:row(row):values())
        local got, total = {}, 0
        for slot = 1, K do
          local e, w = ctx:expert(row, slot)
          assert.equal(want_ids[slot], e, string.format("layer %d row %d slot %d", ctx.layer_index, row, slot))
          assert.is_true(math.abs(want_w[slot] - w) < 1e-5, "weight of slot " .. slot)
          got[slot], total = e, total + w
        end
        assert.is_true(math.abs(total - 1) < 1e-5)
        if ctx.layer_index == 1 then choices[row] = got end
        checked = checked + 1
      end
    end
    local s <close> = model:session { context = 16 }
    local logits = s:prefill(IDS, { experiment = exp })
    assert.equal(2 * #IDS, checked)
    return choices, logits
  end

  it("routes each row to the top k of the softmax of its router logits, weights summing to 1", function()
    routed(nil)
  end)

  it("banning an expert through moe_router (-inf) routes around it and changes the output", function()
    local before, base = routed(nil)
    local banned = before[#IDS][1] -- the last row's first choice
    local after, logits = routed(function(v)
      for r = 1, v:shape()[1] do v:set(r, banned + 1, -math.huge) end
    end)
    for row = 1, #IDS do
      for slot = 1, K do assert.are_not.equal(banned, after[row][slot]) end
    end
    assert.are_not.equal(base:sha256(), logits:sha256())
  end)

  it("banning all experts but one gives every row that one at weight 1 (the other slots weigh 0)", function()
    local kept = 4
    local after = routed(function(v) -- routed() checks ctx:expert against the softmax of the edited view
      for r = 1, v:shape()[1] do
        for e = 0, E - 1 do
          if e ~= kept then v:set(r, e + 1, -math.huge) end
        end
      end
    end)
    for row = 1, #IDS do assert.equal(kept, after[row][1]) end
  end)

  it("banning every expert of a row is refused, naming the layer and the row", function()
    local s <close> = model:session { context = 16 }
    local ok, err = pcall(s.prefill, s, IDS, { experiment = { name = "ban-all", moe_router = function(_, ctx, v)
      if ctx.layer_index == 1 then for e = 1, E do v:set(3, e, -math.huge) end end
    end } })
    assert.is_false(ok)
    assert.matches("moe_router of layer 1: token row 2 (0-based) bans all 6 experts", tostring(err), 1, true)
  end)

  it("a banned expert's -inf is not what the non-finite check reports: it finds the NaN written later", function()
    local s <close> = model:session { context = 16 }
    local ok, err = pcall(s.prefill, s, IDS, { experiment = { name = "ban-then-nan",
      moe_router = function(_, ctx, v) if ctx.layer_index == 0 then v:set(1, 1, -math.huge) end end,
      after_attention = function(_, ctx, v) if ctx.layer_index == 1 then v:set(#IDS, 3, 0 / 0) end end } })
    assert.is_false(ok)
    assert.matches("first non-finite value at after_attention of layer 1 (0-based token row 6, column 2",
      tostring(err), 1, true)
  end)

  it("forcing an expert through moe_router makes it every row's first choice", function()
    local forced = 3
    local after = routed(function(v)
      for r = 1, v:shape()[1] do v:set(r, forced + 1, 50) end
    end)
    for row = 1, #IDS do assert.equal(forced, after[row][1]) end
  end)

  it("zeroing one slot of mlp_activation removes that expert's contribution only from its row", function()
    local s1 <close> = model:session { context = 16 }
    local base = s1:prefill(IDS)
    local s2 <close> = model:session { context = 16 }
    local zeroed = s2:prefill(IDS, { experiment = { name = "slot", mlp_activation = function(_, ctx, v)
      if ctx.layer_index == 1 then for c = 1, F do v:set(ctx.input_token_count, c, 0) end end
    end } })
    assert.are_not.equal(base:sha256(), zeroed:sha256())
  end)

  it("a moe_router hook on a dense model is refused, naming the stage", function()
    local dense = fx.tiny_model("--family qwen3 --dtype f32 --layers 2")
    local m = ember.load { model = dense, kernels = "reference", threads = 1 }
    local ok, err = pcall(m.generate, m, { ids = IDS, max_tokens = 1,
      experiment = { name = "router", moe_router = function() end } })
    m:close()
    assert.is_false(ok)
    assert.matches("'moe_router', a stage only qwen3moe models have (this model is qwen3)", tostring(err), 1, true)
  end)

  it("--ablate-expert L:E bans the expert in prefill and decode and says so; a dense model is refused", function()
    local code, out = H.ember("--model", path, "--prompt", "the cat sat", "--max-tokens", "4")
    assert.equal(0, code)
    local code2, out2, err2 = H.ember("--model", path, "--prompt", "the cat sat", "--max-tokens", "4",
      "--ablate-expert", "1:0", "--ablate-expert", "1:1", "--ablate-expert", "0:2")
    assert.equal(0, code2, err2)
    assert.matches("MODIFIED by ablate%-expert 1:0,1:1,0:2", err2)
    assert.matches("(prefill 2, decode ", err2, 1, true) -- layers 0 and 1 of the one prefill
    assert.are_not.equal(out, out2)
    local code3, _, err3 = H.ember("--model", fx.tiny_model("--family qwen3 --dtype f32 --layers 2"),
      "--prompt", "the cat", "--max-tokens", "1", "--ablate-expert", "0:1")
    assert.are_not.equal(0, code3)
    assert.matches("not a mixture-of-experts model", err3, 1, true)
  end)
end)
