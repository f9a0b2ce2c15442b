-- Structured tracing, value fingerprints and layer/logits dumps (docs/inspection.md): identical
-- runs give identical normalized fingerprints and byte-identical dumps; a zeroed layer changes the
-- fingerprint and exactly the dumps from that layer on; a fast-path and a reference trace have the
-- same structure and name every product's kernel; dumps under an experiment are refused.

local ember = require("ember")
local fx = require("helpers.fixtures")
local H = require("helpers.cli")
local fs = require("ember.store.fs")

local read = require("helpers.files").read

local fnv1a64 = require("helpers.fnv").fnv1a64

-- The engine's events of a trace file, each as a table of its fields (strings kept as strings,
-- numbers through tonumber: the fingerprints are hex strings, so nothing is rounded).
local function events(path)
  local list = {}
  for line in io.lines(path) do
    local ev = {}
    for k, v in line:gmatch('"([%w_]+)":("?[^,"}]*"?)') do
      ev[k] = v:sub(1, 1) == '"' and v:sub(2, -2) or tonumber(v) or v
    end
    if ev.event ~= "trace_start" and ev.event ~= "trace_end" then list[#list + 1] = ev end
  end
  return list
end

local function structure(ev)
  return table.concat({ ev.event, tostring(ev.eval), tostring(ev.phase), tostring(ev.layer), tostring(ev.op),
    tostring(ev.rows), tostring(ev.cols) }, "|")
end

-- The trace file without its timings: what the normalized fingerprint covers, line by line.
local function normalized_lines(path)
  local out = {}
  for line in io.lines(path) do
    if not line:find('"event":"trace_', 1, true) then out[#out + 1] = (line:gsub(',"ms":[%d.]+', "")) end
  end
  return out
end

local tmp
before_each(function() tmp = fs.make_temp_dir("ember-trace-spec") end)
after_each(function() if tmp then fs.remove_tree(tmp) end end)

local function p(name) return fs.join(tmp, name) end

describe("value fingerprints", function()
  it("ember.fingerprint(t) is FNV-1a 64 of the tensor's little-endian f32 bytes", function()
    local t = ember.tensor(2, 3, { { 1.5, -2.0, 0.0 }, { 3.25, -0.0, 7.0 } })
    assert.are.equal(fnv1a64(t:bytes()), ember.fingerprint(t))
    assert.are.equal(t:fingerprint(), ember.fingerprint(t))
    -- +0 and -0 are different bit patterns, so different fingerprints
    assert.are_not.equal(ember.fingerprint(ember.tensor(1, 1, { 0.0 })),
      ember.fingerprint(ember.tensor(1, 1, { -0.0 })))
    assert.has_error(function() ember.fingerprint({}) end,
      "bad argument #1 to 'fingerprint' (ember.Tensor or ember.TensorView expected, got table)")
  end)
end)

describe("--trace", function()
  it("writes one event per op with a stable field order, and two identical runs give the same fingerprint", function()
    local model = H.need_model()
    local fps = {}
    for i = 1, 2 do
      local code, _, err = H.ember("--model", model, "--prompt", "hello there", "--max-tokens", "3",
        "--trace", p("t" .. i .. ".jsonl"))
      assert.are.equal(0, code, err)
      fps[i] = err:match("normalized fingerprint (%x+)")
      assert.is_truthy(fps[i], err)
    end
    assert.are.equal(fps[1], fps[2])
    assert.are.same(normalized_lines(p("t1.jsonl")), normalized_lines(p("t2.jsonl")))
    -- the normalized fingerprint is FNV-1a over the lines without their timings, recomputed here
    local text = table.concat(normalized_lines(p("t1.jsonl")), "\n") .. "\n"
    assert.are.equal(fps[1], string.format("%016x", fnv1a64(text)))
    -- the summary line repeats it; the field order of an op line is fixed
    local last
    for line in io.lines(p("t1.jsonl")) do last = line end
    assert.is_truthy(last:find('"fingerprint":"' .. fps[1] .. '"', 1, true))
    local evs = events(p("t1.jsonl"))
    -- 3 generated tokens: one prefill and 3 decodes (the last token is fed back too)
    assert.are.equal(1 + 3, #(function() local s = {}; for _, e in ipairs(evs) do
      if e.event == "eval_start" then s[#s + 1] = e end end; return s end)())
    for line in io.lines(p("t1.jsonl")) do
      if line:find('"event":"op"', 1, true) then
        local keys = {}
        for k in line:gmatch('"([%w_]+)":') do keys[#keys + 1] = k end
        local want = line:find('"act"', 1, true)
          and "event,eval,phase,layer,op,rows,cols,kernel,act,fingerprint"
          or "event,eval,phase,layer,op,rows,cols,kernel,fingerprint"
        assert.are.equal(want, table.concat(keys, ","))
      end
    end
  end)

  it("is identical run to run for every family (Gemma 4 and GPT-2 included)", function()
    for _, family in ipairs({ "gemma4", "gpt2", "qwen3", "qwen2" }) do
      local model = fx.tiny_model("--family " .. family .. " --dtype q8_0 --seed 2")
      if not model then pending("make-tiny-model unavailable") return end
      local fps = {}
      for i = 1, 2 do
        local code, _, err = H.ember("--model", model, "--prompt", "hello there", "--max-tokens", "2", "--trace",
          p(family .. i .. ".jsonl"))
        assert.are.equal(0, code, err)
        fps[i] = err:match("normalized fingerprint (%x+)")
      end
      assert.is_truthy(fps[1])
      assert.are.equal(fps[1], fps[2], family)
      assert.are.same(normalized_lines(p(family .. "1.jsonl")), normalized_lines(p(family .. "2.jsonl")))
    end
  end)

  it("names every op the engine emits in ember.trace.OPS, and nothing it never emits", function()
    local seen = {}
    local models = { H.need_model() }
    for _, family in ipairs({ "gemma4", "gpt2", "qwen3", "qwen2" }) do
      models[#models + 1] = fx.tiny_model("--family " .. family .. " --dtype q8_0 --seed 2")
    end
    for i, model in ipairs(models) do
      local code, _, err = H.ember("--model", model, "--prompt", "hello there", "--max-tokens", "1", "--trace",
        p("all" .. i .. ".jsonl"))
      assert.are.equal(0, code, err)
      for _, e in ipairs(events(p("all" .. i .. ".jsonl"))) do
        if e.event == "op" then seen[e.op] = true end
      end
    end
    local listed = {}
    for _, name in ipairs(require("ember.model.trace").OPS) do
      listed[name] = true
      assert.is_true(seen[name] == true, "listed but never emitted: " .. name)
    end
    for name in pairs(seen) do assert.is_true(listed[name] == true, "emitted but not listed: " .. name) end
  end)

  it("--trace-layers and --trace-ops keep exactly the lines of the whole trace that pass the filter", function()
    local model = fx.tiny_model("--family qwen3 --dtype q8_0 --seed 2")
    if not model then pending("make-tiny-model unavailable") return end
    local function run(name, ...)
      local code, _, err = H.ember("--model", model, "--prompt", "hello there", "--max-tokens", "2", "--trace",
        p(name), ...)
      assert.are.equal(0, code, err)
      return err:match("normalized fingerprint (%x+)")
    end
    run("whole.jsonl")
    local keep_ops = { attn_q = true, ffn_down = true, output = true }
    local fp = run("part.jsonl", "--trace-layers", "1,3-4", "--trace-ops", "attn_q,ffn_down,output")
    -- the expectation: the whole trace's engine lines, filtered here
    local want = {}
    for _, line in ipairs(normalized_lines(p("whole.jsonl"))) do
      local op, layer = line:match('"op":"([%w_]+)"'), tonumber(line:match('"layer":(%-?%d+)'))
      if line:find('"event":"op"', 1, true) then
        local layer_ok = layer == -1 or layer == 1 or layer == 3 or layer == 4
        if layer_ok and keep_ops[op] then want[#want + 1] = line end
      else
        want[#want + 1] = line
      end
    end
    local got = normalized_lines(p("part.jsonl"))
    assert.are.same(want, got)
    assert.is_true(#got > 3 * 2) -- some op lines stayed
    assert.are.equal(string.format("%016x", fnv1a64(table.concat(got, "\n") .. "\n")), fp)
    local head = io.open(p("part.jsonl")):read("l")
    assert.is_truthy(head:find('"layers":[1,3,4],"ops":["attn_q","ffn_down","output"]', 1, true), head)
  end)

  it("filters are usage errors without --trace, with an unknown op or a layer the model lacks", function()
    local model = H.need_model()
    local code, _, err = H.ember("--model", model, "--prompt", "x", "--trace-layers", "1")
    assert.are.equal(2, code)
    assert.is_truthy(err:find("--trace-layers needs --trace FILE.jsonl", 1, true), err)
    code, _, err = H.ember("--model", model, "--prompt", "x", "--trace", p("t.jsonl"), "--trace-ops", "attn_q,atn_k")
    assert.are.equal(2, code)
    assert.is_truthy(err:find("unknown trace op 'atn_k'", 1, true), err)
    code, _, err = H.ember("--model", model, "--prompt", "x", "--trace", p("t.jsonl"), "--trace-layers", "0,40")
    assert.are.equal(2, code)
    assert.is_truthy(err:find("--trace-layers: layer 40 is out of range", 1, true), err)
    assert.is_false(fs.exists(p("t.jsonl")))
    local m = ember.load({ model = model })
    assert.has_error(function() ember.trace(p("t.jsonl"), m, { ops = { "nope" } }) end)
    assert.has_error(function()
      m:generate({ prompt = "x", max_tokens = 1, trace = ember.trace(p("u.jsonl"), m),
        trace_filter = { layers = { 0 } } })
    end)
    m:close()
  end)

  it("is recorded in the run manifest with its normalized fingerprint", function()
    local code, _, err = H.ember("--model", H.need_model(), "--prompt", "hi", "--max-tokens", "1", "--trace",
      p("t.jsonl"), "--run-manifest", p("run.json"))
    assert.are.equal(0, code, err)
    local doc = require("cjson").decode(read(p("run.json")))
    assert.are.equal(p("t.jsonl"), doc.outputs.trace)
    assert.are.equal(err:match("normalized fingerprint (%x+)"), doc.outputs.trace_fingerprint)
  end)

  it("refuses a directory or a missing directory as its file, before the model loads", function()
    local code, _, err = H.ember("--model", p("none.gguf"), "--prompt", "x", "--trace", tmp)
    assert.are.equal(2, code)
    assert.is_truthy(err:find("--trace: '" .. tmp .. "' is a directory", 1, true), err)
    code, _, err = H.ember("--model", p("none.gguf"), "--prompt", "x", "--trace", p("no/such/t.jsonl"))
    assert.are.equal(2, code)
    assert.is_truthy(err:find("--trace: directory '" .. p("no/such") .. "' does not exist", 1, true), err)
    -- the logits dump's sidecar never replaces an existing file
    local f = assert(io.open(p("l.json"), "w"))
    f:write("keep")
    f:close()
    code, _, err = H.ember("--model", p("none.gguf"), "--prompt", "x", "--dump-logits", p("l.safetensors"))
    assert.are.equal(2, code)
    assert.is_truthy(err:find("already exists and would be overwritten", 1, true), err)
    assert.are.equal("keep", read(p("l.json")))
  end)

  it("a zeroed layer changes the fingerprint, and the trace agrees with the run up to that layer", function()
    local model = H.need_model()
    assert.are.equal(0, (H.ember("--model", model, "--prompt", "hello there", "--max-tokens", "2", "--trace",
      p("a.jsonl"))))
    local code, _, err = H.ember("--model", model, "--prompt", "hello there", "--max-tokens", "2", "--trace",
      p("b.jsonl"), "--zero-layer-output", "3:attention")
    assert.are.equal(0, code, err) -- tracing may run with an experiment
    local a, b = events(p("a.jsonl")), events(p("b.jsonl"))
    assert.are.equal(#a, #b)
    local first
    for i = 1, #a do
      assert.are.equal(structure(a[i]), structure(b[i]))
      if first == nil and a[i].fingerprint ~= b[i].fingerprint then first = b[i] end
    end
    -- the hook zeroes layer 3's attention output after the product: the residual add is the first change
    assert.are.equal("prefill", first.phase)
    assert.are.equal(3, first.layer)
    assert.are.equal("attn_residual", first.op)
    assert.are_not.equal(err:match("normalized fingerprint (%x+)"), nil)
  end)

  it("a fast-path and a reference trace have the same events and name every product's kernel", function()
    local model = H.need_model() -- Q8_0: the fast path quantizes activations to Q8_0
    assert.are.equal(0, (H.ember("--model", model, "--prompt", "hello", "--max-tokens", "2", "--trace", p("f.jsonl"))))
    assert.are.equal(0, (H.ember("--model", model, "--prompt", "hello", "--max-tokens", "2", "--kernels", "reference",
      "--trace", p("r.jsonl"))))
    local f, r = events(p("f.jsonl")), events(p("r.jsonl"))
    assert.are.equal(#f, #r)
    local set = read(p("f.jsonl")):match('"kernels":"(%w+)"') -- the set auto chose (the trace's header)
    local products, first_diff = 0, nil
    for i = 1, #f do
      assert.are.equal(structure(f[i]), structure(r[i]))
      if f[i].act then
        products = products + 1
        assert.are.equal("reference/q8_0", r[i].kernel)
        assert.are.equal("f32", r[i].act)
        if set ~= "reference" then
          assert.is_truthy(f[i].kernel:match("^" .. set .. "/q8_0"), f[i].kernel)
          assert.are.equal("q8_0", f[i].act)
        end
      end
      if first_diff == nil and f[i].fingerprint ~= r[i].fingerprint then first_diff = f[i] end
    end
    assert.is_true(products > 0)
    if set == "reference" then
      assert.is_nil(first_diff)
    else
      -- the embedding lookup is the reference's on every set: it agrees; the first difference is
      -- where the documented numerics differ (a set's own kernel: its reduction order, or a Q8_0 product)
      assert.are.equal(f[1].fingerprint, r[1].fingerprint)
      assert.is_truthy(first_diff)
      assert.are_not.equal("reference", first_diff.kernel)
    end
  end)

  it("avx2 and avx512 traces agree in every value (the sets are bit-identical)", function()
    local model = H.need_model()
    local code_a = H.ember("--model", model, "--prompt", "hello", "--max-tokens", "2", "--kernels", "avx2",
      "--trace", p("a2.jsonl"))
    local code_b = H.ember("--model", model, "--prompt", "hello", "--max-tokens", "2", "--kernels", "avx512",
      "--trace", p("a5.jsonl"))
    if code_a ~= 0 or code_b ~= 0 then
      pending("this CPU cannot run both avx2 and avx512")
      return
    end
    local a, b = events(p("a2.jsonl")), events(p("a5.jsonl"))
    assert.are.equal(#a, #b)
    for i = 1, #a do
      assert.are.equal(structure(a[i]), structure(b[i]))
      assert.are.equal(a[i].fingerprint, b[i].fingerprint, structure(a[i]))
    end
  end)
end)

describe("tracing from Lua", function()
  it("generate{trace=} writes the engine's events, ctx.tracing shows it read-only, hooks do not change it", function()
    local path = H.need_model()
    local m = ember.load({ model = path })
    local seen = {}
    local obs = { name = "obs", after_layer = function(_, ctx) seen[#seen + 1] = ctx.tracing end,
      before_prefill = function(_, ctx) seen.before = ctx.tracing end,
      on_generation_complete = function(_, ctx) seen.complete = ctx.tracing end }
    local plain = m:generate({ prompt = "hi", max_tokens = 2, trace = p("x.jsonl") })
    local with = m:generate({ prompt = "hi", max_tokens = 2, trace = p("y.jsonl"), experiment = obs })
    assert.are.equal(plain.trace.fingerprint, with.trace.fingerprint)
    assert.are.equal("enabled", seen[1])
    assert.are.equal("enabled", seen.before)
    assert.are.equal("enabled", seen.complete)
    seen = {}
    m:generate({ prompt = "hi", max_tokens = 1, experiment = obs })
    assert.are.equal("disabled", seen[1])
    assert.are.equal("disabled", seen.before)
    assert.are.equal("disabled", seen.complete)
    -- one trace over several generations, then finished by the caller
    local t = ember.trace(p("z.jsonl"), m)
    m:generate({ prompt = "hi", max_tokens = 2, trace = t })
    m:generate({ prompt = "hi", max_tokens = 2, trace = t })
    -- a hook cannot close the trace its own run writes into
    local closer = { name = "closer", after_layer = function() t:close() end }
    local ok, err = pcall(m.generate, m, { prompt = "hi", max_tokens = 1, trace = t, experiment = closer })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("cannot close a trace a running session writes into", 1, true), err)
    assert.is_false(t.closed)
    local s = t:finish()
    assert.are.equal(7, s.evaluations) -- the failed run's prefill started and is in the trace
    assert.is_true(t.closed)
    assert.has_error(function() m:generate({ prompt = "hi", trace = 3 }) end,
      "bad argument to 'generate' (trace must be an ember.Trace or a file path, got number)")
    m:close()
  end)

  it("ember.load{trace=} traces every generate of the model", function()
    local m = ember.load({ model = H.need_model(), trace = p("m.jsonl") })
    m:generate({ prompt = "hi", max_tokens = 1 })
    local s = m.trace:finish()
    assert.are.equal(2, s.evaluations)
    assert.is_truthy(read(p("m.jsonl")):find('"event":"trace_end"', 1, true))
    m:close()
  end)
end)

describe("--dump-layers and --dump-logits", function()
  local function dump(model, name, max_tokens)
    local code, _, err = H.ember("--model", model, "--prompt", "hello there", "--max-tokens", max_tokens or "3",
      "--dump-layers", p(name), "--dump-logits", p(name .. ".safetensors"))
    assert.are.equal(0, code, err)
  end

  it("are byte-identical across two identical runs (llama Q8_0 and Gemma 4)", function()
    local gemma = fx.tiny_model("--family gemma4 --dtype f32 --seed 3")
    if not gemma then pending("make-tiny-model unavailable") return end
    for _, model in ipairs({ H.need_model(), gemma }) do
      dump(model, "a")
      dump(model, "b")
      local n = 0
      for name in io.popen("ls " .. fs.shell_quote(p("a"))):lines() do
        n = n + 1
        assert.are.equal(read(fs.join(p("a"), name)), read(fs.join(p("b"), name)), name)
      end
      assert.is_true(n >= 3)
      assert.are.equal(read(p("a.safetensors")), read(p("b.safetensors")))
      assert.are.equal(read(p("a.json")):gsub('"file": "a.safetensors"', ""),
        (read(p("b.json")):gsub('"file": "b.safetensors"', "")))
      for _, k in ipairs({ "a", "b" }) do
        fs.remove_tree(p(k)); os.remove(p(k .. ".safetensors")); os.remove(p(k .. ".json"))
      end
    end
  end)

  it("hold what an after_layer hook sees (read back with the safetensors reader)", function()
    local path = H.need_model()
    dump(path, "d")
    local m = ember.load({ model = path })
    local fps = {}
    m:generate({ prompt = "hello there", max_tokens = 3, experiment = { name = "see",
      after_layer = function(_, ctx, v) if ctx.layer_index == 2 then fps[#fps + 1] = v:fingerprint() end end } })
    m:close()
    local t = ember.load_tensors(fs.join(p("d"), "layer_02.safetensors"))
    assert.are.equal(4, #fps)
    for i = 1, 4 do assert.are.equal(fps[i], t[string.format("eval_%04d", i)]:fingerprint()) end
  end)

  it("leave nothing beside the outputs: the spilled views become the files", function()
    dump(H.need_model(), "d", "4")
    local list_dir = require("ember.core").internal.list_dir
    local names = list_dir(tmp)
    table.sort(names)
    assert.are.same({ "d", "d.json", "d.safetensors" }, names)
    for _, name in ipairs(list_dir(p("d"))) do
      assert.is_truthy(name == "dump.json" or name:match("^layer_%d%d%.safetensors$"), name)
    end
  end)

  it("of a run that fails part-way are not written, and its spilled views are removed", function()
    local m = ember.load({ model = H.need_model() })
    local dump = require("ember.run.dump")
    local obs = dump.observer({ layers = p("d"), logits = p("l.safetensors") })
    local calls = 0
    local failing = { name = "fail-in-decode", after_layer = function(_, ctx)
      if ctx.phase == "decode" and ctx.layer_index == 1 then
        calls = calls + 1
        error("stop here")
      end
    end }
    local ok, err = pcall(require("ember.run").execute, { model = m, prompt = "hello there",
      gen = { max_tokens = 3, temperature = 0 }, experiments = { failing }, dumps = { layers = p("d"),
      logits = p("l.safetensors"), observer = obs } })
    m:close()
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("stop here", 1, true), tostring(err))
    assert.are.equal(1, calls)
    -- neither outputs nor spills nor temporary directories
    assert.are.same({}, require("ember.core").internal.list_dir(tmp))
  end)

  it("of a model whose layer L is zeroed differ exactly from layer L on", function()
    -- layer 2's attention output projection set to zero in a copy of an f32 model: the same as
    -- zero_layer_output 2:attention, without an experiment (which dumps refuse)
    local src = fx.tiny_model("--family llama --dtype f32 --seed 5")
    if not src then pending("make-tiny-model unavailable") return end
    local m = ember.load({ model = src })
    local w = m:weight("blk.2.attn_output.weight")
    m:close()
    local bytes = w:bytes()
    local file = read(src)
    local at = file:find(bytes, 1, true)
    assert.is_truthy(at)
    assert.is_nil(file:find(bytes, at + 1, true))
    local zeroed = p("zeroed.gguf")
    local f = assert(io.open(zeroed, "wb"))
    f:write(file:sub(1, at - 1), string.rep("\0", #bytes), file:sub(at + #bytes))
    f:close()
    -- the prompt's evaluation only: decode steps would take different generated tokens as input
    dump(src, "a", "0")
    dump(zeroed, "z", "0")
    for l = 0, 5 do
      local name = string.format("layer_%02d.safetensors", l)
      local same = read(fs.join(p("a"), name)) == read(fs.join(p("z"), name))
      assert.are.equal(l < 2, same, name)
    end
    assert.are_not.equal(read(p("a.safetensors")), read(p("z.safetensors")))
  end)

  it("are refused together with an active experiment, before the model runs", function()
    for _, dump_flag in ipairs({ "--dump-layers", "--dump-logits" }) do
      for _, exp in ipairs({ { "--zero-layer-output", "1:mlp" }, { "--activation-stats", p("s.json") },
        { "--experiment", "scripts/experiments/activation_stats.lua" }, { "--capture-activations", p("cap") },
        { "--activation-patch", tmp, "--patch-target", "1:after_mlp" } }) do
        local code, _, err = H.ember("--model", p("no-such-model.gguf"), "--prompt", "x", dump_flag, p("out"),
          table.unpack(exp))
        assert.are.equal(2, code)
        assert.is_truthy(err:find(dump_flag:sub(3) .. " refuses active experiments (" .. exp[1] .. ")", 1, true), err)
        assert.is_truthy(err:find("pre- vs post-intervention", 1, true))
      end
    end
    assert.is_false(fs.exists(p("out")))
  end)
end)
