-- fuzz/make_tokenizer_seeds.lua FIXTURES_TOKENIZERS_DIR OUT_DIR — seeds for fuzz_tokenizer: each
-- fixture tokenizer.json cut down to its first ids (the full files are megabytes, too slow to
-- mutate), keeping its normalizer, pre-tokenizer, decoder and post-processor, the merges among the
-- kept tokens and the added tokens renumbered after them. Plus one hand-written minimal file.
local cjson = require("cjson")

local src, out = arg[1], arg[2]
local KEEP = 300 -- ids 0..KEEP-1 of the model vocabulary
local MAX_MERGES = 400

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function cut(j)
  local vocab, kept = {}, {}
  for tok, id in pairs(j.model.vocab) do
    if id < KEEP then
      vocab[tok] = id
      kept[tok] = true
    end
  end
  local merges = {}
  for _, m in ipairs(j.model.merges or {}) do
    local l, r
    if type(m) == "string" then l, r = m:match("^(.-) (.*)$") else l, r = m[1], m[2] end
    if l and kept[l] and kept[r] and kept[l .. r] then
      merges[#merges + 1] = m
      if #merges >= MAX_MERGES then break end
    end
  end
  local added, next_id = {}, KEEP
  for _, a in ipairs(j.added_tokens or {}) do
    if #added < 16 then
      a.id = a.id < KEEP and a.id or next_id
      if a.id == next_id then next_id = next_id + 1 end
      added[#added + 1] = a
    end
  end
  j.model.vocab, j.model.merges, j.added_tokens = vocab, merges, added
  if #merges == 0 then j.model.merges = nil end
  return cjson.encode(j)
end

local n = 0
for _, name in ipairs({ "gpt2", "llama3", "qwen3", "gemma", "llama-spm" }) do
  local text = read(src .. "/" .. name .. "/tokenizer.json")
  if text then
    local ok, j = pcall(cjson.decode, text)
    if ok and type(j) == "table" and type(j.model) == "table" and type(j.model.vocab) == "table" then
      write(out .. "/seed-" .. name .. ".json", cut(j))
      n = n + 1
    end
  end
end
write(out .. "/seed-minimal.json",
  '{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},'
  .. '"added_tokens":[{"id":3,"content":"<s>","special":true}]}')
io.stderr:write(string.format("make_tokenizer_seeds: %d fixture seeds and 1 minimal seed in %s\n", n, out))
