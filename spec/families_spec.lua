-- The hook contract on every family (issue: Gemma 4, GPT-2, Qwen2.5): the lifecycle order and
-- contexts, a read-only experiment leaving logits bit-identical, and zeroing after_mlp changing
-- them — on one parity fixture model per family, so each family's own forward pass is exercised.

local ember = require("ember")
local models = require("helpers.models")

local LAYER_STAGES = { "before_layer", "after_attention", "after_mlp", "after_layer" }
local TENSOR_STAGES = { "before_layer", "after_attention", "after_mlp", "after_layer", "before_logits", "after_logits" }

-- An experiment that records every call it receives, with the context fields it saw.
local function logger()
  local exp = { name = "logger", log = {} }
  local function rec(hook, ctx, view)
    local e = { hook = hook, phase = ctx.phase, start = ctx.start_position, count = ctx.input_token_count,
      seq = ctx.sequence_length, layer = ctx.layer_index }
    if ctx.token_position then e.token_position = ctx:token_position() end
    if view then e.shape = view:shape() end
    exp.log[#exp.log + 1] = e
  end
  exp.on_model_loaded = function(_, ctx) rec("on_model_loaded", ctx) end
  exp.before_prefill = function(_, ctx) rec("before_prefill", ctx) end
  for _, st in ipairs(TENSOR_STAGES) do
    exp[st] = function(_, ctx, view) rec(st, ctx, view) end
  end
  exp.on_generation_complete = function(_, ctx)
    exp.log[#exp.log + 1] = { hook = "on_generation_complete", generated = ctx.generated_token_count,
      decodes = ctx.decode_count, prompt = ctx.prompt_token_count }
  end
  return exp
end

local function hashes(out)
  local h = {}
  for i, t in ipairs(out.all_logits) do h[i] = t:sha256() end
  return h
end

for _, fc in ipairs(models.family_cases()) do
  describe("hook contract on " .. fc.family, function()
    if fc.missing then
      pending("missing fixture " .. fc.missing)
      return
    end
    local model = assert(ember.load { model = fc.model, kernels = "reference" })
    local L, H, V = model.info.n_layers, model.info.hidden_size, model.info.n_vocab
    local prompt = { 1, 5, 9, 14, 2, 7 }
    local P, N = #prompt, 3

    local function run(exp)
      return model:generate { ids = prompt, max_tokens = N, eos = false, experiment = exp, all_logits = true }
    end

    it("calls every hook in order with the right phases, positions and shapes", function()
      local exp = logger()
      run(exp)
      local log, i = exp.log, 1
      local function expect(want)
        local got = log[i]
        assert.is_not_nil(got, "missing call " .. i .. " (" .. want.hook .. ")")
        for k, v in pairs(want) do assert.are.same(v, got[k], ("call %d (%s) field %s"):format(i, want.hook, k)) end
        i = i + 1
      end
      expect { hook = "on_model_loaded" }
      expect { hook = "before_prefill", phase = "prefill", start = 0, count = P, seq = P }
      for e = 0, N do -- the prefill, then one decode evaluation per generated token
        local phase, start, count = "prefill", 0, P
        if e > 0 then phase, start, count = "decode", P + e - 1, 1 end
        for l = 0, L - 1 do
          for _, st in ipairs(LAYER_STAGES) do
            expect { hook = st, phase = phase, layer = l, start = start, count = count, seq = start + count,
              shape = { count, H } }
          end
        end
        expect { hook = "before_logits", phase = phase, start = start, seq = start + count, shape = { 1, H } }
        expect { hook = "after_logits", phase = phase, start = start, seq = start + count, shape = { 1, V } }
      end
      expect { hook = "on_generation_complete", prompt = P, generated = N, decodes = N }
      assert.are.equal(#log, i - 1)
    end)

    it("a name-only and a read-only experiment leave logits and ids bit-identical", function()
      local base = run(nil)
      local name_only = run({ name = "nothing" })
      local reader = { name = "reader" }
      for _, st in ipairs(TENSOR_STAGES) do
        reader[st] = function(_, _, v)
          assert(v:l2_norm() >= 0 and v:abs_max() >= 0)
          v:get(1, 1)
        end
      end
      local read = run(reader)
      assert.are.same(hashes(base), hashes(name_only))
      assert.are.same(hashes(base), hashes(read))
      assert.are.same(base.ids, read.ids)
      assert.is_false(read.modified)
    end)

    it("zeroing after_mlp at one layer changes the logits and marks the run modified", function()
      local base = run(nil)
      local layer = math.min(1, L - 1)
      local zero = { name = "zero" }
      function zero:after_mlp(ctx, v)
        if ctx.layer_index == layer then v:zero() end
      end
      local out = run(zero)
      assert.is_true(out.modified)
      assert.are_not.same(hashes(base)[1], hashes(out)[1])
    end)
  end)
end

describe("make-tiny-model --sequential-residual", function()
  local fx = require("helpers.fixtures")
  local q = require("ember.store.fs").shell_quote

  it("is a gptneox setting: another family is refused, naming it, and no file is written", function()
    local tool = fx.build .. "/make-tiny-model"
    if not fx.exists(tool) then return pending("missing " .. tool .. " (build the project first)") end
    local base = os.tmpname()
    os.remove(base)
    local out = base .. ".gguf"
    local p = io.popen(q(tool) .. " --family llama --dtype f32 --sequential-residual --out " .. q(out) .. " 2>&1")
    local text = p:read("a")
    local ok = p:close()
    assert.is_falsy(ok)
    assert.matches("the sequential residual is a gptneox setting", text, 1, true)
    assert.is_false(fx.exists(out))
  end)
end)
