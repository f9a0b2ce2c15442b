-- spec/bad_input_spec.lua — the Lua side of the bad-input catalogue (tests/test_bad_input.c holds
-- the GGUF and engine cases): hostile tokenizer.json files, special files as inputs, a tokenizer
-- from another model, non-finite numerics through ember.load. Each case asserts the error family
-- (its stable prefix), that the message names the file and the field, and a bound on time and on
-- the Lua heap.

local ember = require("ember")
local tokenizer = require("ember.tokenizer")
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
