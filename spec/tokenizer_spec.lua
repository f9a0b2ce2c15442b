-- spec/tokenizer_spec.lua — the tokenizers against llama.cpp's reference vectors, the parity
-- fixtures' prompts, and the error and lifetime rules of ember.Tokenizer.
-- Fixtures: EMBER_FIXTURES or ../shared/fixtures (from the project root); a missing file makes its
-- test pending with the path in the message.

local tokenizer = require("ember.model.tokenizer")
local cjson = require("cjson")

local FIXTURES = os.getenv("EMBER_FIXTURES") or "../shared/fixtures"

local read = require("helpers.files").read_if_exists

local function write_temp(content)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(content)
  f:close()
  return path
end

-- vectors.inp: strings separated by "\n__ggml_vocab_test__\n" (a separator at the very end
-- closes the last string); vectors.out: one line of space-separated ids per string.
local function read_vectors(dir)
  local inp, out = read(dir .. "/vectors.inp"), read(dir .. "/vectors.out")
  local strings, expected = {}, {}
  local sep, i = "\n__ggml_vocab_test__\n", 1
  while true do
    local a, b = inp:find(sep, i, true)
    if not a then
      if i <= #inp then strings[#strings + 1] = inp:sub(i) end
      break
    end
    strings[#strings + 1] = inp:sub(i, a - 1)
    i = b + 1
  end
  for line in out:gmatch("([^\n]*)\n?") do
    if #expected == #strings then break end
    local ids = {}
    for n in line:gmatch("%d+") do ids[#ids + 1] = math.tointeger(tonumber(n)) end
    expected[#expected + 1] = ids
  end
  return strings, expected
end

local function same_ids(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] then return false end
  end
  return true
end

-- Tokenizers are slow-ish to load (Gemma's file is 33 MB): load each once.
local cache = {}
local function load(kind, rel)
  local path = FIXTURES .. "/" .. rel
  if not read(path) then return nil, "missing fixture " .. path end
  local key = kind .. ":" .. path
  if not cache[key] then cache[key] = tokenizer{ [kind] = path } end
  return cache[key]
end

local FAMILIES = {
  { name = "qwen3", kind = "file", rel = "tokenizers/qwen3/tokenizer.json" },
  { name = "llama3", kind = "file", rel = "tokenizers/llama3/tokenizer.json" },
  { name = "gemma", kind = "file", rel = "tokenizers/gemma/tokenizer.json" },
  { name = "gpt2", kind = "file", rel = "tokenizers/gpt2/tokenizer.json" },
  { name = "gpt2", kind = "gguf", rel = "tokenizers/gpt2/vocab-only.gguf" },
  { name = "llama-spm", kind = "gguf", rel = "tokenizers/llama-spm/vocab-only.gguf" },
}

describe("reference vectors", function()
  for _, fam in ipairs(FAMILIES) do
    local dir = FIXTURES .. "/tokenizers/" .. fam.name
    local label = fam.name .. " (" .. (fam.kind == "file" and "tokenizer.json" or "vocab-only.gguf") .. ")"

    it(label .. ": every string encodes to the reference ids", function()
      local tok, why = load(fam.kind, fam.rel)
      if not tok then return pending(why) end
      if not read(dir .. "/vectors.out") then return pending("missing fixture " .. dir .. "/vectors.out") end
      local strings, expected = read_vectors(dir)
      assert.are.equal(#strings, #expected)
      assert.is_true(#strings > 40)
      local failures = {}
      for i, s in ipairs(strings) do
        local ids = tok:encode(s, { bos = false })
        if not same_ids(ids, expected[i]) then
          failures[#failures + 1] = string.format("#%d %q: got [%s], want [%s]", i, s, table.concat(ids, " "),
            table.concat(expected[i], " "))
        end
      end
      assert.are.same({}, failures)
    end)

    -- All four families are lossless on these strings (see docs/tokenizers.md for the cases that
    -- are not: NFC-changing text for Qwen, a literal U+2581 or "<0xNN>" for SentencePiece styles).
    it(label .. ": decode(encode(s)) == s for every string", function()
      local tok, why = load(fam.kind, fam.rel)
      if not tok then return pending(why) end
      local strings = read_vectors(dir)
      for i, s in ipairs(strings) do
        assert.are.equal(s, tok:decode(tok:encode(s)), "string #" .. i)
      end
    end)
  end
end)

describe("parity fixtures", function()
  local cases = {
    "gemma4-tiny-f32", "gpt2-tiny-f32", "llama-tiny-f32", "qwen2-tiny-f32", "qwen3-tiny-f32",
  }
  for _, name in ipairs(cases) do
    local dir = "parity/" .. name
    it(name .. ": prompt_text gives prompt_ids (BOS where the family adds one), tokenizer.json and GGUF", function()
      local case_text = read(FIXTURES .. "/" .. dir .. "/case.json")
      if not case_text then return pending("missing fixture " .. FIXTURES .. "/" .. dir .. "/case.json") end
      local case = cjson.decode(case_text)
      local want = {}
      for i, id in ipairs(case.prompt_ids) do want[i] = math.tointeger(id) end
      for _, src in ipairs({ { "file", dir .. "/tokenizer.json" }, { "gguf", dir .. "/model.gguf" } }) do
        local tok, why = load(src[1], src[2])
        if not tok then return pending(why) end
        assert.are.same(want, tok:encode(case.prompt_text))
        assert.are.equal(case.prompt_text, tok:decode(want))
      end
    end)
  end
end)

describe("BOS per family", function()
  local expect = {
    { "tokenizers/qwen3/tokenizer.json", "file", false, nil },
    { "tokenizers/llama3/tokenizer.json", "file", true, 128000 },
    { "tokenizers/gemma/tokenizer.json", "file", true, 2 },
    { "tokenizers/gpt2/tokenizer.json", "file", false, 50256 },
    { "tokenizers/gpt2/vocab-only.gguf", "gguf", false, 50256 },
    { "tokenizers/llama-spm/vocab-only.gguf", "gguf", true, 1 },
  }
  for _, e in ipairs(expect) do
    it(e[1], function()
      local tok, why = load(e[2], e[1])
      if not tok then return pending(why) end
      assert.are.equal(e[3], tok.adds_bos)
      assert.are.equal(e[4], tok.bos_id)
      local ids = tok:encode("Hello")
      assert.are.equal(e[3], ids[1] == e[4])
      assert.are.same(tok:encode("Hello", { bos = false }), { table.unpack(ids, e[3] and 2 or 1) })
      if e[4] then assert.are.equal(e[4], tok:encode("Hello", { bos = true })[1]) end
    end)
  end

  it("add_bos can be overridden when loading", function()
    local path = FIXTURES .. "/tokenizers/gpt2/tokenizer.json"
    if not read(path) then return pending("missing fixture " .. path) end
    local tok = tokenizer{ file = path, add_bos = true }
    assert.are.same({ 50256, 15496 }, tok:encode("Hello"))
  end)
end)

describe("special tokens", function()
  it("are matched only when special = true (qwen3)", function()
    local tok, why = load("file", "tokenizers/qwen3/tokenizer.json")
    if not tok then return pending(why) end
    local text = "<|im_start|>user\nHi<|im_end|>"
    local on = tok:encode(text)
    assert.are.equal(151644, on[1])
    assert.are.equal(151645, on[#on])
    local off = tok:encode(text, { special = false })
    for _, id in ipairs(off) do assert.is_true(id < 151643) end
    assert.are.equal(text, tok:decode(on))
    assert.are.equal(text, tok:decode(off))
    assert.are.equal("user\nHi", tok:decode(on, { special = false }))
    assert.is_true(tok:is_special(151644))
    assert.is_false(tok:is_special(on[2]))
  end)

  it("gpt2 <|endoftext|> is one token with special = true", function()
    local tok, why = load("file", "tokenizers/gpt2/tokenizer.json")
    if not tok then return pending(why) end
    assert.are.same({ 50256 }, tok:encode("<|endoftext|>"))
    local plain = tok:encode("<|endoftext|>", { special = false })
    assert.is_true(#plain > 1)
    assert.are.equal("<|endoftext|>", tok:decode(plain))
  end)

  it("llama-spm control tokens in text restart the space prefix (as llama.cpp does)", function()
    local tok, why = load("gguf", "tokenizers/llama-spm/vocab-only.gguf")
    if not tok then return pending(why) end
    local ids = tok:encode("a</s>b", { bos = false })
    assert.are.same({ tok:find("\u{2581}a"), 2, tok:find("\u{2581}b") }, ids)
    -- documented lossy case: the run after a special token gets its own prefix space
    assert.are.equal("a</s> b", tok:decode(ids))
  end)
end)

describe("added token flags (a small tokenizer.json written here)", function()
  local json = [=[{
    "added_tokens": [
      {"id": 3, "content": "<m>", "special": false, "lstrip": true, "rstrip": true},
      {"id": 6, "content": "xx", "special": false, "single_word": true},
      {"id": 7, "content": "<c>", "special": true}
    ],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, " ": 2, "<m>": 3, "ab": 4, "x": 5},
              "merges": [["a", "b"]]}
  }]=]

  it("lstrip/rstrip swallow the spaces around, single_word needs word boundaries", function()
    local path = write_temp(json)
    local tok = tokenizer{ file = path, config = false }
    os.remove(path)
    assert.are.same({ 4 }, tok:encode("ab"))
    assert.are.same({ 0, 3, 1 }, tok:encode("a <m>  b"))
    assert.are.same({ 0, 5, 5 }, tok:encode("axx"))
    assert.are.same({ 2, 6, 2 }, tok:encode(" xx "))
    assert.are.same({ 7 }, tok:encode("<c>"))
    assert.is_nil(tok.bos_id)
    assert.is_false(tok.adds_bos)
    tok:close()
  end)
end)

describe("added tokens that share prefixes (small tokenizer.json files written here)", function()
  local json = [=[{
    "added_tokens": [
      {"id": 5, "content": "<a", "special": false},
      {"id": 6, "content": "<ab>", "special": true},
      {"id": 7, "content": "<abc>", "special": false}
    ],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<": 2, ">": 3, "c": 4}, "merges": []}
  }]=]

  it("the longest acceptable one wins; a control token is passed over without special", function()
    local path = write_temp(json)
    local tok = tokenizer{ file = path, config = false }
    os.remove(path)
    assert.are.same({ 6 }, tok:encode("<ab>", { special = true }))
    assert.are.same({ 5, 1, 3 }, tok:encode("<ab>", { special = false })) -- back to "<a"
    assert.are.same({ 7 }, tok:encode("<abc>", { special = false }))
    assert.are.same({ 5, 1, 4 }, tok:encode("<abc", { special = true })) -- text ends inside "<abc>"
    assert.are.same({ 4, 5, 7, 2 }, tok:encode("c<a<abc><", { special = true }))
    tok:close()
  end)

  it("thousands of reserved tokens match as a plain leftmost-longest search says", function()
    -- the vocabulary: one token per character; added: <|reserved_0|> .. <|reserved_2999|> and a
    -- few that are prefixes of others
    local chars, vocab, added, n = "<|>_abcdefghijklmnopqrstuvwxyz0123456789 ", {}, {}, 0
    for c in chars:gmatch(".") do vocab[c] = n; n = n + 1 end
    local strings = { "<|res", "<|reserved_1", "<|reserved_12|>x" }
    for i = 0, 2999 do strings[#strings + 1] = "<|reserved_" .. i .. "|>" end
    local id_of = {}
    for _, str in ipairs(strings) do
      added[#added + 1] = { id = n, content = str, special = true }
      id_of[str] = n
      n = n + 1
    end
    local path = write_temp(cjson.encode({ added_tokens = added, model = { type = "BPE", vocab = vocab } }))
    local tok = tokenizer{ file = path, config = false }
    os.remove(path)
    local function expect(text) -- at each position the longest added string, else the character
      local out, i = {}, 1
      while i <= #text do
        local best
        for _, str in ipairs(strings) do
          if text:sub(i, i + #str - 1) == str and (not best or #str > #best) then best = str end
        end
        if best then out[#out + 1] = id_of[best]; i = i + #best
        else out[#out + 1] = vocab[text:sub(i, i)]; i = i + 1 end
      end
      return out
    end
    local texts = { "<|reserved_12|><|reserved_123|>x<|reserved_2999|><|reserved_3000|>",
      "<|reserved_12|>x <|res<|reserved_1<|reserved_|> <|reserved_0|>_<|reserved_29990|>",
      "<|", "abc <|reserved_7" }
    for _, text in ipairs(texts) do
      assert.are.same(expect(text), tok:encode(text, { special = true }), text)
    end
    tok:close()
  end)
end)

describe("tokens and lookups", function()
  it("token(id) gives the text and the vocabulary string", function()
    local tok, why = load("file", "tokenizers/gpt2/tokenizer.json")
    if not tok then return pending(why) end
    local piece, raw = tok:token(15496)
    assert.are.equal("Hello", piece)
    assert.are.equal("Hello", raw)
    piece, raw = tok:token(995)
    assert.are.equal(" world", piece)
    assert.are.equal("\u{120}world", raw)
    assert.are.equal(995, tok:find("\u{120}world"))
    assert.is_nil(tok:find("no such token"))
    assert.is_nil(tok:token(-1))
    assert.is_nil(tok:token(tok.vocab_size))
    assert.are.equal(50257, tok.vocab_size)
    assert.are.equal(50256, tok.eos_id)
  end)

  it("byte tokens read as their byte (gemma, llama-spm)", function()
    local tok, why = load("gguf", "tokenizers/llama-spm/vocab-only.gguf")
    if not tok then return pending(why) end
    local piece, raw = tok:token(13) -- <0x0A>
    assert.are.equal("\n", piece)
    assert.are.equal("<0x0A>", raw)
  end)
end)

describe("streaming decode", function()
  local function utf8_ok(s) return utf8.len(s) ~= nil end

  local function stream_all(tok, ids, opts)
    local st = tok:stream(opts)
    local parts = {}
    for _, id in ipairs(ids) do
      local chunk = st:push(id)
      assert.is_true(utf8_ok(chunk), "chunk is not valid UTF-8")
      parts[#parts + 1] = chunk
    end
    parts[#parts + 1] = st:flush()
    return table.concat(parts), parts
  end

  for _, fam in ipairs(FAMILIES) do
    it(fam.name .. " (" .. fam.kind .. "): chunks are whole characters and add up to the text", function()
      local tok, why = load(fam.kind, fam.rel)
      if not tok then return pending(why) end
      -- emoji, Khmer and CJK: characters that byte-level and byte-fallback tokens split
      local text = "\u{1F680} (normal) \u{1F636}\u{200D}\u{1F32B}\u{FE0F} \u{1780}\u{17B6}\u{1793} 我想在apple工作"
      local got = stream_all(tok, tok:encode(text, { bos = false }), { strip_space = true })
      assert.are.equal(text, got)
    end)
  end

  it("holds a split character and replaces bytes that cannot finish", function()
    local tok, why = load("file", "tokenizers/gpt2/tokenizer.json")
    if not tok then return pending(why) end
    local st = tok:stream()
    -- GPT-2's byte alphabet spells byte 0xE2 as U+00E2 and 0xFF as U+00FF
    local e2, ff = tok:find("\u{E2}"), tok:find("\u{FF}")
    assert.are.equal("", st:push(e2))
    assert.are.equal("\u{FFFD}", st:flush())
    assert.are.equal("\u{FFFD}", st:push(ff))
    assert.are.equal("", st:push(e2))
    assert.are.equal("\u{FFFD}A", st:push(tok:find("A")))
    st:close()
    st:close()
  end)

  for _, fam in ipairs(FAMILIES) do
    it(fam.name .. " (" .. fam.kind .. "): an exact stream adds up to decode, for any ids", function()
      local tok, why = load(fam.kind, fam.rel)
      if not tok then return pending(why) end
      local function exact_all(ids)
        local st, parts = tok:stream { exact = true }, {}
        for _, id in ipairs(ids) do parts[#parts + 1] = st:push(id) end
        parts[#parts + 1] = st:flush()
        return table.concat(parts)
      end
      local text = "\u{1F680} (normal) \u{1780}\u{17B6}\u{1793} 我想在apple工作"
      local ids = tok:encode(text)
      assert.are.equal(tok:decode(ids), exact_all(ids))
      -- random ids split characters anywhere and make byte runs that never form one; the
      -- stream must still reproduce decode byte for byte
      local rng = 12345
      for _ = 1, 20 do
        local rand = {}
        for i = 1, 64 do
          rng = (rng * 1103515245 + 12345) % 2147483648
          rand[i] = rng % tok.vocab_size
        end
        assert.are.equal(tok:decode(rand), exact_all(rand))
      end
    end)
  end

  it("exact passes bytes that cannot finish through unchanged, and skips the BOS decode skips", function()
    local tok, why = load("file", "tokenizers/gpt2/tokenizer.json")
    if not tok then return pending(why) end
    local st = tok:stream { exact = true }
    local e2, ff = tok:find("\u{E2}"), tok:find("\u{FF}")
    assert.are.equal("", st:push(e2))
    assert.are.equal("\xE2\xFF", st:push(ff))
    assert.are.equal("", st:push(e2))
    assert.are.equal("\xE2A", st:push(tok:find("A")))
    assert.are.equal("", st:push(e2))
    assert.are.equal("\xE2", st:flush())
    assert.has_error(function() tok:stream { exact = true, strip_space = true } end)
    local spm = load("gguf", "tokenizers/llama-spm/vocab-only.gguf")
    if spm then
      local ids = spm:encode("Hello world")
      assert.are.equal(1, ids[1])
      local s2 = spm:stream { exact = true }
      local out = {}
      for _, id in ipairs(ids) do out[#out + 1] = s2:push(id) end
      assert.are.equal("Hello world", table.concat(out) .. s2:flush())
      assert.are.equal(spm:decode(ids), table.concat(out))
    end
  end)

  it("skip_special leaves control tokens out; strip_space drops the SentencePiece prefix", function()
    local tok, why = load("gguf", "tokenizers/llama-spm/vocab-only.gguf")
    if not tok then return pending(why) end
    local ids = tok:encode("Hello world")
    assert.are.equal(1, ids[1])
    assert.are.equal("<s> Hello world", (stream_all(tok, ids)))
    assert.are.equal(" Hello world", (stream_all(tok, ids, { skip_special = true })))
    assert.are.equal("Hello world", (stream_all(tok, ids, { skip_special = true, strip_space = true })))
  end)
end)

describe("documented lossy cases", function()
  it("qwen3 normalizes to NFC", function()
    local tok, why = load("file", "tokenizers/qwen3/tokenizer.json")
    if not tok then return pending(why) end
    assert.are.equal("\u{E9}", tok:decode(tok:encode("e\u{301}")))
    assert.are.same(tok:encode("\u{E9}"), tok:encode("e\u{301}"))
  end)

  it("gemma reads a literal U+2581 as a space", function()
    local tok, why = load("file", "tokenizers/gemma/tokenizer.json")
    if not tok then return pending(why) end
    assert.are.equal("a b", tok:decode(tok:encode("a\u{2581}b")))
  end)
end)

describe("errors", function()
  local function err_of(f, ...)
    local ok, msg = pcall(f, ...)
    assert.is_false(ok, "expected an error")
    return tostring(msg)
  end

  it("invalid UTF-8 in the text", function()
    local tok, why = load("file", "tokenizers/gpt2/tokenizer.json")
    if not tok then return pending(why) end
    local msg = err_of(tok.encode, tok, "abc\xff")
    assert.matches("not valid UTF-8", msg, 1, true)
    assert.matches("offset 3", msg, 1, true)
    assert.matches("not valid UTF-8", err_of(tok.encode, tok, "\xe2\x82"), 1, true) -- truncated
    assert.matches("not valid UTF-8", err_of(tok.encode, tok, "\xed\xa0\x80"), 1, true) -- surrogate
    assert.matches("not valid UTF-8", err_of(tok.encode, tok, "\xc0\xaf"), 1, true) -- overlong
  end)

  it("truncated JSON names the file", function()
    local full = read(FIXTURES .. "/tokenizers/gpt2/tokenizer.json")
    if not full then return pending("missing fixture " .. FIXTURES .. "/tokenizers/gpt2/tokenizer.json") end
    local path = write_temp(full:sub(1, 5000))
    local msg = err_of(tokenizer, { file = path, config = false })
    os.remove(path)
    assert.matches(path, msg, 1, true)
    assert.matches("invalid JSON", msg, 1, true)
  end)

  it("unknown model type", function()
    local path = write_temp('{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}')
    local msg = err_of(tokenizer, { file = path, config = false })
    os.remove(path)
    assert.matches(path, msg, 1, true)
    assert.matches("model type 'Unigram' is not supported", msg, 1, true)
  end)

  it("model.type null or not a string: a readable message, not a userdata's address", function()
    for text, want in pairs({
      ['{"model": {"type": null, "vocab": {}}}'] = "model.type is null or missing (ember implements BPE)",
      ['{"model": {"vocab": {}}}'] = "model.type is null or missing (ember implements BPE)",
      ['{"model": {"type": {"x": 1}, "vocab": {}}}'] = "model.type is a table, not a model name",
    }) do
      local path = write_temp(text)
      local msg = err_of(tokenizer, { file = path, config = false })
      os.remove(path)
      assert.matches(path, msg, 1, true)
      assert.matches(want, msg, 1, true)
      assert.is_nil(msg:find("userdata", 1, true), msg)
    end
  end)

  it("a merge naming a missing token", function()
    local path = write_temp('{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "a c"]}}')
    local msg = err_of(tokenizer, { file = path, config = false })
    os.remove(path)
    assert.matches(path, msg, 1, true)
    assert.matches("merge 1 names a token that is not in the vocabulary: 'c'", msg, 1, true)
  end)

  it("a merge whose result is missing, and malformed merges", function()
    local path = write_temp('{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}}')
    assert.matches("makes 'ab', which is not in the vocabulary", err_of(tokenizer, { file = path, config = false }),
      1, true)
    os.remove(path)
    path = write_temp('{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b c"]}}')
    assert.matches("model.merges[1] is neither", err_of(tokenizer, { file = path, config = false }), 1, true)
    os.remove(path)
  end)

  it("unsupported pieces are named", function()
    local cases = {
      { '{"normalizer": {"type": "NFKC"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}',
        "normalizer 'NFKC' is not supported" },
      { '{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\\\d+"}, "behavior": "Isolated"},'
        .. ' "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}',
        "Split pattern is not one ember implements" },
      { '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "continuing_subword_prefix": "##"}}',
        "continuing_subword_prefix is not supported" },
      { '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}}',
        "token id 0 is both" },
      { '{"pre_tokenizer": {"type": "ByteLevel", "use_regex": false}, "model": {"type": "BPE", "vocab": {"a": 0}}}',
        "byte-level vocabulary has no token for byte 0x00" },
    }
    for _, c in ipairs(cases) do
      local path = write_temp(c[1])
      local msg = err_of(tokenizer, { file = path, config = false })
      os.remove(path)
      assert.matches(c[2], msg, 1, true)
      assert.matches(path, msg, 1, true)
    end
  end)

  it("GGUF: missing file, no tokenizer, unknown tokenizer model, merge naming a missing token", function()
    -- a minimal GGUF v3 with metadata only, written here
    local function kv_str(k, v) return string.pack("<s8I4s8", k, 8, v) end
    local function kv_strs(k, arr)
      local parts = { string.pack("<s8I4I4I8", k, 9, 8, #arr) }
      for _, s in ipairs(arr) do parts[#parts + 1] = string.pack("<s8", s) end
      return table.concat(parts)
    end
    local function gguf(kvs) return string.pack("<c4I4I8I8", "GGUF", 3, 0, #kvs) .. table.concat(kvs) end

    assert.matches("cannot open", err_of(tokenizer, { gguf = "/nonexistent/vocab.gguf" }), 1, true)
    local cases = {
      { { kv_str("general.architecture", "llama") }, "has no embedded tokenizer" },
      { { kv_str("tokenizer.ggml.model", "bert"), kv_strs("tokenizer.ggml.tokens", { "a" }) },
        "tokenizer.ggml.model = 'bert' is not supported" },
      { { kv_str("tokenizer.ggml.model", "gpt2"), kv_str("tokenizer.ggml.pre", "default"),
          kv_strs("tokenizer.ggml.tokens", { "a" }) }, "tokenizer.ggml.pre = 'default' is not supported" },
      { { kv_str("tokenizer.ggml.model", "gpt2"), kv_str("tokenizer.ggml.pre", "gpt-2"),
          kv_strs("tokenizer.ggml.tokens", { "a", "b", "ab" }), kv_strs("tokenizer.ggml.merges", { "a c" }) },
        "merge 0 names a token that is not in the vocabulary: 'c'" },
    }
    for _, c in ipairs(cases) do
      local path = write_temp(gguf(c[1]))
      local msg = err_of(tokenizer, { gguf = path })
      os.remove(path)
      assert.matches(c[2], msg, 1, true)
      assert.matches(path, msg, 1, true)
    end
  end)

  it("bad arguments", function()
    local tok, why = load("file", "tokenizers/gpt2/tokenizer.json")
    if not tok then return pending(why) end
    assert.matches("unknown option 'bso'", err_of(tok.encode, tok, "x", { bso = true }), 1, true)
    assert.matches("must be a boolean", err_of(tok.encode, tok, "x", { bos = 1 }), 1, true)
    assert.matches("is not a token id", err_of(tok.decode, tok, { 1, "x" }), 1, true)
    assert.matches("is not a token", err_of(tok.decode, tok, { 1, 99999999 }), 1, true)
    assert.matches("exactly one of file", err_of(tokenizer, {}), 1, true)
    assert.matches("unknown option", err_of(tokenizer, { path = "x" }), 1, true)
  end)
end)

describe("lifetime", function()
  it("close is idempotent, a closed tokenizer raises, <close> works", function()
    local path = FIXTURES .. "/tokenizers/gpt2/vocab-only.gguf"
    if not read(path) then return pending("missing fixture " .. path) end
    local tok = tokenizer{ gguf = path }
    local st = tok:stream()
    tok:close()
    tok:close()
    local ok, msg = pcall(tok.encode, tok, "x")
    assert.is_false(ok)
    assert.matches("attempt to use a closed tokenizer", msg, 1, true)
    ok, msg = pcall(st.push, st, 1)
    assert.is_false(ok)
    assert.matches("closed tokenizer", msg, 1, true)
    do
      local t2 <close> = tokenizer{ gguf = path }
      assert.are.same({ 15496 }, t2:encode("Hello"))
    end
    collectgarbage()
    collectgarbage()
  end)

  it("a stream keeps its tokenizer alive", function()
    local path = FIXTURES .. "/tokenizers/gpt2/vocab-only.gguf"
    if not read(path) then return pending("missing fixture " .. path) end
    local st = tokenizer{ gguf = path }:stream()
    collectgarbage()
    collectgarbage()
    assert.are.equal("Hello", st:push(15496))
  end)
end)
