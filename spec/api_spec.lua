-- The Lua API surface (docs/lua-api.md): module functions, tensors with hand-computed values,
-- models and sessions with their lifetime rules, and the hook contract of SPEC §4 (order, counts,
-- contexts, views, mutation accounting, the failure path).

local ember = require("ember")
local fx = require("helpers.fixtures")

local function sqrt(x) return math.sqrt(x) end

local fnv1a64 = require("helpers.fnv").fnv1a64 -- the documented fingerprint of a tensor's raw bytes

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

describe("ember module", function()
  it("has a version", function()
    assert.is_truthy(ember.version:match("^%d+%.%d+%.%d+"))
  end)

  it("sha256 matches the FIPS 180-2 vector for 'abc'", function()
    assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", ember.sha256("abc"))
    assert.are.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", ember.sha256(""))
  end)

  it("sha256_file hashes a file and returns nil, message for a missing one", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write("abc")
    f:close()
    assert.are.equal(ember.sha256("abc"), ember.sha256_file(path))
    os.remove(path)
    local h, msg = ember.sha256_file(path)
    assert.is_nil(h)
    assert.is_truthy(msg:find(path, 1, true))
  end)

  it("cpu() reports feature booleans and a kernel set", function()
    local c = ember.cpu()
    assert.is_boolean(c.avx2)
    assert.is_boolean(c.avx512f)
    assert.is_truthy(({ reference = true, avx2 = true, avx512 = true })[c.kernels])
  end)
end)

