-- ember.sweep.pairs — the dataset of a sweep over many prompt pairs: a JSONL file (one
-- { "clean": ..., "corrupted": ..., "answer": " Mary", "wrong": " John" } per line, prompts as text
-- or token ids) or the same records as a Lua list, checked and resolved to token ids.
-- Must not run the model beyond its tokenizer: sweep/init.lua evaluates the pairs.

local json = require("ember.store.json")
local fs = require("ember.store.fs")
local token_label = require("ember.analysis.token_label")
local core = require("ember.core")

local M = {}

-- The largest pairs file read (fs.read's bound).
M.MAX_FILE_BYTES = 1 << 30
local KEYS = { clean = true, corrupted = true, answer = true, wrong = true }

local function fail(where, msg, ...) error(where .. ": " .. string.format(msg, ...), 0) end

-- prompt(model, v, where, what) -> ids, text: a non-empty text (tokenized as the model does) or a
-- non-empty list of token ids inside the vocabulary.
local function prompt(model, v, where, what)
  if type(v) == "string" then
    if v == "" then fail(where, "%s is an empty prompt", what) end
    return model:tokenize(v), v
  end
  if type(v) ~= "table" then
    fail(where, "%s must be a prompt (text or a list of token ids), got %s", what,
      v == nil and "nothing" or (v == json.null and "null" or type(v)))
  end
  if #v == 0 then fail(where, "%s is an empty list of token ids", what) end
  local n_vocab = model.info.n_vocab
  local ids = {}
  for i, id in ipairs(v) do
    if math.type(id) ~= "integer" or id < 0 or id >= n_vocab then
      fail(where, "%s[%d] is %s, not a token id (0..%d)", what, i - 1, tostring(id), n_vocab - 1)
    end
    ids[i] = id
  end
  return ids, nil
end

-- token(model, v, where, what) -> id or nil: a string that is exactly one token, or a token id
local function token(model, v, where, what)
  if v == nil or v == json.null then return nil end
  if math.type(v) == "integer" then
    if v < 0 or v >= model.info.n_vocab then fail(where, "%s is token %d, outside the vocabulary", what, v) end
    return v
  end
  if type(v) ~= "string" then fail(where, "%s must be a token string or id, got %s", what, type(v)) end
  local ok, id = pcall(model.to_single_token, model, v)
  if not ok then fail(where, "%s: %s", what, tostring(id):gsub("^to_single_token: ", "")) end
  return id
end

-- item(model, rec, where, steps) -> { clean_ids, clean_text, corrupted_ids, corrupted_text, answer, wrong }
local function item(model, rec, where, steps)
  if type(rec) ~= "table" or rec[1] ~= nil then
    fail(where, "expected an object { \"clean\": ..., \"corrupted\": ..., \"answer\": ..., \"wrong\": ... }")
  end
  for k in pairs(rec) do
    if not KEYS[k] then fail(where, "unknown key '%s' (expected clean, corrupted, answer, wrong)", tostring(k)) end
  end
  local it = {}
  it.clean_ids, it.clean_text = prompt(model, rec.clean, where, "clean")
  it.corrupted_ids, it.corrupted_text = prompt(model, rec.corrupted, where, "corrupted")
  if #it.clean_ids ~= #it.corrupted_ids then
    fail(where, "the clean prompt has %d tokens and the corrupted prompt %d: patching by position needs equal "
      .. "lengths\n  clean:     %s\n  corrupted: %s", #it.clean_ids, #it.corrupted_ids,
      table.concat(token_label.positions(model, it.clean_ids), " | "),
      table.concat(token_label.positions(model, it.corrupted_ids), " | "))
  end
  local ctx = model.info.context_length
  if ctx and ctx > 0 and #it.clean_ids + steps > ctx then
    fail(where, "%d tokens%s are over the model's context (%d)", #it.clean_ids,
      steps > 0 and string.format(" + %d decode steps", steps) or "", ctx)
  end
  it.answer = token(model, rec.answer, where, "answer")
  it.wrong = token(model, rec.wrong, where, "wrong")
  if it.answer ~= nil and it.answer == it.wrong then
    fail(where, "answer and wrong are the same token (%d): their logit difference is always 0", it.answer)
  end
  return it
end

-- read(model, src, steps) -> { items, file = { path, sha256 } | nil }. src: a JSONL path, or a list
-- of records. Every problem is named by its line (1-based) or list index; blank lines are skipped;
-- all pairs must have the same length (the grid's positions are absolute).
function M.read(model, src, steps)
  local records, file = {}, nil
  if type(src) == "string" then
    local where = "pairs '" .. src .. "'"
    if not fs.exists(src) then fail(where, "cannot open the file") end
    local text = fs.read(src, where, M.MAX_FILE_BYTES)
    file = { path = src, sha256 = core.sha256(text) }
    local n = 0
    for line in (text .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      if line:match("%S") then
        local lw = string.format("%s:%d", src, n)
        records[#records + 1] = { where = lw, rec = json.decode(line, lw) }
      end
    end
  elseif type(src) == "table" then
    for i, rec in ipairs(src) do records[i] = { where = string.format("pairs[%d]", i), rec = rec } end
  else
    error("sweep: pairs must be a JSONL file name or a list of { clean, corrupted, answer, wrong }", 0)
  end
  if #records == 0 then
    error(string.format("sweep: %s holds no pairs", file and ("pairs '" .. file.path .. "'") or "pairs"), 0)
  end
  local items = {}
  for i, r in ipairs(records) do
    local it = item(model, r.rec, r.where, steps)
    it.where = r.where
    if i > 1 and #it.clean_ids ~= #items[1].clean_ids then
      fail(r.where, "%d tokens, %s has %d: every pair needs the same length (the grid's positions are absolute)",
        #it.clean_ids, items[1].where, #items[1].clean_ids)
    end
    items[i] = it
  end
  return { items = items, file = file }
end

-- metric_for(m, it) -> the metric of one pair: the metric's own tokens when it names them, else the
-- pair's answer (and wrong, for a logit difference); what is still missing is filled from the runs'
-- top-1s as for one pair (metric.resolve).
function M.metric_for(m, it)
  if #m.tokens > 0 or m.kind == "kl" then return m end
  local tokens = {}
  if m.kind == "logit-diff" then
    if it.answer and it.wrong then tokens = { it.answer, it.wrong } end
  elseif it.answer then
    tokens = { it.answer }
  end
  return { kind = m.kind, tokens = tokens }
end

return M
