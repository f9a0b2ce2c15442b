-- spec/bad_input_spec.lua — the Lua side of the bad-input catalogue (tests/test_bad_input.c holds
-- the GGUF and engine cases): hostile tokenizer.json files, special files as inputs, a tokenizer
-- from another model, non-finite numerics through ember.load. Each case asserts the error family
-- (its stable prefix), that the message names the file and the field, and a bound on time and on
-- the Lua heap.

local ember = require("ember")
local tokenizer = require("ember.model.tokenizer")
local fx = require("helpers.fixtures")

local TIME_LIMIT = 5    -- seconds of CPU per case; each takes milliseconds
local HEAP_LIMIT_KB = 64 * 1024

local function write_temp(content, suffix)
  local path = os.tmpname()
  if suffix then
    os.remove(path)
    path = path .. suffix
  end
  local f = assert(io.open(path, "wb"))
  f:write(content)
  f:close()
  return path
end

-- Runs f, which must raise; returns the message after checking the bounds (heap_kb: a larger heap
-- bound for a case that decodes a real, large tokenizer.json).
local function error_within_bounds(f, heap_kb)
  collectgarbage()
  local heap0, t0 = collectgarbage("count"), os.clock()
  local ok, msg = pcall(f)
  local dt, heap = os.clock() - t0, collectgarbage("count") - heap0
  assert.is_false(ok, "expected an error")
  assert.is_true(dt < TIME_LIMIT, "took " .. dt .. " s")
  assert.is_true(heap < (heap_kb or HEAP_LIMIT_KB), "grew the Lua heap by " .. heap .. " KiB")
  return tostring(msg)
end

local function has(msg, ...)
  for _, s in ipairs({ ... }) do
    assert.is_truthy(msg:find(s, 1, true), "message lacks '" .. s .. "': " .. msg)
  end
end

-- A tiny valid BPE tokenizer.json with the pieces given spliced in.
local function tok_json(parts)
  parts = parts or {}
  return '{"model":{"type":' .. (parts.type or '"BPE"')
    .. ',"vocab":' .. (parts.vocab or '{"a":0,"b":1,"ab":2}')
    .. ',"merges":' .. (parts.merges or '["a b"]') .. '}'
    .. ',"added_tokens":' .. (parts.added or '[{"id":3,"content":"<s>","special":true}]') .. '}'
end

local function load_tok(content)
  local path = write_temp(content, ".json")
  return path, function() return tokenizer { file = path, config = false } end
end

