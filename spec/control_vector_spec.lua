-- `ember control-vector` (lib/ember/analysis/cvector.lua, tools/control_vector_write.c): the file is
-- llama.cpp's cvector-generator layout, read here by the spec's own GGUF reader; its directions
-- equal a float64 numpy computation (spec/reference/cvector_reference.py) from hidden states a
-- hand-written hook records on prompts padded here; `--control-vector` reads it back and steers.

local cjson = require("cjson")
local ember = require("ember")
local fs = require("ember.store.fs")
local fx = require("helpers.fixtures")
local gguf = require("helpers.gguf")
local C = require("helpers.cli")
local read = require("helpers.files").read

local PY = "/usr/bin/python3"
local SCRIPT = "spec/reference/cvector_reference.py"
local MODEL_ARGS = "--family llama --dtype f32 --layers 4 --seed 7"
local POSITIVE = { "I love this, it is wonderful", "What a happy day", "Great" }
local NEGATIVE = { "I hate this, it is awful", "What a sad and gloomy day", "Terrible news" }

local function numpy_missing()
  local ok = os.execute(PY .. " -c 'import numpy' >/dev/null 2>&1")
  return ok ~= true and (PY .. " with numpy (Debian python3-numpy) is not installed: the reference cannot run")
    or nil
end

local write = require("helpers.artifacts").write

local function jsonl(path, prompts)
  local lines = {}
  for i, p in ipairs(prompts) do lines[i] = cjson.encode({ prompt = p }) end
  write(path, table.concat(lines, "\n") .. "\n")
end

