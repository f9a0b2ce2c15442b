-- The ActivationCache model:run_with_cache returns: lookups by ember and TransformerLens names, #,
-- iteration and printing from layer 0, stacks; the residual stream taken apart (decomposition,
-- per-head results, the final norm with a frozen scale, direct logit attribution) checked against
-- a float64 NumPy computation from the saved cache (spec/reference/dla_reference.py) and against
-- the forward pass's own logits; a saved cache read back by the NumPy reader docs/artifacts.md prints.

local ember = require("ember")
local fx = require("helpers.fixtures")
local H = require("helpers.artifacts")
local files = require("helpers.files")
local npy = require("helpers.npy")

local PY = "/usr/bin/python3"
local IDS = { 3, 17, 42, 5, 99, 7, 11 }
local P = #IDS

local function numpy_missing()
  local ok = os.execute(PY .. " -c 'import numpy' >/dev/null 2>&1")
  return ok ~= true and (PY .. " with numpy (Debian python3-numpy) is not installed: the reference cannot run") or nil
end

local models = {}
local function model(family)
  if models[family] == nil then
    local path, why = fx.tiny_model("--family " .. family .. " --dtype f32 --layers 3 --seed 5")
    models[family] = path and ember.load { model = path, kernels = "reference", threads = 1 } or false
    if not path then models[family .. "_why"] = why end
  end
  if not models[family] then pending("no tiny " .. family .. " model: " .. tostring(models[family .. "_why"])) end
  return models[family] or nil
end

teardown(function()
  for _, m in pairs(models) do if type(m) ~= "string" and m then m:close() end end
  fx.cleanup()
  H.cleanup()
end)

local error_of = require("helpers.errors").error_of

