-- Sessions run the experiment lifecycle: the first evaluation with an experiment calls its
-- on_model_loaded, every s:prefill calls before_prefill (that prefill's start and length) before
-- the tensor hooks, on_generation_complete stays generate's. Every shipped experiment
-- (scripts/experiments/*.lua, lib/ember/experiments/*.lua) runs under s:prefill/s:decode and
-- under generate, and both give the same logits for the same experiment.

local ember = require("ember")
local models = require("helpers.models")
local fx = require("helpers.fixtures")

local function list(dir)
  local p = io.popen("ls -1 " .. dir .. "/*.lua 2>/dev/null")
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

-- Arguments for each shipped experiment (a new file without an entry here fails the spec).
local ARGS = {
  ["activation_stats.lua"] = "",
  ["attention_knockout.lua"] = "layers=all keys=0",
  ["head_ablation.lua"] = "layer=1 heads=0",
  ["neuron_ablation.lua"] = "layer=1 neurons=0-3",
  ["scale_attention.lua"] = "layer=1 factor=0.5",
  ["steering_vector.lua"] = "layer=1 scale=4 dim=3",
  ["zero_layer_output.lua"] = { target = "1:mlp", notice = function() end },
  ["logit_lens.lua"] = "k=3",
  ["ablate_expert.lua"] = { targets = { { layer = 1, expert = 0 }, { layer = 1, expert = 1 } },
    notice = function() end },
  -- made once the model is known: the vector has its hidden size
  ["steer.lua"] = function(m)
    local v = {}
    for i = 1, m.info.hidden_size do v[i] = (i % 5 - 2) / 4 end
    return { layer = 1, stage = "after_mlp", vector = v, scale = 2, notice = function() end }
  end,
}
local MODIFIES = { ["attention_knockout.lua"] = true, ["head_ablation.lua"] = true, ["neuron_ablation.lua"] = true,
  ["scale_attention.lua"] = true, ["steering_vector.lua"] = true, ["zero_layer_output.lua"] = true,
  ["steer.lua"] = true, ["ablate_expert.lua"] = true }
-- The experiments of a mixture-of-experts stage run on a tiny MoE model instead (make-tiny-model's
-- arguments).
local MODEL_ARGS = { ["ablate_expert.lua"] = "--family qwen3moe --dtype f32 --layers 2 --seed 7" }

describe("the experiment lifecycle in sessions", function()
  local path = fx.need_api_model()
  if not path then return end
  local model = ember.load { model = path, kernels = "reference", threads = 1 }
  local ids = model:tokenize(models.PROMPT)

  local function tracer()
    local calls = {}
    local exp = { name = "tracer", calls = calls }
    function exp:on_model_loaded(ctx) calls[#calls + 1] = "on_model_loaded " .. ctx.kind end
    function exp:before_prefill(ctx)
      calls[#calls + 1] = string.format("before_prefill %s start=%d n=%d", ctx.phase, ctx.start_position,
        ctx.input_token_count)
    end
    function exp:before_layer(ctx) if ctx.layer_index == 0 then calls[#calls + 1] = "before_layer " .. ctx.phase end end
    function exp:after_logits(ctx) calls[#calls + 1] = "after_logits " .. ctx.phase end
    function exp:on_generation_complete() calls[#calls + 1] = "on_generation_complete" end
    return exp
  end

  it("calls on_model_loaded once per session, before_prefill before every prefill, never on_generation_complete",
    function()
    local exp = tracer()
    local s = model:session { context = 64 }
    s:prefill({ ids[1], ids[2], ids[3] }, { experiment = exp })
    s:decode(ids[4], { experiment = exp })
    s:prefill({ ids[5], ids[6] }, { experiment = exp })
    s:prefill({ ids[7] }) -- without the experiment: nothing of it runs
    assert.are.same({
      "on_model_loaded model", "before_prefill prefill start=0 n=3", "before_layer prefill", "after_logits prefill",
      "before_layer decode", "after_logits decode",
      "before_prefill prefill start=4 n=2", "before_layer prefill", "after_logits prefill",
    }, exp.calls)
    -- another session is another attachment: on_model_loaded again
    local s2 = model:session { context = 8 }
    s2:decode(ids[1], { experiment = exp })
    assert.are.same({ "on_model_loaded model", "before_layer decode", "after_logits decode" },
      { table.unpack(exp.calls, 10) })
    s:close()
    s2:close()
  end)

  it("reports a failing lifecycle hook like generate does, and calls on_model_loaded again next time", function()
    local n = 0
    local exp = { name = "flaky" }
    function exp:on_model_loaded()
      n = n + 1
      if n == 1 then error("not yet", 0) end
    end
    local s = model:session { context = 16 }
    local ok, err = pcall(s.prefill, s, { ids[1] }, { experiment = exp })
    assert.is_false(ok)
    assert.are.equal("experiment 'flaky' failed in on_model_loaded: not yet", err)
    assert.are.equal(0, s.position) -- nothing was evaluated
    s:prefill({ ids[1] }, { experiment = exp })
    s:prefill({ ids[2] }, { experiment = exp })
    assert.are.equal(2, n)
    s:close()
  end)

  it("keeps the session busy during its lifecycle hooks: re-entering it is refused", function()
    local s = model:session { context = 16 }
    local exp = { name = "reenter" }
    function exp:before_prefill() s:decode(ids[1]) end
    local ok, err = pcall(s.prefill, s, { ids[1] }, { experiment = exp })
    assert.is_false(ok)
    assert.is_truthy(err:find("experiment 'reenter' failed in before_prefill (phase=prefill): ", 1, true), err)
    assert.is_truthy(err:find("decode: the session is busy", 1, true), err)
    assert.are.equal(0, s.position)
    s:prefill({ ids[1] }) -- not busy any more
    assert.are.equal(1, s.position)
    s:close()
  end)

  local files = {}
  for _, f in ipairs(list("scripts/experiments")) do files[#files + 1] = f end
  for _, f in ipairs(list("lib/ember/experiments")) do files[#files + 1] = f end
  assert(#files >= 6, "shipped experiments not found")

  for _, file in ipairs(files) do
    local base = file:match("([^/]+)$")
    it(file .. " runs under s:prefill/s:decode and under generate, with the same logits", function()
      local model, ids = model, ids
      if MODEL_ARGS[base] then
        model = ember.load { model = assert(fx.tiny_model(MODEL_ARGS[base])), kernels = "reference", threads = 1 }
        ids = model:tokenize(models.PROMPT)
      end
      local args = ARGS[base]
      assert.is_not_nil(args, "no arguments for " .. file .. " in this spec's ARGS table")
      if type(args) == "function" then args = args(model) end
      -- factories get (args, model handle), as --experiment gives them
      local function make() return dofile(file)(args, require("ember.run.builtin").handle(model)) end
      -- the session: prefill the prompt, decode one token
      local s = model:session { context = #ids + 2 }
      local exp = make()
      local l1 = s:prefill(ids, { experiment = exp })
      local next_id = l1:top1()[1]
      local l2 = s:decode(next_id, { experiment = exp })
      s:close()
      -- generate: the same two evaluations, with a fresh instance
      local out = model:generate { ids = ids, max_tokens = 2, all_logits = true, experiment = make() }
      assert.are.equal(next_id, out.ids[1])
      assert.is_true(l1:compare(out.all_logits[1]).bitwise_equal, "prefill logits differ from generate's")
      assert.is_true(l2:compare(out.all_logits[2]).bitwise_equal, "decode logits differ from generate's")
      local plain = model:session { context = #ids + 1 }:prefill(ids)
      assert.are.equal(MODIFIES[base] == true, not l1:compare(plain).bitwise_equal, "modified or not: " .. file)
      assert.are.equal(MODIFIES[base] == true, out.modified)
      if MODEL_ARGS[base] then model:close() end
    end)
  end

  teardown(function()
    model:close()
    fx.cleanup()
  end)
end)
