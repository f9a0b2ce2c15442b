-- Steering: ember.experiments.steer and --steer (a vector from .npy, safetensors or an artifact
-- record, times a scale, added at a layer and stage in prefill and every decode), and llama.cpp
-- control vectors (--control-vector, --control-vector-layers). Expectations are built without the
-- steering code: the plain run's own activations plus the vector (ember.add), the logit lens of
-- that sum (model:unembed, the run's logits head bit for bit), and control-vector files written
-- here the way llama.cpp's cvector-generator writes them (helpers.gguf_writer).

local ember = require("ember")
local compose = require("ember.run.compose")
local models = require("helpers.models")
local npy = require("helpers.npy")
local gguf_writer = require("helpers.gguf_writer")
local cli = require("helpers.cli")
local steer = require("ember.experiments.steer")
local cvec = require("ember.run.control_vector")

local model
local need_default = models.lazy_default()
local function need_model()
  model = need_default()
  return model ~= nil
end

local tmp_files = {}
local function tmp(suffix)
  local p = os.tmpname()
  os.remove(p)
  p = p .. suffix
  tmp_files[#tmp_files + 1] = p
  return p
end
teardown(function()
  for _, p in ipairs(tmp_files) do os.execute("rm -rf '" .. p .. "'") end
end)

-- A deterministic direction of n values, all multiples of 1/8 (exact in f16 and f32).
local function direction(seed, n)
  local t = {}
  for i = 1, n do t[i] = ((i * seed + 3) % 17 - 8) / 8 end
  return t
end

-- Observes clones of a stage at a layer, and the logits of every evaluation.
local function observer(layer, stage)
  local exp = { name = "observer", seen = {}, logits = {} }
  if stage then
    exp[stage] = function(self, ctx, v)
      if ctx.layer_index == layer then self.seen[#self.seen + 1] = v:clone() end
    end
  end
  function exp:after_logits(_, l) self.logits[#self.logits + 1] = l:sha256() end
  return exp
end

local GEN = { prompt = models.PROMPT, max_tokens = 3, temperature = 0 }
local function gen(exps) return models.generate(model, GEN, compose.compose(exps)) end

local function quiet() end

describe("ember.experiments.steer", function()
  it("adds scale * v to every row of after_layer at its layer, in prefill and every decode", function()
    if not need_model() then return end
    local H = model.info.hidden_size
    local v = ember.tensor(1, H, direction(3, H))
    local plain, seen = observer(2, "after_layer"), observer(2, "after_layer")
    local out0 = gen({ plain })
    local exp = steer { layer = 2, stage = "after_layer", vector = v, scale = 4, notice = quiet }
    local out1 = gen({ exp, seen })
    assert.is_true(out1.modified)
    assert.are.equal(1 + #out1.ids, exp.stats.additions)
    assert.are.equal(1, exp.stats.prefill)
    -- the prefill block sees the same inputs up to layer 2: its steered value is plain + 4v
    local want = ember.add(plain.seen[1], v:clone():scale(4))
    assert.are.equal(want:sha256(), seen.seen[1]:sha256())
    assert.are_not.equal(out0.ids[#out0.ids] .. table.concat(plain.logits, ","), table.concat(seen.logits, ","))
  end)

  it("steered at the last layer, the prefill logits are the logit lens of plain + scale * v", function()
    if not need_model() then return end
    local H, L = model.info.hidden_size, model.info.n_layers - 1
    local v = ember.tensor(1, H, direction(5, H))
    local cache = model:run_with_cache { prompt = models.PROMPT, stages = { "after_layer" }, layers = { L } }
    local h = cache.after_layer[L]
    local P = h:shape()[1]
    local want = model:unembed(ember.add(h, v:clone():scale(-2.5)):row(P))
    local s = model:session {}
    local got = s:prefill(model:tokenize(models.PROMPT),
      { experiment = steer { layer = L, vector = v, scale = -2.5, notice = quiet } })
    assert.are.equal(want:sha256(), got:sha256())
  end)

  it("scale 0 leaves logits and ids bit-identical and the run unmodified", function()
    if not need_model() then return end
    local H = model.info.hidden_size
    local plain = observer()
    local out0 = gen({ plain })
    local zero = observer()
    local exp = steer { layer = "all", stage = "after_mlp", vector = direction(7, H), scale = 0, notice = quiet }
    local out1 = gen({ exp, zero })
    assert.is_false(out1.modified)
    assert.are.same(out0.ids, out1.ids)
    assert.are.same(plain.logits, zero.logits)
    assert.are.equal(0, exp.stats.additions)
  end)

  it("adds to mlp_activation a vector of its width, and refuses another width naming both", function()
    if not need_model() then return end
    local s0 = model:session {}
    local width
    s0:prefill(model:tokenize("hi"), { experiment = { name = "w", mlp_activation = function(_, ctx, a)
      if ctx.layer_index == 1 then width = a:shape()[2] end end } })
    local plain, seen = observer(1, "mlp_activation"), observer(1, "mlp_activation")
    gen({ plain })
    local v = ember.tensor(1, width, direction(11, width))
    gen({ steer { layer = 1, stage = "mlp_activation", vector = v, scale = 0.5, notice = quiet }, seen })
    assert.are.equal(ember.add(plain.seen[1], v:clone():scale(0.5)):sha256(), seen.seen[1]:sha256())
    local bad = steer { layer = 1, stage = "mlp_activation", vector = direction(3, model.info.hidden_size),
      notice = quiet }
    local ok, err = pcall(gen, { bad })
    assert.is_false(ok)
    assert.matches("has " .. model.info.hidden_size .. " values but mlp_activation of layer 1 is " .. width
      .. " wide", tostring(err), 1, true)
  end)

  it("refuses attention_pattern, non-layer stages, bad layers and bad vectors with clear messages", function()
    if not need_model() then return end
    local H = model.info.hidden_size
    local function refuses(args, text)
      args.notice = quiet
      local ok, err = pcall(steer, args)
      assert.is_false(ok)
      assert.matches(text, tostring(err), 1, true)
    end
    refuses({ layer = 0, stage = "attention_pattern", vector = direction(1, H) }, "attention_pattern cannot be steered")
    refuses({ layer = 0, stage = "after_logits", vector = direction(1, H) }, "is not a per-layer stage")
    refuses({ layer = "x", vector = direction(1, H) }, "layer:")
    refuses({ layer = 0, vector = ember.tensor(2, H) }, "give one row")
    refuses({ layer = 0, vector = "/nonexistent/v.npy" }, "/nonexistent/v.npy")
    refuses({ layer = 0, vector = direction(1, H), scale = "x" }, "scale")
    local far = steer { layer = 99, vector = direction(1, H), notice = quiet }
    local ok, err = pcall(gen, { far })
    assert.is_false(ok)
    assert.matches("layer 99 is out of range", tostring(err), 1, true)
    local narrow = steer { layer = 0, vector = direction(1, H - 1), notice = quiet }
    ok, err = pcall(gen, { narrow })
    assert.is_false(ok)
    assert.matches("has " .. (H - 1) .. " values but after_layer is " .. H .. " wide", tostring(err), 1, true)
  end)
end)

describe("ember.vector_file", function()
  local vf = require("ember.store.vector_file")

  it("reads .npy f32 and f16 vectors and a chosen row of a matrix, exactly", function()
    local v = direction(3, 10)
    local a = vf.read(npy.write(tmp(".npy"), v, { 10 }))
    assert.are.same({ 1, 10 }, a.shape)
    assert.are.equal(ember.tensor(1, 10, v):sha256(), a.sha256)
    local b = vf.read(npy.write(tmp(".npy"), v, { 10 }, "<f2"))
    assert.are.equal(a.sha256, b.sha256)
    local m = {}
    for i = 1, 30 do m[i] = i / 4 end
    local path = npy.write(tmp(".npy"), m, { 3, 10 })
    -- row 2 (0-based) holds the 21st to 30th values: 21/4 .. 30/4
    assert.are.equal(ember.tensor(1, 10, { 5.25, 5.5, 5.75, 6, 6.25, 6.5, 6.75, 7, 7.25, 7.5 }):sha256(),
      vf.read(path .. "@2").sha256)
    local ok, err = pcall(vf.read, path)
    assert.is_false(ok)
    assert.matches("holds 3 rows; choose one with @ROW", tostring(err), 1, true)
    ok, err = pcall(vf.read, path .. "@3")
    assert.matches("row 3 is out of range (0-2)", tostring(err), 1, true)
  end)

  it("refuses malformed .npy files naming the file and the problem", function()
    local function refuses(bytes, text)
      local p = tmp(".npy")
      local f = assert(io.open(p, "wb")); f:write(bytes); f:close()
      local ok, err = pcall(vf.read, p)
      assert.is_false(ok)
      assert.matches(p, tostring(err), 1, true)
      assert.matches(text, tostring(err), 1, true)
    end
    -- a FIFO in a vector's place is an error naming it, never a read that waits forever
    for _, suffix in ipairs({ ".npy", ".safetensors" }) do
      local fifo = tmp(suffix)
      assert(os.execute("mkfifo '" .. fifo .. "'"))
      local ok, err = pcall(vf.read, fifo)
      assert.is_false(ok)
      assert.matches(fifo .. ": is a FIFO", tostring(err), 1, true)
    end
    local good = io.open(npy.write(tmp(".npy"), { 1, 2, 3 }, { 3 }), "rb"):read("a")
    refuses("NOTNUMPY", "bad magic")
    refuses(good:sub(1, -3), "data bytes")
    refuses((good:gsub("<f4", "<f8")), "'<f8' is not read")
    refuses((good:gsub("False", "True ")), "Fortran")
    refuses(good:sub(1, 20), "truncated")
  end)

  it("reads a safetensors tensor (by name when there are several) and an artifact record", function()
    local p = tmp(".safetensors")
    ember.save_tensors(p, { a = ember.tensor(1, 4, { 1, 2, 3, 4 }),
      b = ember.tensor(2, 4, { 5, 6, 7, 8, 9, 10, 11, 12 }) })
    assert.are.equal(ember.tensor(1, 4, { 9, 10, 11, 12 }):sha256(), vf.read(p .. "#b@1").sha256)
    local ok, err = pcall(vf.read, p)
    assert.matches("holds 2 tensors (a, b)", tostring(err), 1, true)
    ok, err = pcall(vf.read, p .. "#c")
    assert.matches("no tensor 'c'", tostring(err), 1, true)
    local one = tmp(".safetensors")
    ember.save_tensors(one, { only = ember.tensor(1, 3, { 1, 2, 3 }) })
    assert.are.equal(3, vf.read(one).shape[2])
  end)
end)

describe("--steer", function()
  it("runs, announces the count and records sha256, shape, scale, layer and stage in the manifest", function()
    local path = cli.need_model()
    if not path or not need_model() then return end
    local H = model.info.hidden_size
    local v = npy.write(tmp(".npy"), direction(3, H), { H })
    local manifest = tmp(".json")
    local code, _, err = cli.ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", "3",
      "--steer", "2:after_layer:" .. v .. ":4", "--steer", "1-2:mlp:" .. v, "--run-manifest", manifest)
    assert.are.equal(0, code, err)
    assert.matches("MODIFIED by steer 2:after_layer:" .. v .. ":4: vector %[1, " .. H .. "%]", err)
    assert.matches("added to after_layer of layer 2, 4 times %(prefill 1, decode 3%)", err)
    assert.matches("added to after_mlp of layers 1%-2, 8 times %(prefill 2, decode 6%)", err)
    local m = require("ember.store.json").decode(io.open(manifest):read("a"))
    local d = m.experiment.members[1].details
    assert.are.equal(2, #d)
    assert.are.same({ "2", "after_layer", 4.0, 1, H },
      { d[1].layers, d[1].stage, d[1].scale, d[1].shape[1], d[1].shape[2] })
    assert.are.equal(ember.tensor(1, H, direction(3, H)):sha256(), d[1].sha256)
    assert.are.equal("1-2", d[2].layers)
  end)

  it("refuses bad values before the run, naming the flag (exit 2)", function()
    local path = cli.need_model()
    if not path then return end
    local v = npy.write(tmp(".npy"), direction(3, 5), { 5 })
    for _, case in ipairs({
      { "0:attention_pattern:" .. v, "attention_pattern cannot be steered" },
      { "0:bogus:" .. v, "unknown stage 'bogus'" },
      { "0:after_layer", "expected L:STAGE:FILE" },
      { "99:after_layer:" .. v, "layer 99 is out of range" },
      { "0:after_layer:" .. v, "has 5 values but after_layer is" },
      { "0:after_layer:/nonexistent.npy", "/nonexistent.npy" },
    }) do
      local code, _, err = cli.ember("--model", path, "--prompt", "hi", "--steer", case[1])
      assert.are.equal(2, code, err)
      assert.matches("--steer: ", err, 1, true)
      assert.matches(case[2], err, 1, true)
    end
    local code, _, err = cli.ember("--model", path, "--prompt", "hi", "--steer", "0:after_layer:" .. v,
      "--zero-layer-output", "0:mlp")
    assert.are.equal(2, code)
    assert.matches("cannot be combined", err, 1, true)
  end)
end)

describe("llama.cpp control vectors", function()
  -- direction.N of the file and the .npy files --steer reads, for the same vectors
  local function files(dirs)
    local H = model.info.hidden_size
    local d, npys = {}, {}
    for n, seed in pairs(dirs) do
      d[n] = direction(seed, H)
      npys[n] = npy.write(tmp(".npy"), d[n], { H })
    end
    return gguf_writer.control_vector(tmp(".gguf"), d), npys
  end

  local function steer_same(npys, scale, lo, hi)
    local adds = {}
    local layers = {}
    for n in pairs(npys) do layers[#layers + 1] = n end
    table.sort(layers)
    for _, n in ipairs(layers) do
      if n >= (lo or 1) and n <= (hi or model.info.n_layers - 1) then
        adds[#adds + 1] = { layer = n, stage = "after_layer", vector = npys[n], scale = scale }
      end
    end
    return steer { additions = adds, notice = quiet }
  end

  it("direction.N lands at after_layer of layer N: the same logits as steering there, unlike the plain run", function()
    if not need_model() then return end
    local cv, npys = files({ [1] = 3, [2] = 5, [4] = 7 })
    local plain, a, b = observer(), observer(), observer()
    local out0 = gen({ plain })
    local out1 = gen({ cvec.experiment { files = { { path = cv, scale = 2 } }, model = model, notice = quiet }, a })
    local out2 = gen({ steer_same(npys, 2), b })
    assert.are.same(out1.ids, out2.ids)
    assert.are.same(a.logits, b.logits)
    assert.are_not.same(plain.logits, a.logits)
    assert.is_true(out1.modified)
    assert.are.equal(#out0.ids + 1, #a.logits)
  end)

  it("sums several files as llama.cpp does and honours an inclusive layer range", function()
    if not need_model() then return end
    local cv1, npys = files({ [2] = 3, [3] = 5 })
    local cv2 = files({ [2] = 3, [3] = 5 })
    -- the same file twice at scales 1 and 1 is the file at scale 2 (x + x = 2x exactly in f32)
    local a, b = observer(), observer()
    gen({ cvec.experiment { files = { { path = cv1, scale = 1 }, { path = cv2, scale = 1 } }, model = model,
      notice = quiet }, a })
    gen({ steer_same(npys, 2), b })
    assert.are.same(a.logits, b.logits)
    -- layers 3-3 only: direction.2 is left out
    local c, d = observer(), observer()
    gen({ cvec.experiment { files = { { path = cv1, scale = 1 } }, layers = { 3, 3 }, model = model, notice = quiet },
      c })
    gen({ steer_same(npys, 1, 3, 3), d })
    assert.are.same(c.logits, d.logits)
  end)

  it("scale 0 is bit-identical to no vector", function()
    if not need_model() then return end
    local cv = files({ [1] = 3, [3] = 5 })
    local plain, z = observer(), observer()
    local out0 = gen({ plain })
    local out1 = gen({ cvec.experiment { files = { { path = cv, scale = 0 } }, model = model, notice = quiet }, z })
    assert.are.same(out0.ids, out1.ids)
    assert.are.same(plain.logits, z.logits)
    assert.is_false(out1.modified)
  end)

  it("the command line gives the same logits as --steer at the documented stage", function()
    local path = cli.need_model()
    if not path or not need_model() then return end
    local cv, npys = files({ [1] = 3, [5] = 9 })
    local function logits_of(...)
      local dir = tmp(".cap")
      local code, _, err = cli.ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", "3",
        "--capture-activations", dir, "--capture-stages", "after_logits", ...)
      assert.are.equal(0, code, err)
      local shas = {}
      for _, r in ipairs(require("ember.store.artifact").read(dir).records) do shas[#shas + 1] = r.sha256 end
      return shas, err
    end
    local a, err = logits_of("--control-vector", cv .. ":1.5")
    assert.matches("MODIFIED by control%-vector .*after_layer of layers 1,5", err)
    local b = logits_of("--steer", "1:after_layer:" .. npys[1] .. ":1.5", "--steer",
      "5:after_layer:" .. npys[5] .. ":1.5")
    local plain = logits_of()
    assert.are.same(a, b)
    assert.are_not.same(a, plain)
    local r = logits_of("--control-vector", cv .. ":1.5", "--control-vector-layers", "2-5")
    local s = logits_of("--steer", "5:after_layer:" .. npys[5] .. ":1.5")
    assert.are.same(r, s)
  end)

  it("refuses malformed files naming the file, the tensor and both widths", function()
    local path = cli.need_model()
    if not path or not need_model() then return end
    local H = model.info.hidden_size
    local function refuses(file, text)
      local code, _, err = cli.ember("--model", path, "--prompt", "hi", "--control-vector", file)
      assert.are.equal(2, code, err)
      assert.matches(file, err, 1, true)
      assert.matches(text, err, 1, true)
    end
    refuses(gguf_writer.control_vector(tmp(".gguf"), { [0] = direction(1, H) }),
      "'direction.0': layer 0 cannot be steered")
    refuses(gguf_writer.control_vector(tmp(".gguf"), { [1] = direction(1, H - 2) }),
      "its directions have " .. (H - 2) .. " values, the model's hidden size is " .. H)
    refuses(gguf_writer.control_vector(tmp(".gguf"), { [1] = direction(1, H), [2] = direction(1, H - 1) }),
      "tensor 'direction.2' has " .. (H - 1) .. " values")
    refuses(gguf_writer.write(tmp(".gguf"),
      { tensors = { { name = "dir.1", shape = { H }, values = direction(1, H) } } }),
      "tensor 'dir.1' is not named direction.N")
    refuses(gguf_writer.write(tmp(".gguf"), { tensors = { { name = "direction.1", shape = { H / 2, 2 },
      values = direction(1, H) } } }), "not one-dimensional")
    refuses(gguf_writer.write(tmp(".gguf"), { tensors = { { name = "direction.1", shape = { H }, type = 1,
      data = string.rep("\0", 2 * H) } } }), "not f32")
    refuses(gguf_writer.write(tmp(".gguf"), { kv = { { "general.architecture", "string", "llama" } },
      tensors = { { name = "direction.1", shape = { H }, values = direction(1, H) } } }), "not 'controlvector'")
    refuses(gguf_writer.write(tmp(".gguf"), {}), "no direction.N tensors")
    refuses(path, "not 'controlvector'")
    local code, _, err = cli.ember("--model", path, "--prompt", "hi", "--control-vector-layers", "1-2")
    assert.are.equal(2, code)
    assert.matches("--control-vector-layers needs --control-vector", err, 1, true)
  end)
end)

describe("scripts/experiments/logit_lens.lua", function()
  it("prints one row per layer; the last layer's top token is the run's greedy next token", function()
    if not need_model() then return end
    local exp = dofile("scripts/experiments/logit_lens.lua")("k=3", require("ember.run.builtin").handle(model))
    local s = model:session {}
    local ids = model:tokenize(models.PROMPT)
    local logits = s:prefill(ids, { experiment = exp })
    local lines = exp:lines()
    assert.are.equal(2 + model.info.n_layers, #lines)
    assert.matches("at position " .. (#ids - 1), lines[1], 1, true)
    assert.matches("^%s+" .. (model.info.n_layers - 1) .. "%s", lines[#lines])
    -- the last layer's lens is the run's own logits: same top ids, probabilities of their softmax
    local L = model.info.n_layers - 1
    local top = exp:top()
    local want_ids, want_p = logits:softmax():topk(3)
    assert.are.same(want_ids, top[L].ids)
    assert.are.same(want_p, top[L].probs)
    assert.are.equal(logits:token_argmax(), top[L].ids[1])
    for l = 0, L - 1 do assert.are.equal(3, #top[l].ids) end
    local ok, err = pcall(dofile("scripts/experiments/logit_lens.lua"), "k=3")
    assert.is_false(ok)
    assert.matches("needs the model", tostring(err), 1, true)
  end)
end)