-- max |a - b| / max |b| over two equal-shaped tensors (b the reference)
local function rel(a, b)
  local av, bv = a:values(), b:values()
  assert(#av == #bv, string.format("sizes differ: %d vs %d", #av, #bv))
  local md, mb = 0, 0
  for i = 1, #av do
    md = math.max(md, math.abs(av[i] - bv[i]))
    mb = math.max(mb, math.abs(bv[i]))
  end
  return md / mb
end

local function tensor_of(a) return ember.tensor_from_bytes(a.data:sub(a.offset, a.offset + a.rows * a.cols * 4 - 1),
  a.rows, a.cols) end

describe("the ActivationCache", function()
  it("counts and iterates layers from 0, and prints them so", function()
    local m = model("llama")
    if not m then return end
    local c = m:run_with_cache { ids = IDS }
    local n = m.info.n_layers
    assert.are.equal(n, #c.after_layer) -- keys 0 .. n-1: # counts them all
    local seen = {}
    for l, t in pairs(c.after_layer) do seen[#seen + 1] = l; assert.are.equal(c.after_layer[l], t) end
    assert.are.same({ 0, 1, 2 }, seen)
    seen = {}
    for l, at in c:layers() do
      seen[#seen + 1] = l
      assert.is_true(rawequal(at.after_mlp, c.after_mlp[l]))
    end
    assert.are.same({ 0, 1, 2 }, seen)
    assert.are.same({ 0, 1, 2 }, { table.unpack(c.layers) }) -- the old list is still there
    local want = 0 -- every stage a plain pass calls: each per-layer one at every layer, the others once
    for _, st in ipairs(c.stages) do want = want + (ember.layer_stages[st] and n or 1) end
    assert.are.equal(want, #c)
    assert.are.equal(#c, #c:keys())
    assert.are.equal("blocks.0.hook_resid_pre", c:keys()[1])
    assert.are.equal("after_logits", c:keys()[#c])
    local text = tostring(c)
    assert.matches("^ember.ActivationCache: 7 tokens, 3 layers, " .. #c .. " tensors", text)
    assert.matches("after_layer%s+layers 0%-2, each %[7, 64%]%s+blocks%.L%.hook_resid_post", text)
    assert.matches("after_layer: layers 0%-2 %(3%), each %[7, 64%]", tostring(c.after_layer))
  end)

  it("answers to ember and TransformerLens names with the same tensors, and says what it lacks", function()
    local m = model("llama")
    if not m then return end
    local c = m:run_with_cache { ids = IDS, stages = { "after_layer", "attention_heads", "before_logits" },
      layers = { 0, 2 } }
    assert.is_true(rawequal(c.after_layer[2], c["blocks.2.hook_resid_post"]))
    assert.is_true(rawequal(c.after_layer[2], c:get("after_layer", 2)))
    assert.is_true(rawequal(c.after_layer[2], c:get("resid_post", 2)))
    assert.is_true(rawequal(c.attention_heads[0], c:get("blocks.0.attn.hook_z")))
    assert.is_true(rawequal(c.before_logits, c["ln_final.hook_normalized"]))
    assert.is_nil(c.after_mlp) -- a stage not cached reads as nil, as always
    assert.are.equal(
      "cache: after_layer of layer 1 is not in the cache (it holds attention_heads at layers 0,2, after_layer at "
        .. "layers 0,2, before_logits)", error_of(c.get, c, "after_layer", 1))
    assert.matches("after_mlp of layer 0 is not in the cache",
      error_of(function() return c["blocks.0.hook_mlp_out"] end))
    assert.matches("'blocks.0.hook_q' has no ember stage", error_of(function() return c["blocks.0.hook_q"] end))
    assert.matches("did you mean 'stack'", error_of(function() return c:stak("after_layer") end))
    assert.matches("'blocks.2.hook_resid_post' names layer 2, not 0", error_of(c.get, c, "blocks.2.hook_resid_post", 0))
    local seen = {}
    for l in c:layers() do seen[#seen + 1] = l end
    assert.are.same({ 0, 2 }, seen)
  end)

  it("stacks a stage's layers one block after another", function()
    local m = model("llama")
    if not m then return end
    local c = m:run_with_cache { ids = IDS, stages = { "mlp_activation" } }
    local s, layers = c:stack("post")
    assert.are.same({ 0, 1, 2 }, layers)
    local w = c.mlp_activation[0]:shape()[2]
    assert.are.same({ 3 * P, w }, s:shape())
    for k, l in ipairs(layers) do
      assert.are.equal(c.mlp_activation[l]:sha256(), s:slice((k - 1) * P + 1, k * P):sha256())
    end
    assert.matches("has no layers to stack", error_of(c.stack, c, "before_logits"))
  end)
end)

-- The residual stream taken apart, against the float64 reference, for an RMSNorm family (llama)
-- and a LayerNorm family with biases and a tied head (gpt2).
for _, family in ipairs({ "llama", "gpt2" }) do
  describe("the residual stream taken apart (" .. family .. ")", function()
    local ref -- { dir, cache, ... } once computed
    local TOKENS, INCORRECT = { 4, 9, 200 }, { 8, 300, 1 }
    local STAGES = { "resid_pre", "z", "attn_out", "mlp_out", "resid_post" }
    local function reference()
      if ref then return ref end
      local missing = numpy_missing()
      if missing then pending(missing); return nil end
      local m = model(family)
      if not m then return nil end
      local c = m:run_with_cache { ids = IDS, stages = STAGES }
      local dir = H.tmpdir()
      ember.save_tensors(dir .. "/cache.safetensors", c)
      local head = "output"
      if not pcall(m.weight, m, "output") then head = "token_embd" end
      local w = { norm_w = m:weight("output_norm"), wu = m:weight(head, TOKENS),
        wu_incorrect = m:weight(head, INCORRECT) }
      if m.info.final_norm == "layer" then w.norm_b = m:weight("output_norm.bias") end
      for l = 0, m.info.n_layers - 1 do w["w_o." .. l] = m:weight("blk." .. l .. ".attn_output") end
      ember.save_tensors(dir .. "/weights.safetensors", w)
      local cmd = string.format("%s spec/reference/dla_reference.py %s %s %s %d %d %d %.9g %s 2>&1", PY,
        H.shell_quote(dir .. "/cache.safetensors"), H.shell_quote(dir .. "/weights.safetensors"), H.shell_quote(dir),
        m.info.n_layers, m.info.n_heads, P - 1, m.info.norm_eps, m.info.final_norm)
      local p = io.popen(cmd)
      local out = p:read("a")
      assert(p:close(), "dla_reference.py failed: " .. out)
      local r = { model = m, cache = c }
      for _, k in ipairs({ "sum", "heads", "normed", "attrs", "diff", "logits" }) do
        r[k] = tensor_of(npy.read(dir .. "/" .. k .. ".npy"))
      end
      ref = r
      return ref
    end

    it("decompose_resid: the embedding and every attention and MLP output, summing to the final residual", function()
      local r = reference()
      if not r then return end
      local c, n = r.cache, r.model.info.n_layers
      local d, labels = c:decompose_resid()
      assert.are.same({ "embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out", "2_attn_out", "2_mlp_out" },
        labels)
      assert.are.equal(c.before_layer[0]:sha256(), d:slice(1, P):sha256())
      assert.are.equal(c.after_mlp[n - 1]:sha256(), d:slice((2 * n) * P + 1, (2 * n + 1) * P):sha256())
      -- the parts (summed in float64) make the residual the forward pass computed, up to its f32 adds
      assert.is_true(rel(c.after_layer[n - 1], r.sum) < 1e-5)
      local d1, l1 = c:decompose_resid(1)
      assert.are.same({ 3 * P, r.model.info.hidden_size }, d1:shape())
      assert.are.same({ "embed", "0_attn_out", "0_mlp_out" }, l1)
    end)

    it("accumulated_resid: the residual entering each layer, then the last layer's output", function()
      local r = reference()
      if not r then return end
      local c, n = r.cache, r.model.info.n_layers
      local a, labels = c:accumulated_resid()
      assert.are.same({ "0_pre", "1_pre", "2_pre", "final_post" }, labels)
      for l = 0, n - 1 do assert.are.equal(c.before_layer[l]:sha256(), a:slice(l * P + 1, (l + 1) * P):sha256()) end
      assert.are.equal(c.after_layer[n - 1]:sha256(), a:slice(n * P + 1, (n + 1) * P):sha256())
      assert.are.same({ "0_pre", "1_pre" }, select(2, c:accumulated_resid(1)))
    end)

    it("stack_head_results: each head through its slice of W_O, as NumPy computes it", function()
      local r = reference()
      if not r then return end
      local c, m = r.cache, r.model
      local s, labels = c:stack_head_results()
      assert.are.equal("L0H0", labels[1])
      assert.are.equal(string.format("L%dH%d", m.info.n_layers - 1, m.info.n_heads - 1), labels[#labels])
      assert.is_true(rel(s, r.heads) < 1e-5, "heads: rel " .. rel(s, r.heads))
      -- a layer's heads (and the O projection's bias, where there is one) sum to its attention output
      local H_ = m.info.n_heads
      local sum = ember.tensor(P, m.info.hidden_size)
      for h = 0, H_ - 1 do sum = sum + s:slice(h * P + 1, (h + 1) * P) end
      if family == "gpt2" then sum = sum + m:weight("blk.0.attn_output.bias") end
      assert.is_true(rel(sum, c.after_attention[0]) < 1e-5)
    end)

    it("apply_ln_to_stack and logit_attrs: NumPy's frozen-scale attributions, summing to the logits", function()
      local r = reference()
      if not r then return end
      local c, m = r.cache, r.model
      local d = c:decompose_resid()
      local normed = c:apply_ln_to_stack(d, P - 1)
      assert.is_true(rel(normed, r.normed) < 1e-5, "normed: rel " .. rel(normed, r.normed))
      local attrs = c:logit_attrs(normed, TOKENS)
      assert.are.same({ 1 + 2 * m.info.n_layers, #TOKENS }, attrs:shape())
      assert.is_true(rel(attrs, r.attrs) < 1e-5, "attrs: rel " .. rel(attrs, r.attrs))
      local diff = c:logit_attrs(normed, TOKENS, INCORRECT)
      assert.is_true(rel(diff, r.diff) < 1e-5, "diff: rel " .. rel(diff, r.diff))
      -- NumPy's head on the whole normed residual is the forward pass's logits of those tokens
      local fwd = ember.tensor(1, #TOKENS)
      for j, id in ipairs(TOKENS) do fwd:set(1, j, c.logits:get(1, id + 1)) end
      assert.is_true(rel(r.logits, fwd) < 1e-5, "the reference's logits differ from the forward pass's")
      -- the attributions add up to those logits (minus the final norm's bias term, on gpt2)
      local total = attrs:sum()
      if family == "gpt2" then
        total = total + m:weight("output_norm.bias"):matmul_t(m:weight("token_embd", TOKENS))
      end
      assert.is_true(rel(total, fwd) < 1e-4, "the attributions do not sum to the logits: rel " .. rel(total, fwd))
      -- without a position each row keeps its own position's scale
      local all = c:apply_ln_to_stack(d)
      assert.are.same(d:shape(), all:shape())
      assert.are.equal(normed:row(3):sha256(), all:row(2 * P + P):sha256())
    end)
  end)
end

describe("decompose_resid on gemma4", function()
  it("is refused: its layers are not sums of attention and MLP outputs", function()
    local m = model("gemma4")
    if not m then return end
    local c = m:run_with_cache { ids = { 1, 2, 3 }, stages = { "before_layer", "after_attention", "after_mlp" } }
    assert.matches("on gemma4 the residual is not a sum", error_of(c.decompose_resid, c))
  end)
end)

describe("a saved cache", function()
  it("is read back by the NumPy reader of docs/artifacts.md, under TransformerLens names", function()
    local missing = numpy_missing()
    if missing then return pending(missing) end
    local m = model("llama")
    if not m then return end
    local c = m:run_with_cache { ids = IDS, stages = { "resid_post", "pattern", "normalized", "after_logits" } }
    local dir = H.tmpdir()
    ember.save_tensors(dir .. "/cache.safetensors", c)
    local doc = files.read("docs/artifacts.md")
    local reader = doc:match("<!%-%- numpy reader %-%->\n```python\n(.-)```")
    assert.is_truthy(reader, "docs/artifacts.md has no '<!-- numpy reader -->' python block")
    local lines = select(2, reader:gsub("\n", "\n"))
    assert.is_true(lines <= 12, "the reader is " .. lines .. " lines")
    local script = reader .. [[

import sys
t, meta = load_safetensors(sys.argv[1])
for k in sorted(t):
    a = t[k].astype("float64")
    print(k, "x".join(map(str, a.shape)), repr(float(a.sum())), repr(float(a.flat[-1])))
print("ids", meta["ids"])
]]
    H.write(dir .. "/read.py", script)
    local p = io.popen(PY .. " " .. H.shell_quote(dir .. "/read.py") .. " "
      .. H.shell_quote(dir .. "/cache.safetensors") .. " 2>&1")
    local out = p:read("a")
    assert(p:close(), "the reader failed: " .. out)
    local got = {}
    for name, shape, sum, last in out:gmatch("(%S+) (%S+) (%S+) (%S+)\n") do got[name] = { shape, sum, last } end
    local names = c:keys()
    names[#names + 1] = "logits"
    for _, name in ipairs(names) do
      local t = name == "logits" and c.logits or c:get(name)
      local s, v = t:shape(), t:values()
      local want = 0
      for _, x in ipairs(v) do want = want + x end
      assert.is_truthy(got[name], "the reader did not see " .. name)
      assert.are.equal(s[1] .. "x" .. s[2], got[name][1])
      assert.is_true(math.abs(tonumber(got[name][2]) - want) <= 1e-9 * math.max(1, math.abs(want)), name)
      assert.are.equal(v[#v], tonumber(got[name][3]), name)
    end
    assert.matches("ids 3,17,42,5,99,7,11\n", out, 1, true)
    assert.is_truthy(got["blocks.2.attn.hook_pattern"])
  end)
end)
