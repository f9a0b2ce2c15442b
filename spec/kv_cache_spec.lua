-- The KV cache type (ember.load{kv_cache=}, --kv-cache): f32 stays the default, f16/bf16 give
-- logits within the f16 rounding of the f32 ones, the run manifest records the type, and compare
-- treats it as a numerics setting (runs that differ in it are never exact).

local cjson = require("cjson")
local H = require("helpers.artifacts")
local C = require("helpers.cli")

local function max_rel(a, b)
  local d, m = 0, 0
  for i = 1, #a do
    d = math.max(d, math.abs(a[i] - b[i]))
    m = math.max(m, math.abs(b[i]))
  end
  return d / m
end

describe("KV cache type", function()
  after_each(H.cleanup)

  it("is f32 unless asked; f16 and bf16 logits stay close to the f32 ones", function()
    local path = C.need_model()
    if not path then return end
    local ember = require("ember")
    local base = ember.load { model = path, threads = 2 }
    assert.equal("f32", base.info.kv_cache)
    local ids = base:tokenize("The quick brown fox jumps over the lazy dog")
    local want = base:session():prefill(ids):values()
    for _, kv in ipairs({ "f16", "bf16" }) do
      local m = ember.load { model = path, threads = 2, kv_cache = kv }
      assert.equal(kv, m.info.kv_cache)
      local rel = max_rel(m:session():prefill(ids):values(), want)
      -- bf16 keeps 8 bits of mantissa, f16 11: the rounding of every cached value shows, a little
      -- (a random-weight model attends sharply; the parity fixtures bound it properly: test_simd_parity)
      assert.is_true(rel > 0, kv .. ": the cache type made no difference at all")
      assert.is_true(rel < (kv == "f16" and 5e-2 or 2e-1), kv .. ": logits moved by " .. rel)
      m:close()
    end
    base:close()
  end)

  it("refuses an unknown type, naming the option and the flag", function()
    local path = C.need_model()
    if not path then return end
    assert.has_error(function() require("ember").load { model = path, kv_cache = "q8_0" } end,
      "bad argument #1 to 'load' (option 'kv_cache' must be f32, f16 or bf16, got 'q8_0')")
    local code, out, err = C.ember("--model", path, "--prompt", "hi", "--kv-cache", "f8")
    assert.equal(2, code)
    assert.equal("", out)
    assert.matches("--kv-cache", err, 1, true)
  end)

  it("is recorded in the run manifest and makes compare refuse exact", function()
    local path = C.need_model()
    if not path then return end
    local dir = H.tmpdir()
    local function capture(name, ...)
      local code, _, err = C.ember("--model", path, "--prompt", "hello there", "--max-tokens", "3",
        "--capture-activations", dir .. "/" .. name, "--run-manifest", dir .. "/run.json", ...)
      assert.equal(0, code, err)
      return cjson.decode(H.read(dir .. "/run.json"))
    end
    assert.equal("f32", capture("a").execution.kv_cache)
    assert.equal("f16", capture("b", "--kv-cache", "f16").execution.kv_cache)
    local compare = require("ember.analysis.compare")
    local res = compare.compare_dirs(dir .. "/a", dir .. "/b")
    assert.is_true(res.class ~= "exact" and res.class ~= "exact-semantic", res.class)
    local found
    for _, d in ipairs(res.provenance_differences) do
      if d.path == "execution.kv_cache" then found = d end
    end
    assert.is_not_nil(found)
    assert.equal("semantic", found.kind)
    -- a manifest from before the type was recorded means f32
    local old = { execution = { kernels = "avx2", threads = 2 } }
    local new = { execution = { kernels = "avx2", threads = 2, kv_cache = "f32" } }
    assert.same({}, compare.provenance_differences(old, new))
    new.execution.kv_cache = "bf16"
    assert.equal("semantic", compare.provenance_differences(old, new)[1].kind)
  end)
end)

teardown(function() require("helpers.fixtures").cleanup() end)