describe("ember control-vector", function()
  local path, model, work
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    if path then model = ember.load { model = path, threads = 1 } end
    work = fs.make_temp_dir("ember-cvector-spec")
    if path then
      jsonl(work .. "/pos.jsonl", POSITIVE)
      jsonl(work .. "/neg.jsonl", NEGATIVE)
    end
  end)
  teardown(function()
    if model then model:close() end
    if work then fs.remove_tree(work) end
  end)

  local function make(out, ...)
    return C.ember("control-vector", "--model", path, "--positive", work .. "/pos.jsonl", "--negative",
      work .. "/neg.jsonl", "--out", out, ...)
  end

  -- The reference: hidden states after `layers` recorded by a hook written here, on the pairs padded
  -- here (the shorter prompt with the last token of " ", as cvector-generator), handed to numpy.
  local function reference(layers)
    local pad = model:tokenize(" ", { bos = false })
    pad = pad[#pad]
    local man = { d = model.info.hidden_size, layers = layers, pairs = {} }
    for i = 1, #POSITIVE do
      local a, b = model:tokenize(POSITIVE[i]), model:tokenize(NEGATIVE[i])
      local n = math.max(#a, #b)
      while #a < n do a[#a + 1] = pad end
      while #b < n do b[#b + 1] = pad end
      local pair = { rows = n, pos = {}, neg = {} }
      for side, ids in pairs({ pos = a, neg = b }) do
        local exp = { name = "record" }
        function exp:after_layer(ctx, v)
          for _, l in ipairs(layers) do
            if ctx.layer_index == l then
              local f = string.format("%s/h-%d-%s-%d.f32", work, i, side, l)
              write(f, v:bytes())
              pair[side][tostring(l)] = f
            end
          end
        end
        local s <close> = model:session {}
        s:prefill(ids, { experiment = exp })
      end
      man.pairs[#man.pairs + 1] = pair
    end
    write(work .. "/man.json", cjson.encode(man))
    local p = io.popen(PY .. " " .. SCRIPT .. " " .. work .. "/man.json")
    local out = p:read("a")
    p:close()
    return cjson.decode(out)
  end

  it("writes cvector-generator's layout: controlvector metadata and direction.N f32 tensors", function()
    if not model then pending("tiny model unavailable") end
    local out = work .. "/mean.gguf"
    local code, _, err = make(out)
    assert.equal(0, code, err)
    assert.matches("3 pairs, mean-diff, direction.1-3", err, 1, true)
    local g = gguf.open(out)
    assert.equal(3, g.version)
    assert.same({ "general.architecture", "controlvector.model_hint", "controlvector.layer_count" }, g.keys)
    assert.equal("controlvector", g.meta["general.architecture"])
    assert.equal("llama", g.meta["controlvector.model_hint"])
    assert.equal(8, g.meta_types["controlvector.model_hint"]) -- a string
    assert.equal(3, g.meta["controlvector.layer_count"])
    assert.equal(5, g.meta_types["controlvector.layer_count"]) -- an i32, as llama.cpp writes it
    assert.same({ "direction.1", "direction.2", "direction.3" }, g.names)
    for _, name in ipairs(g.names) do
      assert.equal(0, g.tensors[name].type) -- f32
      assert.same({ model.info.hidden_size }, g.tensors[name].dims)
    end
  end)

  it("gives the float64 mean difference and numpy's first principal component", function()
    if not model then pending("tiny model unavailable") end
    local missing = numpy_missing()
    if missing then pending(missing) end
    local want = reference({ 0, 1, 2 })
    for _, method in ipairs({ "mean-diff", "pca" }) do
      local out = work .. "/" .. method .. ".ref.gguf"
      local code, _, err = make(out, "--method", method)
      assert.equal(0, code, err)
      local g = gguf.open(out)
      for n = 1, 3 do
        local ref = want[tostring(n - 1)] -- direction.N comes from layer N-1's output
        local got = g:row("direction." .. n, 0)
        local v = method == "pca" and ref.pca or ref.mean
        local worst, dot = 0, 0
        for i = 1, #v do
          worst = math.max(worst, math.abs(got[i] - v[i]))
          dot = dot + got[i] * v[i]
        end
        if method == "mean-diff" then
          assert.is_true(worst < 2e-6, string.format("direction.%d: max |ember - numpy| = %g", n, worst))
        else
          -- an eigenvector is known to the precision the eigengap allows: compare directions
          assert.is_true(ref.gap < 0.99, "eigengap too small to compare: " .. ref.gap)
          assert.is_true(dot > 1 - 1e-5, string.format("direction.%d: cosine to numpy's %.9f", n, dot))
        end
      end
    end
  end)

  it("is read back by --control-vector, which adds direction.N at layer N", function()
    if not model then pending("tiny model unavailable") end
    local out = work .. "/pca.gguf"
    local code, _, err = make(out, "--method", "pca", "--layers", "2-3")
    assert.equal(0, code, err)
    local cv = ember.read_control_vector(out)
    assert.equal(model.info.hidden_size, cv.n_embd)
    assert.same({ 2, 3 }, { cv.directions[1].layer, cv.directions[2].layer })
    for _, d in ipairs(cv.directions) do
      assert.is_true(math.abs(d.tensor:l2_norm() - 1) < 1e-6) -- unit directions
    end
    -- the run with the file equals one that adds the same tensors by hand at after_layer 2 and 3
    local hand = { name = "hand" }
    function hand:after_layer(ctx, v)
      for _, d in ipairs(cv.directions) do
        if ctx.layer_index == d.layer then
          for r = 1, v:shape()[1] do
            for c = 1, cv.n_embd do v:set(r, c, v:get(r, c) + 2 * d.tensor:get(1, c)) end
          end
        end
      end
    end
    local want = model:generate { prompt = "The weather", max_tokens = 3, experiment = hand }
    local steer = require("ember.run.control_vector").experiment { files = { { path = out, scale = 2 } }, model = model,
      notice = function() end }
    local got = model:generate { prompt = "The weather", max_tokens = 3, experiment = steer }
    assert.is_true(got.modified)
    assert.equal(want.logits:sha256(), got.logits:sha256())
  end)

  it("refuses what it cannot make, naming the flag or the reason", function()
    if not model then pending("tiny model unavailable") end
    jsonl(work .. "/two.jsonl", { "a", "b" })
    local cases = {
      { { "--method", "svd" }, 2, "--method: unknown method 'svd' (expected mean-diff|pca)" },
      { { "--layers", "0-2" }, 1, "direction.0 does not exist (llama.cpp never steers layer 0)" },
      { { "--layers", "1-4" }, 1, "the model has 4 layers, so direction.N runs 1-3" },
    }
    for i, c in ipairs(cases) do
      local code, _, err = make(work .. "/bad" .. i .. ".gguf", table.unpack(c[1]))
      assert.equal(c[2], code, err)
      assert.matches(c[3], err, 1, true)
      assert.is_false(fs.exists(work .. "/bad" .. i .. ".gguf"))
    end
    local code, _, err = C.ember("control-vector", "--model", path, "--positive", work .. "/two.jsonl", "--negative",
      work .. "/neg.jsonl", "--out", work .. "/bad.gguf")
    assert.equal(1, code)
    assert.matches("2 positive and 3 negative prompts: they are taken in pairs", err, 1, true)
    write(work .. "/exists.gguf", "x")
    code, _, err = make(work .. "/exists.gguf")
    assert.equal(2, code)
    assert.matches("--out: '" .. work .. "/exists.gguf' already exists", err, 1, true)
    code, _, err = C.ember("control-vector", "--model", path, "--positive", work .. "/pos.jsonl", "--negative",
      work .. "/pos.jsonl", "--out", work .. "/same.gguf")
    assert.equal(1, code)
    assert.matches("every positive prompt equals its negative one", err, 1, true)
    assert.is_nil(read(work .. "/exists.gguf"):find("GGUF", 1, true))
  end)
end)
