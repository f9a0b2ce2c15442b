-- model:gradients against central finite differences of an exact float64 forward pass
-- (spec/reference/grad_reference.py: its own GGUF reader and forward of each family, written from
-- the file alone): every family's tiny model, every stage, each metric, the frozen modes (the
-- forward with the probabilities or the norms' scales held), relative error <= 1e-4 on the
-- reference path and within q8_0's tolerance on the fast path. The forward with gradients is bit
-- for bit a prefill's; the gradients are identical for 1 and 3 threads; bad input is refused by name.

local ember = require("ember")
local cjson = require("cjson")
local fx = require("helpers.fixtures")
local H = require("helpers.artifacts")

local PY = "/usr/bin/python3"
local SCRIPT = "spec/reference/grad_reference.py"
local missing_numpy = os.execute(PY .. " -c 'import numpy' >/dev/null 2>&1") ~= true
  and (PY .. " with numpy (Debian python3-numpy) is not installed: the float64 reference cannot run") or nil

-- A tiny model of the family (3 layers, f32 unless dtype says), or pending with the reason.
-- A tiny model from make-tiny-model's arguments, or pending with the reason.
local function made(args)
  local path, why = fx.tiny_model(args)
  if not path then pending(why) end
  return path
end

local function tiny(family, dtype)
  return made("--family " .. family .. " --dtype " .. (dtype or "f32") .. " --layers 3 --seed 11")
end

-- Every gradient of g under its stage name ("after_layer.2", "before_logits", "embeddings").
local function by_name(g)
  local t = {}
  for _, s in ipairs(g.stages) do
    if s == "embeddings" or s == "before_logits" or s == "after_logits" then t[s] = g:get(s)
    else for l = 0, g.n_layers - 1 do t[s .. "." .. l] = g:get(s, l) end end
  end
  return t
end

-- The finite differences of grad_reference.py for the gradients g of model `path` (ids, metric
-- table, freeze list): its JSON report.
local function reference(path, g, metric, freeze)
  local dir = H.tmpdir()
  ember.save_tensors(dir .. "/grads.safetensors", by_name(g))
  ember.save_tensors(dir .. "/logits.safetensors", { logits = g:value("after_logits") })
  local req = { model = path, ids = g.ids, metric = metric, freeze = freeze or {}, samples = 2, seed = 5,
    gradients = dir .. "/grads.safetensors", logits = dir .. "/logits.safetensors" }
  H.write(dir .. "/request.json", cjson.encode(req))
  local p = io.popen(PY .. " " .. H.shell_quote(SCRIPT) .. " " .. H.shell_quote(dir .. "/request.json") .. " 2>&1")
  local out = p:read("a")
  assert(p:close(), "grad_reference.py failed: " .. out)
  return cjson.decode(out)
end