describe("ember.Tensor", function()
  local vals = { 1, -2, 3, -4, 5, 6 }
  local t
  before_each(function() t = ember.tensor(2, 3, vals) end)

  it("t:write_bytes(file) writes t:bytes() to an open file, and names what went wrong", function()
    local t = ember.tensor(2, 3, { { 1.5, -2.0, 0.0 }, { 3.25, -0.0, 7.0 } })
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    assert.is_true(t:write_bytes(f))
    assert.is_true(t:row(2):write_bytes(f))
    f:close()
    local got = require("helpers.files").read(path)
    assert.are.equal(t:bytes() .. t:row(2):bytes(), got)
    assert.has_error(function() t:write_bytes(f) end)
    f = assert(io.open(path, "rb")) -- read-only: the write fails with the reason
    local ok, why = t:write_bytes(f)
    f:close()
    os.remove(path)
    assert.is_nil(ok)
    assert.is_string(why)
    f = assert(io.open("/dev/full", "wb"))
    local big = ember.tensor(1024, 1024)
    ok, why = big:write_bytes(f)
    f:close()
    assert.is_nil(ok)
    assert.is_truthy(why:find("No space left", 1, true), why)
  end)

  it("reads shape, dtype, length and values", function()
    assert.are.same({ 2, 3 }, t:shape())
    assert.are.equal("f32", t:dtype())
    assert.are.equal(6, #t)
    assert.are.equal(-4, t:get(2, 1))
    assert.are.equal(3, t:get(1, 3))
    assert.are.same(vals, t:values())
  end)

  it("computes norms, argmax and hashes by hand", function()
    assert.are.equal(sqrt(1 + 4 + 9 + 16 + 25 + 36), t:l2_norm())
    assert.are.equal(6, t:abs_max())
    assert.are.equal(3, t:argmax(1))
    assert.are.equal(3, t:argmax(2))
    assert.are.equal(2, ember.tensor(1, 3, { 1, 7, 7 }):argmax()) -- ties go to the lowest column
    local bytes = string.pack("<ffffff", table.unpack(vals))
    assert.are.equal(bytes, t:bytes())
    assert.are.equal(ember.sha256(bytes), t:sha256())
    assert.are.equal(fnv1a64(bytes), t:fingerprint())
    assert.is_truthy(error_of(t.argmax, t):find("2 rows"))
  end)

  it("builds from nested tables and from bytes", function()
    local n = ember.tensor(2, 3, { { 1, -2, 3 }, { -4, 5, 6 } })
    assert.are.equal(t:sha256(), n:sha256())
    local b = ember.tensor_from_bytes(t:bytes(), 3, 2)
    assert.are.same({ 3, 2 }, b:shape())
    assert.are.equal(t:sha256(), b:sha256())
    assert.are.same({ 0, 0, 0, 0 }, ember.tensor(2, 2):values())
  end)

  it("clones and copies rows independently", function()
    local c = t:clone()
    c:set(1, 1, 100)
    assert.are.equal(1, t:get(1, 1))
    local r = t:row(2)
    assert.are.same({ 1, 3 }, r:shape())
    assert.are.same({ -4, 5, 6 }, r:values())
    r:set(1, 1, 0)
    assert.are.equal(-4, t:get(2, 1))
  end)

  it("writes in place: set, zero, scale, add, copy_from", function()
    t:set(1, 2, 0.5)
    assert.are.equal(0.5, t:get(1, 2))
    t:scale(2)
    assert.are.same({ 2, 1, 6, -8, 10, 12 }, t:values())
    t:add(ember.tensor(2, 3, { 1, 1, 1, 1, 1, 1 }))
    assert.are.same({ 3, 2, 7, -7, 11, 13 }, t:values())
    t:add(ember.tensor(1, 3, { 1, 2, 3 }), -1) -- one row broadcast over every row, scaled
    assert.are.same({ 2, 0, 4, -8, 9, 10 }, t:values())
    t:add(0.5)
    assert.are.same({ 2.5, 0.5, 4.5, -7.5, 9.5, 10.5 }, t:values())
    t:copy_from(ember.tensor(2, 3, vals))
    assert.are.same(vals, t:values())
    t:zero()
    assert.are.same({ 0, 0, 0, 0, 0, 0 }, t:values())
  end)

  it("refuses shape mismatches, naming both shapes", function()
    local msg = error_of(t.copy_from, t, ember.tensor(3, 2))
    assert.is_truthy(msg:find("[2, 3]", 1, true) and msg:find("[3, 2]", 1, true), msg)
    msg = error_of(t.add, t, ember.tensor(2, 2))
    assert.is_truthy(msg:find("[2, 3]", 1, true) and msg:find("[2, 2]", 1, true), msg)
  end)

  it("raises clear errors for bad arguments", function()
    assert.is_truthy(error_of(t.get, t, 3, 1):find("row 3 out of range 1..2"))
    assert.is_truthy(error_of(t.get, t, 1, 0):find("column 0 out of range 1..3"))
    assert.is_truthy(error_of(ember.tensor, 2, 3, { 1, 2 }):find("expected 6 values, got 2"))
    assert.is_truthy(error_of(ember.tensor, 0, 3):find("rows, cols >= 1"))
    assert.is_truthy(error_of(ember.tensor, 1, 2, { 1, "x" }):find("not a number"))
    assert.is_truthy(error_of(ember.tensor_from_bytes, "abc", 1, 1):find("3 bytes given"))
    assert.is_truthy(error_of(t.l2_norm, {}):find("ember.Tensor or ember.TensorView"))
  end)

  it("prints shape, dtype, a few values and the L2 norm", function()
    local s = tostring(t)
    assert.is_truthy(s:find("ember.Tensor[2, 3] f32", 1, true), s)
    assert.is_truthy(s:find("-4", 1, true) and s:find("l2=9.539", 1, true), s)
  end)
end)

local model_path, model_why = fx.api_model()

describe("ember.Model and ember.Session", function()
  if not model_path then
    pending(model_why)
    return
  end
  local model
  setup(function() model = ember.load { model = model_path, kernels = "reference" } end)
  teardown(function() if model then model:close() end end)

  it("reports model.info", function()
    local i = model.info
    assert.are.equal("llama", i.family)
    local keys = { "n_layers", "hidden_size", "n_vocab", "n_heads", "n_kv_heads", "head_dim", "context_length",
      "threads" }
    for _, k in ipairs(keys) do
      assert.are.equal("integer", math.type(i[k]), k)
    end
    assert.are.equal("reference", i.kernels)
    assert.is_boolean(i.experimental)
    assert.is_string(i.dtype_summary)
    assert.is_truthy(tostring(model):find("ember.Model(llama", 1, true))
    assert.are.equal(0, i.repacked_bytes) -- the reference reads the file layout
  end)

  it("reports the weights repacked at load by a SIMD set", function()
    local q8_path = fx.tiny_model("--family llama --dtype q8_0 --layers 2 --seed 7")
    if not q8_path then return pending("build/make-tiny-model is missing") end
    local fast = ember.load { model = q8_path, kernels = "auto" }
    local i = fast.info
    fast:close()
    if i.kernels == "reference" then return pending("no SIMD kernel set on this CPU") end
    -- every Q8_0 matrix, padded to whole 4-row groups and 8-block spans: at least the bytes of
    -- the output head alone (n_vocab rows of hidden_size / 32 blocks of 34 bytes)
    assert.is_true(i.repacked_bytes >= i.n_vocab * i.hidden_size // 32 * 34)
    -- f32 weights are read in place
    local f32 = ember.load { model = model_path, kernels = "auto" }
    assert.are.equal(0, f32.info.repacked_bytes)
    f32:close()
  end)

  it("refuses bad load options with clear messages", function()
    assert.is_truthy(error_of(ember.load, { model = model_path, kernel = "reference" }):find("did you mean 'kernels'"))
    assert.is_truthy(error_of(ember.load, { model = model_path, kernels = "fast" }):find("option 'kernels'"))
    assert.is_truthy(error_of(ember.load, { model = "/nonexistent/m.gguf" }):find("/nonexistent/m.gguf", 1, true))
    assert.is_truthy(error_of(ember.load, { kernels = "auto" }):find("'model'"))
    assert.is_truthy(error_of(ember.load, { model = model_path, arch = "gpt2" }):find("gpt2"))
  end)

  it("prefills and decodes with a KV cache", function()
    local n_vocab = model.info.n_vocab
    local s = model:session { context = 16 }
    assert.are.equal(0, s.position)
    local l1 = s:prefill({ 1, 2, 3 })
    assert.are.same({ 1, n_vocab }, l1:shape())
    assert.are.equal(3, s.position)
    local l2 = s:decode(4)
    assert.are.equal(4, s.position)
    assert.are_not.equal(l1:sha256(), l2:sha256())
    -- the same four tokens in one prefill give the same last logits (within float rounding)
    local s2 = model:session { context = 16 }
    local l3 = s2:prefill({ 1, 2, 3, 4 })
    local d = l3:clone():add(l2, -1):abs_max()
    assert.is_true(d <= 1e-4 * l2:abs_max(), "prefill vs decode differ by " .. d)
    s:reset()
    assert.are.equal(0, s.position)
    assert.are.equal(l1:sha256(), s:prefill({ 1, 2, 3 }):sha256())
    s:close()
    s2:close()
  end)

  it("checks token ids and the context size", function()
    local s = model:session { context = 4 }
    local n_vocab = model.info.n_vocab
    assert.is_truthy(error_of(s.prefill, s, { 1, n_vocab }):find("outside the vocabulary"))
    assert.is_truthy(error_of(s.prefill, s, {}):find("empty"))
    assert.is_truthy(error_of(s.prefill, s, { 1, 1.5 }):find("not an integer"))
    assert.is_truthy(error_of(s.decode, s, -1):find("outside the vocabulary"))
    s:prefill({ 1, 2, 3, 4 })
    assert.is_truthy(error_of(s.decode, s, 1):find("context is full"))
    assert.is_truthy(error_of(model.session, model, { contxt = 4 }):find("did you mean 'context'"))
    s:close()
  end)

  it("closes idempotently and refuses use after close", function()
    local m = ember.load { model = model_path, kernels = "reference" }
    local s = m:session()
    s:close()
    s:close()
    assert.is_true(s.closed)
    assert.are.equal("attempt to use a closed session", error_of(s.prefill, s, { 1 }))
    assert.are.equal("ember.Session (closed)", tostring(s))
    m:close()
    m:close()
    assert.is_true(m.closed)
    assert.are.equal("attempt to use a closed model", error_of(m.session, m))
    assert.are.equal("attempt to use a closed model", error_of(function() return m.info end))
    assert.are.equal("ember.Model (closed)", tostring(m))
  end)

  it("supports <close> and keeps the model alive while a session needs it", function()
    local s
    do
      local m <close> = ember.load { model = model_path, kernels = "reference" }
      s = m:session()
      s:prefill({ 1 })
    end
    -- the model was closed by <close>: its sessions refuse to run, and nothing crashes
    assert.is_truthy(error_of(s.decode, s, 2):find("closed model"))
    s = nil
    collectgarbage()
    collectgarbage()
    -- a model only reachable through its session survives garbage collection
    local s2 = ember.load({ model = model_path, kernels = "reference" }):session()
    collectgarbage()
    collectgarbage()
    assert.are.same({ 1, model.info.n_vocab }, s2:prefill({ 1, 2 }):shape())
    assert.are.equal("llama", s2.model.info.family)
  end)

  it("generates greedily and reproducibly from ids", function()
    local a = model:generate { ids = { 1, 2, 3 }, max_tokens = 5, eos = false }
    local b = model:generate { ids = { 1, 2, 3 }, max_tokens = 5, eos = false }
    assert.are.equal(5, #a.ids)
    assert.are.same(a.ids, b.ids)
    assert.are.same({ 1, 2, 3 }, a.prompt_ids)
    assert.is_false(a.modified)
    assert.are.equal("max_tokens", a.stop)
    assert.are.equal(a.logits:sha256(), b.logits:sha256())
    for _, k in ipairs({ "prefill_ms", "decode_ms", "prefill_tok_s", "decode_tok_s" }) do
      assert.is_number(a.stats[k], k)
    end
    -- one decode evaluation per generated token, the last one included (SPEC §4.1)
    assert.are.equal(#a.ids, a.stats.decode_count)
    -- a seeded sampler is reproducible too
    local c = model:generate { ids = { 1, 2, 3 }, max_tokens = 5, temperature = 0.8, top_k = 20, seed = 42,
      eos = false }
    local d = model:generate { ids = { 1, 2, 3 }, max_tokens = 5, temperature = 0.8, top_k = 20, seed = 42,
      eos = false }
    assert.are.same(c.ids, d.ids)
  end)

  it("streams ids to on_token and stops when it returns false", function()
    local seen = {}
    local out = model:generate { ids = { 1, 2 }, max_tokens = 6, eos = false,
      on_token = function(id) seen[#seen + 1] = id; return #seen < 3 end }
    assert.are.same(out.ids, seen)
    assert.are.equal(3, #seen)
    assert.are.equal("callback", out.stop)
  end)

  it("refuses bad generate options", function()
    assert.is_truthy(error_of(model.generate, model, { ids = { 1 }, max_token = 3 }):find("did you mean 'max_tokens'"))
    assert.is_truthy(error_of(model.generate, model, { max_tokens = 3 }):find("ids="))
    assert.is_truthy(error_of(model.generate, model, { ids = { 1 }, temperature = -1 }):find("temperature"))
    assert.is_truthy(error_of(model.generate, model, { ids = { 1 }, on_token = 5 }):find("on_token"))
  end)

  it("tokenizes and generates from a prompt with the model's tokenizer", function()
    local tok = model.tokenizer
    if not tok then
      pending("the API-spec model has no embedded tokenizer")
      return
    end
    local ids = model:tokenize("hello world")
    assert.is_true(#ids > 0)
    assert.are.same(ids, tok:encode("hello world"))
    local pieces = {}
    local out = model:generate { prompt = "hello world", max_tokens = 3, eos = false,
      on_token = function(_, piece) pieces[#pieces + 1] = piece end }
    assert.are.same(ids, out.prompt_ids)
    assert.are.equal(model:detokenize(out.ids), out.text)
    assert.are.equal(out.text, table.concat(pieces))
  end)
end)

-- ---- the hook contract ----------------------------------------------------------------------

local HOOKS = { "on_model_loaded", "before_prefill", "before_layer", "after_attention", "after_mlp", "after_layer",
  "before_logits", "after_logits", "on_generation_complete" }
local LAYER_STAGES = { "before_layer", "after_attention", "after_mlp", "after_layer" }

-- An experiment that records every call: hook, phase, layer, context numbers and view shape.
local function logger(name)
  local log = {}
  local exp = { name = name or "logger", log = log }
  for _, h in ipairs(HOOKS) do
    exp[h] = function(self, ctx, view)
      assert.are.equal(exp, self)
      local rec = { hook = h, phase = ctx.phase, layer = ctx.layer_index, start = ctx.start_position,
        count = ctx.input_token_count, seq = ctx.sequence_length }
      if ctx.token_position then rec.token_position = ctx:token_position() end
      if view then rec.shape = view:shape() end
      if h == "on_generation_complete" then
        rec.prompt = ctx.prompt_token_count
        rec.generated = ctx.generated_token_count
        rec.decodes = ctx.decode_count
      end
      if h == "on_model_loaded" then rec.family, rec.n_layers = ctx.family, ctx.n_layers end
      log[#log + 1] = rec
    end
  end
  return exp
end

describe("experiments", function()
  if not model_path then
    pending(model_why)
    return
  end
  local model, L, H, V
  local prompt = { 1, 2, 3, 4, 5 }
  setup(function()
    model = ember.load { model = model_path, kernels = "reference" }
    L, H, V = model.info.n_layers, model.info.hidden_size, model.info.n_vocab
  end)
  teardown(function() model:close() end)

  local function run(exp, n)
    return model:generate { ids = prompt, max_tokens = n or 3, eos = false, experiment = exp, all_logits = true }
  end

  local function logits_hashes(out)
    local h = {}
    for i, t in ipairs(out.all_logits) do h[i] = t:sha256() end
    return h
  end

  it("calls every hook in the documented order with correct contexts", function()
    local P, N = #prompt, 3
    local exp = logger()
    local out = run(exp, N)
    assert.are.equal(N, #out.ids)
    local expected = { { hook = "on_model_loaded" },
      { hook = "before_prefill", phase = "prefill", start = 0, count = P, seq = P } }
    -- prefill, then one decode evaluation per generated token (SPEC §4.1)
    for e = 0, N do
      local phase = e == 0 and "prefill" or "decode"
      local start = e == 0 and 0 or P + e - 1
      local count = e == 0 and P or 1
      local tp = count == 1 and start or nil
      for l = 0, L - 1 do
        for _, st in ipairs(LAYER_STAGES) do
          expected[#expected + 1] = { hook = st, phase = phase, layer = l, start = start, count = count,
            seq = start + count, token_position = tp, shape = { count, H } }
        end
      end
      expected[#expected + 1] = { hook = "before_logits", phase = phase, start = start, count = count,
        seq = start + count, token_position = tp, shape = { 1, H } }
      expected[#expected + 1] = { hook = "after_logits", phase = phase, start = start, count = count,
        seq = start + count, token_position = tp, shape = { 1, V } }
    end
    expected[#expected + 1] = { hook = "on_generation_complete", prompt = P, generated = N, decodes = N }
    assert.are.equal(#expected, #exp.log)
    assert.are.equal(2 + (N + 1) * (4 * L + 2) + 1, #exp.log)
    for i, want in ipairs(expected) do
      local got = exp.log[i]
      assert.are.equal(want.hook, got.hook, "call " .. i)
      for k, v in pairs(want) do assert.are.same(v, got[k], string.format("call %d (%s) field %s", i, want.hook, k)) end
      if want.hook ~= "on_model_loaded" and want.hook ~= "on_generation_complete" and want.token_position == nil then
        assert.is_nil(got.token_position, "call " .. i)
      end
    end
    assert.are.equal("llama", exp.log[1].family)
    assert.are.equal(L, exp.log[1].n_layers)
  end)

  it("with only a name gives bit-identical ids and logits to no experiment", function()
    local base = run(nil, 4)
    local named = run({ name = "just-a-name" }, 4)
    assert.are.same(base.ids, named.ids)
    assert.are.same(logits_hashes(base), logits_hashes(named))
    assert.is_false(named.modified)
  end)

  it("that only reads leaves logits bit-identical and modified == false", function()
    local base = run(nil, 4)
    local norms = 0
    local exp = { name = "reader" }
    local stages = { "before_layer", "after_attention", "after_mlp", "after_layer", "before_logits", "after_logits" }
    for _, st in ipairs(stages) do
      exp[st] = function(_, _, v)
        norms = norms + v:l2_norm() + v:abs_max()
        v:get(1, 1)
        v:values()
        v:sha256()
        v:fingerprint()
        v:clone()
      end
    end
    local out = run(exp, 4)
    assert.is_true(norms > 0)
    assert.are.same(logits_hashes(base), logits_hashes(out))
    assert.is_false(out.modified)
  end)

  it("zeroing after_mlp at one layer changes the logits and sets modified", function()
    local N = 3
    local base = run(nil, N)
    local hits = 0
    local out = run({ name = "zero-mlp", after_mlp = function(_, ctx, v)
      if ctx.layer_index == 0 then
        v:zero()
        hits = hits + 1
      end
    end }, N)
    assert.are.equal(1 + N, hits) -- prefill + one decode per generated token
    assert.is_true(out.modified)
    assert.are_not.equal(base.all_logits[1]:sha256(), out.all_logits[1]:sha256())
  end)

  it("a failing hook stops the generation with the documented message", function()
    local exp = logger("fail-here")
    local inner = exp.after_attention
    exp.after_attention = function(self, ctx, v)
      inner(self, ctx, v)
      if ctx.phase == "decode" and ctx.layer_index == 1 then error("expected a finite activation", 0) end
    end
    local msg = error_of(run, exp, 4)
    assert.are.equal("experiment 'fail-here' failed in after_attention (phase=decode, layer=1): "
      .. "expected a finite activation", msg)
    local last = exp.log[#exp.log]
    assert.are.equal("after_attention", last.hook)
    assert.are.equal(1, last.layer)
    for _, rec in ipairs(exp.log) do assert.are_not.equal("on_generation_complete", rec.hook) end
  end)

  it("names phase only where it applies, and layer only for per-layer hooks", function()
    assert.are.equal("experiment 'e' failed in on_model_loaded: boom",
      error_of(run, { name = "e", on_model_loaded = function() error("boom", 0) end }))
    assert.are.equal("experiment 'e' failed in before_prefill (phase=prefill): boom",
      error_of(run, { name = "e", before_prefill = function() error("boom", 0) end }))
    assert.are.equal("experiment 'e' failed in after_logits (phase=prefill): boom",
      error_of(run, { name = "e", after_logits = function() error("boom", 0) end }))
    assert.are.equal("experiment 'e' failed in on_generation_complete: boom",
      error_of(run, { name = "e", on_generation_complete = function() error("boom", 0) end }))
    local msg = error_of(run, { name = "e", before_layer = function() error("with position") end })
    assert.is_truthy(msg:find("^experiment 'e' failed in before_layer %(phase=prefill, layer=0%): "
      .. ".*api_spec.lua:%d+: with position$"), msg)
    msg = error_of(run, { name = "e", before_layer = function() error({}) end })
    assert.are.equal("experiment 'e' failed in before_layer (phase=prefill, layer=0): "
      .. "(error object is a table value)", msg)
  end)

  it("expires views when the hook returns", function()
    local kept, kept_row
    local out = run({ name = "keeper", after_layer = function(_, ctx, v)
      if not kept then
        kept, kept_row = v, v:row(1)
      end
    end }, 2)
    assert.is_false(out.modified)
    local expired = "attempt to use an expired view (it was valid only inside the hook call that received it)"
    assert.is_truthy(error_of(kept.get, kept, 1, 1):find(expired, 1, true))
    assert.is_truthy(error_of(kept_row.values, kept_row):find(expired, 1, true))
    assert.is_truthy(error_of(kept.zero, kept):find(expired, 1, true))
    assert.is_true(kept:expired())
    assert.are.equal("ember.TensorView (expired)", tostring(kept))
    collectgarbage()
    collectgarbage()
    assert.is_truthy(error_of(kept.l2_norm, kept):find(expired, 1, true))
  end)

  it("a view kept from an earlier hook call fails cleanly inside a later one", function()
    local first
    local msg = error_of(run, { name = "stale", before_layer = function(_, ctx, v)
      if not first then
        first = v
      else
        first:get(1, 1)
      end
    end })
    assert.is_truthy(msg:find("^experiment 'stale' failed in before_layer %(phase=prefill, layer=1%): "
      .. ".*expired view"), msg)
  end)

  it("refuses writes of the wrong shape inside a hook", function()
    local msg = error_of(run, { name = "wrong-shape", after_mlp = function(_, _, v)
      v:copy_from(ember.tensor(1, 3))
    end })
    assert.is_truthy(msg:find("failed in after_mlp (phase=prefill, layer=0): ", 1, true), msg)
    assert.is_truthy(msg:find("shape mismatch: target is [" .. #prompt .. ", " .. H .. "], source is [1, 3]", 1,
      true), msg)
  end)

  it("makes contexts read-only", function()
    local msg = error_of(run, { name = "assign", before_layer = function(_, ctx) ctx.layer_index = 3 end })
    assert.is_truthy(msg:find("attempt to assign to read-only context field 'layer_index'", 1, true), msg)
    msg = error_of(run, { name = "assign", on_model_loaded = function(_, ctx) ctx.family = "gpt2" end })
    assert.is_truthy(msg:find("read-only context field 'family'", 1, true), msg)
  end)

  it("refuses experiments that could silently not run", function()
    local msg = error_of(run, { name = "typo", after_mpl = function() end })
    assert.is_truthy(msg:find("'after_mpl', which is not a hook (did you mean 'after_mlp'?)", 1, true), msg)
    -- class-style experiments are inspected through __index too
    local class = { before_layr = function() end }
    class.__index = class
    msg = error_of(run, setmetatable({ name = "typo2" }, class))
    assert.is_truthy(msg:find("did you mean 'before_layer'", 1, true), msg)
    assert.is_truthy(error_of(run, { name = "bad", after_mlp = 5 })
      :find("hook 'after_mlp' must be a function, got number", 1, true))
    assert.is_truthy(error_of(run, { after_mlp = function() end }):find("non-empty 'name'", 1, true))
    assert.is_truthy(error_of(run, "not a table"):find("experiment must be a table", 1, true))
  end)

  it("calls methods inherited through a metatable", function()
    local calls = 0
    local class = { after_logits = function() calls = calls + 1 end }
    class.__index = class
    local N = 2
    run(setmetatable({ name = "inherited" }, class), N)
    assert.are.equal(1 + N, calls) -- prefill + one decode per generated token
  end)

  it("runs tensor hooks on session evaluations and refuses re-entry into the busy session", function()
    local s = model:session { context = 16 }
    local calls = 0
    s:prefill({ 1, 2 }, { experiment = { name = "count", after_logits = function() calls = calls + 1 end } })
    s:decode(3, { experiment = { name = "count", after_logits = function() calls = calls + 1 end } })
    assert.are.equal(2, calls)
    local msg = error_of(s.decode, s, 4,
      { experiment = { name = "reenter", after_layer = function() s:decode(5) end } })
    assert.is_truthy(msg:find("failed in after_layer (phase=decode, layer=0): ", 1, true), msg)
    assert.is_truthy(msg:find("busy", 1, true), msg)
    -- the failed evaluation left the session usable at its old position
    assert.are.equal(3, s.position)
    assert.are.same({ 1, V }, s:decode(4):shape())
    s:close()
  end)

  it("survives garbage collection and model close inside hooks", function()
    local m = ember.load { model = model_path, kernels = "reference" }
    local out = m:generate { ids = prompt, max_tokens = 3, eos = false, experiment = {
      name = "gc",
      after_layer = function() collectgarbage() end,
      after_logits = function(_, ctx) if ctx.phase == "decode" then m:close() end end,
    } }
    assert.are.equal(3, #out.ids)
    assert.is_true(m.closed)
  end)

  it("views write through to the engine: patching restores a zeroed run bit for bit", function()
    -- capture layer 0's MLP output, zero it in a second run, then patch the capture back
    local captured = {}
    local base = run({ name = "capture", after_mlp = function(_, ctx, v)
      if ctx.layer_index == 0 then captured[#captured + 1] = v:clone() end
    end }, 3)
    local i = 0
    local patched = run({ name = "patch", after_mlp = function(_, ctx, v)
      if ctx.layer_index == 0 then
        i = i + 1
        v:zero()
        v:copy_from(captured[i])
      end
    end }, 3)
    assert.is_true(patched.modified)
    assert.are.same(logits_hashes(base), logits_hashes(patched))
  end)
end)

teardown(function() fx.cleanup() end)