describe("bad tokenizer.json files", function()
  it("a well-formed baseline loads and merges", function()
    local _, load = load_tok(tok_json())
    local tok = load()
    assert.are.same({ 2, 3 }, tok:encode("ab<s>", { special = true }))
  end)

  it("model.merges written as {} is refused, naming the field", function()
    local path, load = load_tok(tok_json { merges = "{}" })
    has(error_within_bounds(load), "ember.tokenizer: ", path, "model.merges must be an array", "object")
  end)

  it("model.merges as a non-empty object is refused", function()
    local path, load = load_tok(tok_json { merges = '{"x":"a b"}' })
    has(error_within_bounds(load), path, "model.merges must be an array")
  end)

  it("added_tokens written as {} is refused, naming the field", function()
    local path, load = load_tok(tok_json { added = "{}" })
    has(error_within_bounds(load), "ember.tokenizer: ", path, "added_tokens must be an array")
  end)

  it("a vocab id written as a string is refused", function()
    local path, load = load_tok(tok_json { vocab = '{"a":0,"b":"1","ab":2}' })
    has(error_within_bounds(load), path, "model.vocab['b'] must be an integer id", "string '1'")
  end)

  it("a fractional vocab id is refused", function()
    local path, load = load_tok(tok_json { vocab = '{"a":0,"b":1.5,"ab":2}' })
    has(error_within_bounds(load), path, "model.vocab['b'] must be an integer id", "1.5")
  end)

  it("an added token id written as a string is refused", function()
    local path, load = load_tok(tok_json { added = '[{"id":"3","content":"<s>","special":true}]' })
    has(error_within_bounds(load), path, "added_tokens[1].id must be an integer id")
  end)

  it("model.vocab written as an array is refused", function()
    local path, load = load_tok(tok_json { vocab = '["a","b"]', merges = "[]" })
    has(error_within_bounds(load), path, "model.vocab must be an object")
  end)

  it("a 60-byte file with one id 16,777,215 is refused quickly and small", function()
    local content = '{"model":{"type":"BPE","vocab":{"a":16777215},"merges":[]}}'
    assert.is_true(#content <= 60)
    local path, load = load_tok(content)
    has(error_within_bounds(load), path, "16777215", "contiguous")
  end)

  it("a merge naming a missing token names it (already held)", function()
    local path, load = load_tok(tok_json { merges = '["a c"]' })
    has(error_within_bounds(load), path, "merge 0", "'c'")
  end)

  it("control bytes in the file are escaped in the message", function()
    local path, load = load_tok(tok_json { type = '"\\u001b[2J"' })
    local msg = error_within_bounds(load)
    has(msg, path, "\\x1B[2J")
    assert.is_falsy(msg:find("\27", 1, true), "raw ESC in: " .. msg)
  end)

  it("invalid JSON is named as such without internal positions", function()
    local path, load = load_tok('{"model": ')
    local msg = error_within_bounds(load)
    has(msg, path, "invalid JSON")
    assert.is_falsy(msg:find("%.lua:%d+:"), msg)
  end)
end)

describe("special files as tokenizer inputs", function()
  it("a directory says it is a directory", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(os.execute("mkdir " .. dir))
    local msg = error_within_bounds(function() return tokenizer { file = dir } end)
    has(msg, "ember.tokenizer: ", dir, "is a directory")
    assert.is_falsy(msg:find("cjson", 1, true), msg)
    os.execute("rmdir " .. dir)
  end)

  it("a FIFO is refused at once, never waited on", function()
    local fifo = os.tmpname()
    os.remove(fifo)
    if not os.execute("mkfifo " .. fifo .. " 2>/dev/null") then
      pending("mkfifo is not available here")
      return
    end
    has(error_within_bounds(function() return tokenizer { file = fifo } end), fifo, "FIFO")
    -- and as the tokenizer_config.json beside a good file
    local path = write_temp(tok_json(), ".json")
    has(error_within_bounds(function() return tokenizer { file = path, config = fifo } end), fifo, "FIFO")
    os.remove(fifo)
  end)

  it("/dev/zero is refused, not read until memory runs out", function()
    has(error_within_bounds(function() return tokenizer { file = "/dev/zero" } end), "/dev/zero", "character device")
  end)

  it("a missing file names the path", function()
    has(error_within_bounds(function() return tokenizer { file = "/nonexistent/tokenizer.json" } end),
      "/nonexistent/tokenizer.json", "cannot open")
  end)

  it("core.read_file bounds what it reads", function()
    local path = write_temp(string.rep("x", 1000))
    local text, why = ember.core.read_file(path, 999)
    assert.is_nil(text)
    has(why, path, "1000 bytes", "999")
    assert.are.equal(1000, #ember.core.read_file(path, 1000))
  end)
end)

describe("a tokenizer from another model", function()
  local model_path, why = fx.tiny_model("--family llama --dtype f32 --layers 2 --seed 7")
  local other = fx.root .. "/tokenizers/gemma/tokenizer.json"
  if not model_path or not fx.exists(other) then
    pending(why or ("missing " .. other))
    return
  end

  it("is refused with an error naming both files", function()
    -- the file's decoded tables are the heap's bound: a small multiple of its size
    local size = #assert(ember.core.read_file(other, 1 << 30))
    local msg = error_within_bounds(function() return ember.load { model = model_path, tokenizer = other } end,
      8 * size // 1024)
    has(msg, "load: ", other, model_path, "does not match", "tokenizer_check = false")
  end)

  it("loads with tokenizer_check = false", function()
    local m = ember.load { model = model_path, tokenizer = other, tokenizer_check = false }
    assert.is_truthy(m)
    m:close()
  end)

  it("tokenizer_check must be a boolean", function()
    has(error_within_bounds(function() return ember.load { model = model_path, tokenizer_check = 1 } end),
      "tokenizer_check", "boolean")
  end)
end)

describe("non-finite numerics", function()
  local model_path, why = fx.tiny_model("--family llama --dtype f32 --layers 2 --seed 7")
  if not model_path then
    pending(why)
    return
  end
  local function nan_at(layer)
    return { name = "nan-writer", after_mlp = function(_, ctx, v)
      if ctx.layer_index == layer then v:set(1, 1, 0 / 0) end
    end }
  end

  it("a hook writing NaN fails the generation, naming stage and layer", function()
    local m = ember.load { model = model_path, kernels = "reference" }
    local msg = error_within_bounds(function()
      return m:generate { ids = { 1, 2, 3 }, max_tokens = 2, eos = false, experiment = nan_at(1) }
    end)
    has(msg, model_path, "non-finite logits", "after_mlp of layer 1", "allow_nonfinite")
    m:close()
  end)

  it("allow_nonfinite = true in ember.load lets the run go on", function()
    local m = ember.load { model = model_path, kernels = "reference", allow_nonfinite = true }
    local out = m:generate { ids = { 1, 2, 3 }, max_tokens = 2, eos = false, experiment = nan_at(1) }
    assert.are.equal(2, #out.ids)
    m:close()
  end)

  it("allow_nonfinite must be a boolean", function()
    has(error_within_bounds(function() return ember.load { model = model_path, allow_nonfinite = "yes" } end),
      "allow_nonfinite", "boolean")
  end)
end)

-- ---- the command line: numeric flags, the context limit, outputs, messages ----------------------

local C = require("helpers.cli")

-- A usage error (exit 2) within the time bound, whose message names each of ...
local function usage_error_naming(args, ...)
  local t0 = os.clock()
  local code, out, err = C.ember(table.unpack(args))
  assert.is_true(os.clock() - t0 < TIME_LIMIT)
  assert.equal(2, code, "exit code for " .. table.concat(args, " ") .. ": " .. err)
  assert.equal("", out)
  has(err, ...)
  return err
end

local function tiny(args)
  local path, why = fx.tiny_model(args)
  if not path then pending(why) end
  return path
end

describe("numeric flags are typed and ranged (usage errors)", function()
  local base = { "--model", "m.gguf", "--prompt", "x" }
  local function with(...)
    local t = { table.unpack(base) }
    for _, a in ipairs({ ... }) do t[#t + 1] = a end
    return t
  end
  it("--top-k beyond the sampler's int is refused, not wrapped", function()
    usage_error_naming(with("--top-k", "4294967301"), "--top-k", "4294967301", "out of range")
    usage_error_naming(with("--top-k", "2147483648"), "--top-k", "2147483648", "0..2147483647")
  end)
  it("--temperature -1 and --top-p 0 / 1.5 are usage errors naming the value", function()
    usage_error_naming(with("--temperature", "-1"), "--temperature", "-1", "out of range")
    usage_error_naming(with("--top-p", "0"), "--top-p", "0", "(0, 1]")
    usage_error_naming(with("--top-p", "1.5"), "--top-p", "1.5", "(0, 1]")
  end)
  it("--threads 100000 and --max-tokens 20000000 are usage errors", function()
    usage_error_naming(with("--threads", "100000"), "--threads", "100000", "0..4096")
    usage_error_naming(with("--max-tokens", "20000000"), "--max-tokens", "20000000", "out of range")
  end)
  it("an integer too large for any type says out of range, not 'not an integer'", function()
    local err = usage_error_naming(with("--max-tokens", "9223372036854775807"), "--max-tokens", "out of range")
    assert.is_nil(err:find("non-negative integer", 1, true))
    err = usage_error_naming(with("--seed", "99999999999999999999"), "--seed", "out of range")
    assert.is_nil(err:find("non-negative integer", 1, true))
  end)
  it("the largest integer is an integer (a seed may be 2^63-1)", function()
    local flags = require("ember.cli.flags")
    assert.equal(math.maxinteger, flags.uint("9223372036854775807"))
    assert.is_nil(flags.uint("9223372036854775808"))
  end)
  it("ember.sampler refuses a top_k beyond int instead of wrapping it", function()
    local ok, err = pcall(require("ember.core").sampler, { n_vocab = 8, top_k = 4294967301 })
    assert.is_false(ok)
    has(tostring(err), "top_k", "4294967301")
  end)
end)

describe("the model's context_length", function()
  it("prompt + --max-tokens beyond it is a usage error naming both numbers", function()
    local m = tiny("--family llama --dtype f32 --layers 2 --context 16")
    usage_error_naming({ "--model", m, "--prompt", "hi", "--max-tokens", "40" }, "--max-tokens", "(40)",
      "context_length 16", "--context N")
  end)
  it("an explicit --context may go beyond it, with a notice on stderr", function()
    local m = tiny("--family llama --dtype f32 --layers 2 --context 16")
    local code, out, err = C.ember("--model", m, "--prompt", "hi", "--max-tokens", "20", "--context", "40")
    assert.equal(0, code, err)
    assert.is_true(#out > 0)
    has(err, "context 40 is beyond the model's context_length 16")
  end)
  it("generate{} checks it too; context = N goes beyond it", function()
    local m = ember.load(tiny("--family llama --dtype f32 --layers 2 --context 16"))
    local ok, err = pcall(m.generate, m, { ids = { 1, 2, 3 }, max_tokens = 20 })
    assert.is_false(ok)
    has(tostring(err), "bad argument to 'generate'", "23 positions", "context_length 16")
    local gen = require("ember.model.generate")
    local said, saved = {}, gen.notice
    gen.notice = function(msg) said[#said + 1] = msg end
    local out = m:generate { ids = { 1, 2, 3 }, max_tokens = 20, context = 24, eos = false }
    gen.notice = saved
    assert.equal(20, #out.ids)
    has(said[1], "context 24", "context_length 16")
  end)
  it("a KV cache that cannot fit is refused up front, naming the bytes needed and available", function()
    -- 2 layers x 2 x 2048 floats a position: 2^24 positions need 550 GB
    local m = ember.load(tiny("--family llama --dtype f32 --layers 2 --hidden 32 --heads 2 --kv-heads 2 "
      .. "--head-dim 1024 --ff 32 --context 64"))
    local msg = error_within_bounds(function() return m:session { context = 1 << 24 } end)
    has(msg, "16777216-token context needs", "bytes of KV cache", "bytes available")
    assert.is_nil(msg:find("session: session:", 1, true))
  end)
  it("context_length = 0 gives one clean message", function()
    local src = tiny("--family llama --dtype f32 --layers 2 --context 16")
    local f = assert(io.open(src, "rb"))
    local data = f:read("a")
    f:close()
    local key = "llama.context_length"
    local at = assert(data:find(key, 1, true)) + #key -- then the type (u32 = 4) and the value
    assert.equal(4, string.unpack("<I4", data, at))
    local path = write_temp(data:sub(1, at + 3) .. string.pack("<I4", 0) .. data:sub(at + 8), ".gguf")
    local m = ember.load(path)
    local msg = error_within_bounds(function() return m:session() end)
    has(msg, "session: the model's context_length is 0", "explicit context")
    assert.is_nil(msg:find("session: session:", 1, true))
    assert.equal(8, m:session { context = 8 }.context)
  end)
end)

describe("outputs of one run never collide", function()
  it("--activation-stats X --run-manifest X is refused before running", function()
    local m = C.need_model()
    local x = os.tmpname()
    os.remove(x)
    usage_error_naming({ "--model", m, "--prompt", "hi", "--activation-stats", x, "--run-manifest", x },
      "--activation-stats and --run-manifest both name", x)
    assert.is_nil(io.open(x, "rb"))
  end)
  it("a run manifest inside the capture directory's own files is refused", function()
    local m = C.need_model()
    local d = os.tmpname()
    os.remove(d)
    usage_error_naming({ "--model", m, "--prompt", "hi", "--capture-activations", d, "--run-manifest",
      d .. "/manifest.json" }, "--capture-activations and --run-manifest")
  end)
  it("the default run manifest does not overwrite an existing file", function()
    local m = C.need_model()
    local dir = require("ember.store.fs").make_temp_dir("ember-bad-input")
    local here = assert(io.popen("pwd")):read("l")
    -- the default manifest of a statistics run is beside the statistics file: s.json -> s.run.json
    local f = assert(io.open(dir .. "/s.run.json", "wb"))
    f:write("mine")
    f:close()
    -- run from that directory through the launcher (the default is relative to the working directory)
    local cmd = string.format("cd %q && %q/tools/ember --model %q --prompt hi --max-tokens 2 --activation-stats s.json"
      .. " >/dev/null 2>%q/err", dir, here, here .. "/" .. m, dir)
    if m:sub(1, 1) == "/" then cmd = cmd:gsub(here .. "/" .. m, m, 1) end
    local ok, _, code = os.execute(cmd)
    assert.is_nil(ok)
    assert.equal(2, code)
    local e = assert(io.open(dir .. "/err")):read("a")
    has(e, "s.run.json", "already exists")
    assert.equal("mine", assert(io.open(dir .. "/s.run.json")):read("a"))
    require("ember.store.fs").remove_tree(dir)
  end)
end)

describe("command-line messages", function()
  it("a model without a tokenizer names the CLI flag", function()
    local m = tiny("--family llama --dtype f32 --layers 2 --no-tokenizer")
    local err = usage_error_naming({ "--model", m, "--prompt", "hi" }, "--tokenizer FILE", "no embedded tokenizer")
    assert.is_nil(err:find("tokenizer=", 1, true))
  end)
  it("--capture-activations with a missing parent names the missing directory", function()
    local m = C.need_model()
    local d = os.tmpname()
    os.remove(d)
    usage_error_naming({ "--model", m, "--prompt", "hi", "--capture-activations", d .. "/new/" },
      "directory '" .. d .. "' does not exist", "'" .. d .. "/new/' cannot be created")
  end)
  it("error('a\\0b') from a hook shows the whole message, the NUL escaped", function()
    local m = ember.load(tiny("--family llama --dtype f32 --layers 2"))
    local msg = error_within_bounds(function()
      return m:generate { ids = { 1 }, max_tokens = 1,
        experiment = { name = "nul", after_logits = function() error("a\0b", 0) end } }
    end)
    has(msg, "experiment 'nul' failed in after_logits", "a\\x00b")
  end)
end)

describe("Ctrl-C (SIGINT at ember-lua)", function()
  -- The script sends SIGINT to its own process from a hook, then loops; each interrupt must end
  -- that generate with "interrupted", and the next one must run normally.
  local script = [[
local ember = require("ember")
local pid = assert(io.open("/proc/self/stat")):read("n")
local function ctrl_c()
  local h = io.popen("kill -INT " .. pid)
  h:read("a")
  h:close()
end
local m = ember.load { model = arg[1], kernels = "reference" }
local function looping(name)
  return { name = name, after_logits = function()
    ctrl_c()
    while true do end
  end }
end
local function req(exp) return { ids = { 1, 2, 3 }, max_tokens = 4, eos = false, experiment = exp } end
local ok, err = pcall(m.generate, m, req(looping("first")))
print("first", ok, err:match("interrupted$"))
local out = m:generate(req())
print("after", out.stop, #out.ids)
ok, err = pcall(m.generate, m, req(looping("second")))
print("second", ok, err:match("interrupted$"))
local co = coroutine.create(function() return pcall(m.generate, m, req(looping("coroutine"))) end)
local _, cok, cerr = coroutine.resume(co)
print("coroutine", cok, cerr:match("interrupted$"))
out = m:generate(req())
print("end", out.stop, #out.ids)
]]
  it("clears the flag once delivered, stays armed, and reaches hooks inside coroutines", function()
    local m = tiny("--family llama --dtype f32 --layers 2")
    local lua = fx.build .. "/ember-lua"
    if not fx.exists(lua) then pending("missing " .. lua) end
    local path = write_temp(script, ".lua")
    local h = assert(io.popen(string.format("timeout 60 %q %q %q 2>&1; echo rc=$?", lua, path, m)))
    local got = h:read("a")
    h:close()
    os.remove(path)
    assert.equal(table.concat({
      "first\tfalse\tinterrupted",
      "after\tmax_tokens\t4",         -- the next generate is not stopped by a stale flag
      "second\tfalse\tinterrupted",   -- a second Ctrl-C interrupts again instead of killing
      "coroutine\tfalse\tinterrupted", -- a hook looping in a coroutine is interrupted too
      "end\tmax_tokens\t4",
      "rc=0", "" }, "\n"), got)
  end)
end)

describe("late failures and killed writers", function()
  local fs = require("ember.store.fs")
  it("a run manifest that cannot be written names the artifacts already committed", function()
    local m = C.need_model()
    local dir = fs.make_temp_dir("ember-late")
    assert(fs.mkdir(dir .. "/taken")) -- a directory where the manifest file should go
    local code, _, err = C.ember("--model", m, "--prompt", "hi", "--max-tokens", "2", "--capture-activations",
      dir .. "/cap", "--activation-stats", dir .. "/s.json", "--run-manifest", dir .. "/taken")
    assert.equal(1, code)
    has(err, "run manifest: ", dir .. "/taken", "already written and complete",
      "capture artifact '" .. dir .. "/cap'", "activation stats '" .. dir .. "/s.json'")
    assert.is_true(fs.is_dir(dir .. "/cap"))
    fs.remove_tree(dir)
  end)
end)

describe("tampered and special artifact files", function()
  local artifact = require("ember.store.artifact")
  local H = require("helpers.artifacts")
  local cjson = require("cjson")
  after_each(H.cleanup)

  local function f32(n, x) local t = {} for i = 1, n do t[i] = x + i end return H.f32(t) end
  local function sample()
    local dir = H.tmpdir() .. "/art"
    artifact.write(dir, H.sections(), {
      { stage = "after_attention", layer = 0, phase = "prefill", start_position = 0, shape = { 1, 3 },
        data = f32(3, 0) },
      { stage = "after_mlp", layer = 1, phase = "prefill", start_position = 0, shape = { 1, 3 }, data = f32(3, 10) },
      { stage = "after_mlp", layer = 0, phase = "decode", start_position = 1, shape = { 1, 3 }, data = f32(3, 20) },
    })
    return dir
  end
  -- edit(dir, fn): fn(manifest table) edits the decoded manifest, written back as JSON
  local function edit(dir, fn)
    local m = cjson.decode(H.read(dir .. "/manifest.json"))
    fn(m)
    H.write(dir .. "/manifest.json", cjson.encode(m))
  end
  local function swap(m, i, j, ...)
    for _, k in ipairs({ ... }) do m.records[i][k], m.records[j][k] = m.records[j][k], m.records[i][k] end
  end
  local function refused(dir, ...)
    local msg = error_within_bounds(function() return artifact.read(dir) end)
    has(msg, "artifact '" .. dir .. "'", ...)
    return msg
  end

  it("an untouched artifact reads, and records a digest binding fields to bytes", function()
    local a = artifact.read(sample())
    assert.equal(3, #a.records)
    assert.equal(64, #a.records[1].name > 0 and #a.manifest.records[1].record_sha256)
    assert.equal("1.1.0", a.manifest.schema_version)
  end)
  it("swapping two records' layer is detected and named", function()
    local dir = sample()
    edit(dir, function(m) swap(m, 1, 2, "layer") end)
    refused(dir, "record 0 (after_attention layer 1", "do not match its tensor", "L0")
  end)
  it("swapping two records' stage is detected", function()
    local dir = sample()
    edit(dir, function(m) swap(m, 1, 2, "stage") end)
    refused(dir, "record 0", "the manifest was edited")
  end)
  it("swapping two records' start_position is detected", function()
    local dir = sample()
    edit(dir, function(m) swap(m, 2, 3, "start_position") end)
    refused(dir, "record 1", "the manifest was edited")
  end)
  it("swapping two records' name and sha256 is detected", function()
    local dir = sample()
    edit(dir, function(m) swap(m, 1, 2, "name", "sha256") end)
    refused(dir, "record 0", "the manifest was edited")
  end)
  it("fields and name edited together still fail the record digest", function()
    local dir = sample()
    edit(dir, function(m)
      m.records[1].layer = 5
      m.records[1].name = m.records[1].name:gsub("%.L0%.", ".L5.")
    end)
    H.write(dir .. "/tensors.safetensors", H.read(dir .. "/tensors.safetensors")) -- bytes untouched
    local msg = error_within_bounds(function() return artifact.read(dir) end)
    -- the renamed tensor is not in the file, or the digest disagrees: either way it is refused
    assert.is_truthy(msg:find("record 0", 1, true), msg)
  end)
  it("a 1.1 record without record_sha256 is refused", function()
    local dir = sample()
    edit(dir, function(m) m.records[2].record_sha256 = nil end)
    refused(dir, "record 1", "record_sha256")
  end)
  it("a 1.0.0 artifact (no record digests) still reads, and its records are still bound by name", function()
    local dir = sample()
    edit(dir, function(m)
      m.schema_version = "1.0.0"
      for _, r in ipairs(m.records) do r.record_sha256 = nil end
    end)
    assert.equal(3, #artifact.read(dir).records)
    edit(dir, function(m) swap(m, 1, 2, "layer") end)
    refused(dir, "record 0", "do not match its tensor")
  end)
  it("tensors.safetensors as /dev/zero or a FIFO is an error, not a hang or an endless read", function()
    local dir = sample()
    os.remove(dir .. "/tensors.safetensors")
    assert(os.execute("ln -s /dev/zero " .. dir .. "/tensors.safetensors"))
    refused(dir, "tensors.safetensors", "character device")
    os.remove(dir .. "/tensors.safetensors")
    assert(os.execute("mkfifo " .. dir .. "/tensors.safetensors"))
    refused(dir, "tensors.safetensors", "FIFO")
    os.remove(dir .. "/manifest.json")
    assert(os.execute("mkfifo " .. dir .. "/manifest.json"))
    refused(dir, "manifest.json", "FIFO")
  end)
  it("the run manifest records the digest of the capture's manifest.json", function()
    local m = C.need_model()
    local dir = H.tmpdir()
    local code, _, err = C.ember("--model", m, "--prompt", "hi", "--max-tokens", "1", "--capture-activations",
      dir .. "/cap", "--run-manifest", dir .. "/run.json")
    assert.equal(0, code, err)
    local run = cjson.decode(H.read(dir .. "/run.json"))
    assert.equal(H.sha256sum(H.read(dir .. "/cap/manifest.json")), run.outputs.capture_manifest_sha256)
    assert.equal(run.outputs.capture_manifest_sha256, artifact.read(dir .. "/cap").manifest_sha256)
  end)
end)

describe("selector lists", function()
  it("many large ranges are refused by their total, not built into a huge table", function()
    local sel = require("ember.run.selectors")
    local parts = {}
    for i = 0, 99 do parts[#parts + 1] = string.format("%d-%d", i * 1000001, i * 1000001 + 1000000) end
    collectgarbage()
    local t0, heap0 = os.clock(), collectgarbage("count")
    local v, err = sel.parse_index_list(table.concat(parts, ","), "position")
    assert.is_nil(v)
    has(err, "more than 1000000 position numbers")
    assert.is_true(os.clock() - t0 < TIME_LIMIT)
    assert.is_true(collectgarbage("count") - heap0 < HEAP_LIMIT_KB * 2)
  end)
end)