-- Every check within tol (coordinates and a random direction; per_stage: a stage's own), and the two
-- forwards agreeing.
local function assert_close(report, tol, what, per_stage)
  assert.is_true(report.logits_rel <= 1e-4,
    string.format("%s: the float64 forward's logits differ from ember's by %.3g", what, report.logits_rel))
  local worst, where = 0, ""
  for _, c in ipairs(report.checks) do
    local r = math.max(c.coord_rel, c.dir_rel) / ((per_stage and per_stage[c.stage] or tol) / tol)
    if r > worst or r ~= r then worst, where = r, c.stage .. " " .. c.layer end
  end
  assert.is_true(#report.checks > 0, what .. ": nothing was checked")
  assert.is_true(worst <= tol, string.format("%s: relative error %.3g at %s (tolerance %g%s)", what, worst, where, tol,
    per_stage and ", scaled per stage" or ""))
end

local IDS = { 1, 17, 40, 3, 99, 250 }

-- Tiny Gemma models whose windows, softcaps and RoPE scaling bite within IDS: Gemma 2 with a 3-key
-- window and softcaps small enough to bend the scores (attention 1.5, final 4), Gemma 3 with a
-- 3-key window, a final softcap and its global layers' linear RoPE scaling.
local function bent_gemma2()
  return made("--family gemma2 --dtype f32 --layers 3 --seed 11 --window 3 --attn-softcap 1.5 --softcap 4")
end
local function bent_gemma3()
  return made("--family gemma3 --dtype f32 --layers 3 --seed 11 --window 3 --softcap 6 --rope-scale 4")
end

-- A tiny qwen3moe model with more experts and more of them used than the tool's default (4, 2).
local function wide_moe()
  return made("--family qwen3moe --dtype f32 --layers 3 --seed 11 --experts 8 --experts-used 3")
end

-- A tiny phi3 model with LongRoPE's factors (the long ones: an original context of 64 / 16 = 4
-- positions, under the 6 of IDS), a 4-key sliding window and an attention factor.
local function long_phi3()
  return made("--family phi3 --dtype f32 --layers 3 --seed 11 --rope-freqs --context 64 --window 4 "
    .. "--rope-attn-factor 1.19")
end

-- The tiny gptneox model with the sequential residual (use_parallel_residual false; the tool's
-- default is Pythia's parallel one).
local function sequential_gptneox()
  return made("--family gptneox --dtype f32 --layers 3 --seed 11 --sequential-residual")
end

describe("model:gradients against finite differences of a float64 forward", function()
  before_each(function() if missing_numpy then pending(missing_numpy) end end)
  after_each(H.cleanup)

  local cases = {
    { family = "llama", metric = "logit-diff:3,7", ref = { kind = "logit-diff", a = 3, b = 7 } },
    { family = "qwen3", metric = "logprob:11", ref = { kind = "logprob", a = 11 } },
    { family = "qwen2", metric = "logit:5", ref = { kind = "logit", a = 5 } },
    { family = "gpt2", metric = "logit-diff:3,7", ref = { kind = "logit-diff", a = 3, b = 7 } },
    { family = "olmo2", metric = "logprob:11", ref = { kind = "logprob", a = 11 } },
    { family = "gptneox", metric = "logit-diff:3,7", ref = { kind = "logit-diff", a = 3, b = 7 } },
    { family = "phi3", metric = "logit-diff:3,7", ref = { kind = "logit-diff", a = 3, b = 7 } },
    { family = "gemma2", metric = "logit-diff:3,7", ref = { kind = "logit-diff", a = 3, b = 7 } },
    { family = "gemma3", metric = "logprob:11", ref = { kind = "logprob", a = 11 } },
    { family = "qwen3moe", metric = "logit-diff:3,7", ref = { kind = "logit-diff", a = 3, b = 7 } },
    { family = "qwen3moe", model = wide_moe, label = "qwen3moe, 8 experts, 3 used (moe_router too)",
      metric = "logprob:11", ref = { kind = "logprob", a = 11 } },
    { family = "gemma2", model = bent_gemma2, label = "gemma2, 3-key window, softcaps 1.5 and 4", metric = "logprob:11",
      ref = { kind = "logprob", a = 11 } },
    { family = "gemma3", model = bent_gemma3, label = "gemma3, 3-key window, final softcap, RoPE scaling",
      metric = "logit-diff:3,7", ref = { kind = "logit-diff", a = 3, b = 7 } },
    { family = "phi3", model = long_phi3, label = "phi3, long LongRoPE factors, window, attention factor",
      metric = "logprob:11", ref = { kind = "logprob", a = 11 } },
    { family = "gptneox", model = sequential_gptneox, label = "gptneox, sequential residual", metric = "logit:5",
      ref = { kind = "logit", a = 5 } },
  }
  for _, c in ipairs(cases) do
    it((c.label or c.family) .. " (" .. c.metric .. "), every stage, reference path: relative error <= 1e-4", function()
      local path = c.model and c.model() or tiny(c.family)
      local m = ember.load { model = path, kernels = "reference" }
      local g = m:gradients { ids = IDS, metric = c.metric, values = true }
      assert_close(reference(path, g, c.ref), 1e-4, c.family)
    end)
  end

  it("gpt2, frozen attention and norm (LayerNorm's scale held): against the forward with those values held",
    function()
      local path = tiny("gpt2")
      local m = ember.load { model = path, kernels = "reference" }
      local g = m:gradients { ids = IDS, metric = "logprob:11", values = true, freeze = { "attention", "norm" } }
      assert_close(reference(path, g, { kind = "logprob", a = 11 }, { "attention", "norm" }), 1e-4, "gpt2 frozen")
    end)

  for _, fam in ipairs({ "qwen3", "olmo2", "gptneox", "phi3", "gemma2", "gemma3", "qwen3moe" }) do
  for _, freeze in ipairs({ { "attention" }, { "norm" }, { "attention", "norm" } }) do
    it(fam .. ", frozen " .. table.concat(freeze, " and ") .. ": against the forward with those values held", function()
      local path = tiny(fam)
      local m = ember.load { model = path, kernels = "reference" }
      local g = m:gradients { ids = IDS, metric = "logit-diff:3,7", values = true, freeze = freeze }
      assert_close(reference(path, g, { kind = "logit-diff", a = 3, b = 7 }, freeze), 1e-4, fam .. " frozen")
    end)
  end
  end

  for _, fam in ipairs({ "llama", "olmo2", "gptneox", "phi3", "gemma2", "gemma3", "qwen3moe" }) do
    for _, k in ipairs({ "avx2", "avx512" }) do
      it(fam .. ", q8_0 on the " .. k .. " kernels: within the weight type's tolerance (5e-2, the parity bound)",
        function()
          local path = tiny(fam, "q8_0")
          local ok, m = pcall(ember.load, { model = path, kernels = k })
          if not ok then pending("the " .. k .. " kernels do not run here: " .. tostring(m)) end
          local g = m:gradients { ids = IDS, metric = "logit-diff:3,7", values = true }
          local report = reference(path, g, { kind = "logit-diff", a = 3, b = 7 })
          report.logits_rel = 0 -- the fast path's activation quantization moves the logits; the bound is on gradients
          -- the routing weights' gradient w_i (dw_i - sum_j w_j dw_j) is a difference of terms that each
          -- carry the 2-3 % of every other stage here: measured 0.079 of its own size at worst
          assert_close(report, 5e-2, fam .. " q8_0 " .. k, { moe_router = 1e-1 })
        end)
    end
  end
end)

describe("model:gradients on the 4- to 6-bit fast paths", function()
  -- the reference path is checked against float64 above; the fast path quantizes the activations
  -- of these products (kernels.md), so it is held to the parity fixtures' bound for quantized
  -- types (tests/fixtures/parity-new: up to 0.079), measured 0.028-0.050
  for _, dtype in ipairs({ "q4_0", "q4_k", "q6_k" }) do
    it(dtype .. ": every stage within 8e-2 of the reference path's gradients", function()
      local path, why = fx.tiny_model("--family qwen3 --dtype " .. dtype
        .. " --layers 2 --hidden 256 --head-dim 64 --ff 768 --seed 3")
      if not path then pending(why) end
      local ref = ember.load { model = path, kernels = "reference" }:gradients { ids = IDS, metric = "logit-diff:3,7" }
      local fast = ember.load { model = path }:gradients { ids = IDS, metric = "logit-diff:3,7" }
      local checked = 0
      for name, t in pairs(by_name(ref)) do
        local c = t:compare(by_name(fast)[name])
        local rel = c.max_abs_diff / math.max(t:abs_max(), 1e-30)
        assert.is_true(rel <= 8e-2, string.format("%s %s: %.3g", dtype, name, rel))
        checked = checked + 1
      end
      assert.is_true(checked > 10)
    end)
  end
end)

describe("model:gradients leaves the forward pass as it is", function()
  after_each(H.cleanup)

  it("the forward's logits and values are bit for bit a prefill's, on every set this CPU runs", function()
    for _, family in ipairs({ "qwen3", "gpt2", "olmo2", "gptneox", "phi3", "gemma2", "gemma3", "qwen3moe" }) do
      local path = tiny(family, "q8_0")
      for _, k in ipairs({ "reference", "auto" }) do
        local m = ember.load { model = path, kernels = k }
        local g = m:gradients { ids = IDS, metric = "logit:5", values = true,
          stages = { "after_layer", "after_logits" } }
        local cache = m:run_with_cache { ids = IDS, stages = { "after_layer" } }
        assert.are.equal(cache.logits:bytes(), g:value("after_logits"):bytes())
        for l = 0, m.info.n_layers - 1 do
          assert.are.equal(cache.after_layer[l]:bytes(), g:value("after_layer", l):bytes())
        end
      end
    end
  end)

  it("the gradients are identical for 1 and 3 threads", function()
    local path = tiny("llama", "q8_0")
    local a = ember.load { model = path, threads = 1 }:gradients { ids = IDS, metric = "logprob:9" }
    local b = ember.load { model = path, threads = 3 }:gradients { ids = IDS, metric = "logprob:9" }
    for name, t in pairs(by_name(a)) do assert.are.equal(t:bytes(), by_name(b)[name]:bytes(), name) end
  end)
end)

describe("model:gradients refuses bad input by name", function()
  local path
  local function model()
    path = path or tiny("llama")
    return ember.load { model = path }
  end

  local function refuses(opts, pattern)
    local ok, err = pcall(function() return model():gradients(opts) end)
    assert.is_false(ok)
    assert.matches(pattern, tostring(err))
  end

  it("a metric token outside the vocabulary", function()
    refuses({ ids = IDS, metric = "logit-diff:3,99999" }, "metric token 99999 is outside the vocabulary %(0%.%.511%)")
  end)
  it("an unknown metric, and one missing its tokens", function()
    refuses({ ids = IDS, metric = "logits:3" }, "unknown metric 'logits:3'")
    refuses({ ids = IDS, metric = "logit-diff:3" }, "logit%-diff needs 2 tokens after ':'")
  end)
  it("a metric token string that is not one token; one that is gives its id's gradients", function()
    local m = model()
    local one, many = nil, nil
    for _, text in ipairs({ " qu", " s", " a", "e" }) do
      if #m:tokenize(text, { bos = false }) == 1 then one = one or text end
    end
    for _, text in ipairs({ " quick", " brown" }) do
      if #m:tokenize(text, { bos = false }) > 1 then many = many or text end
    end
    assert.truthy(one and many, "the tiny vocabulary holds a one-token and a many-token string")
    local id = m:tokenize(one, { bos = false })[1]
    local by_text = m:gradients { ids = IDS, metric = string.format("logit:%q", one) }
    local by_id = m:gradients { ids = IDS, metric = "logit:" .. id }
    assert.same({ id }, by_text.tokens)
    assert.equal(by_id.metric, by_text.metric)
    refuses({ ids = IDS, metric = string.format("logit:%q", many) }, "is %d tokens, not one")
  end)
  it("a stage with no gradient", function()
    refuses({ ids = IDS, metric = "logit:3", stages = { "sae_features" } }, "no gradient at stage 'sae_features'")
    refuses({ ids = IDS, metric = "logit:3", stages = { "after_layers" } }, "no gradient at stage 'after_layers'")
  end)
  it("an unknown frozen mode", function()
    refuses({ ids = IDS, metric = "logit:3", freeze = { "mlp" } },
      "unknown frozen mode 'mlp' %(modes: attention, norm%)")
  end)
  it("an experiment (gradients are of the model as it is)", function()
    refuses({ ids = IDS, metric = "logit:3", experiment = { name = "x" } }, "experiments are refused")
  end)
  it("moe_router on a dense model", function()
    refuses({ ids = IDS, metric = "logit:3", stages = { "moe_router" } }, "the llama family has no stage 'moe_router'")
  end)
  it("the kl metric without its reference", function()
    refuses({ ids = IDS, metric = "kl" }, "the kl metric needs reference")
  end)
end)
