-- bench/tokenizer_bench.lua — tokenizer throughput on a few MB of mixed text, per family, and a
-- check that cost grows linearly with word length (a rescan-per-merge BPE would be quadratic).
--
--   lua5.4 bench/tokenizer_bench.lua [MB]     (run from the project root after building)
-- Fixtures come from EMBER_FIXTURES (default ../shared/fixtures); a missing one is skipped.

package.path = "lib/?.lua;lib/?/init.lua;" .. package.path
package.cpath = "build/lua/?.so;" .. package.cpath

local tokenizer = require("ember.model.tokenizer")

local fixtures = os.getenv("EMBER_FIXTURES") or "../shared/fixtures"
local target_mb = tonumber(arg[1]) or 4

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function now()
  return os.clock() -- CPU seconds: the tokenizer is single-threaded
end

-- Mixed text: every reference string (ASCII, whitespace runs, CJK, Cyrillic, Khmer, emoji,
-- digits, contractions), joined by newlines, repeated to the target size.
local vectors = read(fixtures .. "/tokenizers/gpt2/vectors.inp")
if not vectors then
  print("skipped: missing " .. fixtures .. "/tokenizers/gpt2/vectors.inp")
  return
end
local base = vectors:gsub("\n__ggml_vocab_test__\n", "\n")
local reps = math.max(1, math.floor(target_mb * 1024 * 1024 / #base))
local text = string.rep(base, reps)

local cases = {
  { "gpt2 (tokenizer.json)", { file = "tokenizers/gpt2/tokenizer.json" } },
  { "qwen3 (tokenizer.json)", { file = "tokenizers/qwen3/tokenizer.json" } },
  { "llama3 (tokenizer.json)", { file = "tokenizers/llama3/tokenizer.json" } },
  { "gemma (tokenizer.json)", { file = "tokenizers/gemma/tokenizer.json" } },
  { "gpt2 (vocab-only.gguf)", { gguf = "tokenizers/gpt2/vocab-only.gguf" } },
  { "llama-spm (vocab-only.gguf)", { gguf = "tokenizers/llama-spm/vocab-only.gguf" } },
}

print(string.format("text: %.2f MB (%d copies of the reference strings)", #text / 1048576, reps))
print(string.format("%-28s %8s %10s %12s %9s", "tokenizer", "load s", "tokens", "tokens/s", "MB/s"))
local loaded = {}
for _, case in ipairs(cases) do
  local name, spec = case[1], case[2]
  local rel = spec.file or spec.gguf
  local opts = spec.file and { file = fixtures .. "/" .. rel } or { gguf = fixtures .. "/" .. rel }
  if not read(fixtures .. "/" .. rel) then
    print(string.format("%-28s skipped: missing %s", name, fixtures .. "/" .. rel))
  else
    local t0 = now()
    local tok = tokenizer(opts)
    local t1 = now()
    local ids = tok:encode(text, { bos = false })
    local t2 = now()
    assert(tok:decode(ids) == text, name .. ": the benchmark text does not round-trip")
    print(string.format("%-28s %8.2f %10d %12.0f %9.2f", name, t1 - t0, #ids, #ids / (t2 - t1),
      #text / 1048576 / (t2 - t1)))
    loaded[#loaded + 1] = { name, tok }
  end
end

-- Word length scaling: one word of n letters (no merges can make it a single token), timed at
-- n and 4n. Linear cost gives a ratio near 4, quadratic near 16.
print("\nlong words: seconds for a word of n and 4n letters (ratio ~4 is linear, ~16 quadratic)")
local letters = {}
for i = 1, 200000 do letters[i] = string.char(97 + (i * 7919) % 26) end
local word = table.concat(letters)
for _, entry in ipairs(loaded) do
  local name, tok = entry[1], entry[2]
  local function timed(n)
    local s = word:sub(1, n)
    local t0 = now()
    tok:encode(s, { bos = false })
    return now() - t0
  end
  local a, b = timed(50000), timed(200000)
  print(string.format("%-28s %8.3f %8.3f  ratio %.1f", name, a, b, b / math.max(a, 1e-9)))
end
