-- Per-tensor overrides at load (ember.load{override=}, --override-from/--override-tensors): a q4_0
-- model with some tensors taken from the f32 model of the same generated weights computes, bit for
-- bit on every kernel set, what the file the project's GGUF writer makes with those tensors in f32
-- computes (make-tiny-model --tensor-type); the manifest names both files and the list; bad input
-- is refused naming the tensor, regex or files.

local core = require("ember.core")
local ember = require("ember")
local H = require("helpers.artifacts")
local json = require("ember.store.json")
local fx = require("helpers.fixtures")

local SEED = 7
local IDS = { 1, 5, 9, 33, 200, 7, 71, 300 }

-- a tiny llama of the seed in dtype, with tensor_types (NAME=TYPE) -> path
local function tiny(dir, name, dtype, tensor_types, extra)
  local path = dir .. "/" .. name .. ".gguf"
  local opts = { family = "llama", dtype = dtype, seed = SEED, tensor_types = tensor_types }
  for k, v in pairs(extra or {}) do opts[k] = v end
  assert(ember.make_tiny_model(path, opts))
  return path
end

-- every row's logits of IDS, as bytes
local function logits_bytes(m)
  local s = m:session()
  local out = s:prefill(IDS, { all_logits = true }):bytes()
  s:close()
  return out
end

local function kernel_sets()
  local out = {}
  for _, k in ipairs(core.kernel_sets) do
    if k ~= "auto" then out[#out + 1] = k end
  end
  return out
end

describe("ember.load{override=}", function()
  local dir, a, b
  before_each(function()
    dir = H.tmpdir()
    a, b = tiny(dir, "a", "f32"), tiny(dir, "b", "q4_0")
  end)
  after_each(H.cleanup)

  local names = { "token_embd.weight", "blk.1.attn_v.weight", "blk.3.ffn_down.weight", "output.weight" }

  it("computes the written file's logits bit for bit, on every kernel set", function()
    local types = {}
    for i, n in ipairs(names) do types[i] = n .. "=f32" end
    local written = tiny(dir, "written", "q4_0", types)
    for _, k in ipairs(kernel_sets()) do
      local ok, want_model = pcall(ember.load, { model = written, kernels = k })
      if not ok then
        pending("kernel set " .. k .. " unavailable here: " .. tostring(want_model))
      else
        local got_model = ember.load { model = b, kernels = k, override = { from = a, tensors = names } }
        local plain = ember.load { model = b, kernels = k }
        local want, got = logits_bytes(want_model), logits_bytes(got_model)
        assert.is_true(want == got, "kernels " .. k .. ": the overridden model differs from the written file")
        assert.is_false(logits_bytes(plain) == got, "kernels " .. k .. ": the override changed nothing")
        assert.equal(want_model.info.dtype_summary, got_model.info.dtype_summary)
        for _, m in ipairs({ want_model, got_model, plain }) do m:close() end
      end
    end
  end)

  it("takes the tensors a regex matches (whole names), listed in the file's order", function()
    local m = ember.load { model = b, override = { from = a, tensors = "blk\\.[02]\\.ffn_(up|down)\\.weight" } }
    assert.are.same({ "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.2.ffn_up.weight",
      "blk.2.ffn_down.weight" }, m.info.override.tensors)
    assert.equal(a, m.info.override.from)
    local types = {}
    for _, t in ipairs(m:tensors()) do types[t.name] = t.type end
    assert.equal("f32", types["blk.2.ffn_down.weight"])
    assert.equal("q4_0", types["blk.1.ffn_down.weight"])
    m:close()
  end)

  it("the manifest records both files' sha256 and the list", function()
    local m = ember.load { model = b, override = { from = a, tensors = names } }
    local section = json.decode(json.encode(require("ember.store.manifest").model_section(m)))
    local function file_sha(path)
      local f = assert(io.open(path, "rb"))
      local data = f:read("a")
      f:close()
      return H.sha256sum(data)
    end
    assert.equal(file_sha(b), section.sha256)
    assert.equal(a, section.override.from)
    assert.equal(file_sha(a), section.override.sha256)
    local asked, in_order = {}, {}
    for _, n in ipairs(names) do asked[n] = true end
    for _, t in ipairs(m:tensors()) do
      if asked[t.name] then in_order[#in_order + 1] = t.name end
    end
    assert.are.same(in_order, section.override.tensors)
    m:close()
  end)

  it("refuses bad input naming what is wrong, before the model is built", function()
    local other = tiny(dir, "qwen", "f32", nil, { family = "qwen3" })
    local cases = {
      { { from = a, tensors = { "blk.99.ffn_down.weight" } }, "no tensor 'blk.99.ffn_down.weight' in .*b.gguf" },
      { { from = a, tensors = "zzz.*" }, "the regex 'zzz.*' matches no tensor" },
      { { from = a, tensors = "((" }, "the regex '%(%(' does not compile" },
      { { from = other, tensors = { "output.weight" } }, "'llama' model and .*qwen.gguf a 'qwen3' one" },
      { { from = dir .. "/missing.gguf", tensors = { "output.weight" } }, "missing.gguf" },
      { { from = a }, "tensors = a non%-empty list" },
      { { tensors = { "output.weight" } }, "needs from =" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(ember.load, { model = b, override = c[1] })
      assert.is_false(ok)
      assert.matches(c[2], tostring(err))
    end
  end)

  it("refuses a tensor whose shape differs, naming both files", function()
    local path, why = fx.tiny_model("--family llama --dtype f32 --seed 7 --ff 256")
    if not path then
      pending(why)
      return
    end
    local ok, err = pcall(ember.load, { model = b, override = { from = path, tensors = { "blk.0.ffn_up.weight" } } })
    assert.is_false(ok)
    assert.matches("tensor 'blk.0.ffn_up.weight' has shape %[64, 128, 1, 1%] in .*b.gguf but %[64, 256, 1, 1%] in ",
      tostring(err))
  end)

  it("--override-from / --override-tensors on the command line: the run's manifest names both files", function()
    local cli = require("helpers.cli")
    local stats, run_manifest = dir .. "/stats.json", dir .. "/run.json"
    local code, _, err = cli.ember("--model", b, "--override-from", a, "--override-tensors",
      "blk\\.1\\..*_(up|down)\\.weight", "--prompt", "hello", "--max-tokens", "2", "--activation-stats", stats,
      "--run-manifest", run_manifest)
    assert.equal(0, code, err)
    local f = assert(io.open(run_manifest, "rb"))
    local man = json.decode(f:read("a"))
    f:close()
    assert.equal(a, man.model.override.from)
    assert.are.same({ "blk.1.ffn_up.weight", "blk.1.ffn_down.weight" }, man.model.override.tensors)
    code, _, err = cli.ember("--model", b, "--override-from", a, "--prompt", "hello")
    assert.equal(2, code)
    assert.matches("%-%-override%-from and %-%-override%-tensors go together", err)
    code, _, err = cli.ember("--model", b, "--override-from", a, "--override-tensors", "blk.1.none,output.weight",
      "--prompt", "hello")
    assert.equal(1, code)
    assert.matches("no tensor 'blk.1.none'", err)
  end)
end)
