-- ember.sweep.metric — the scalar a causal sweep (and attribution) measures on a run's next-token
-- logits: a logit difference between two tokens, the logit, probability or log-probability of a
-- token, or the KL divergence to the clean run. Must not run the model: it reads logits tensors
-- (f32, widened to double) and returns numbers.

local distribution = require("ember.analysis.distribution")
local selectors = require("ember.run.selectors")

local M = {}

M.KINDS = { "logit-diff", "prob", "kl", "logit", "logprob" }
-- how many tokens each kind reads
local TOKENS = { ["logit-diff"] = 2, prob = 1, kl = 0, logit = 1, logprob = 1 }
local GRAMMAR = "logit-diff[:A,B] | prob[:A] | logit[:A] | logprob[:A] | kl"
M.GRAMMAR = GRAMMAR -- the commands' help shows it

-- One item of the token list: a double-quoted string (\" \\ \n \t escapes) from `pos`, or the text
-- up to the next comma. Returns the item ({ text } or a token id) and the position after it, or
-- nil and a message.
local ESC = { ['"'] = '"', ["\\"] = "\\", n = "\n", t = "\t" }
local function item_at(rest, pos)
  if rest:sub(pos, pos) == '"' then
    local out, i = {}, pos + 1
    while true do
      local c = rest:sub(i, i)
      if c == "" then return nil, "an unterminated \" in '" .. rest .. "'" end
      if c == '"' then return { text = table.concat(out) }, i + 1 end
      if c == "\\" then
        local e = ESC[rest:sub(i + 1, i + 1)]
        if not e then return nil, "unknown escape \\" .. rest:sub(i + 1, i + 1) .. " in '" .. rest .. "'" end
        out[#out + 1] = e
        i = i + 2
      else
        out[#out + 1] = c
        i = i + 1
      end
    end
  end
  local j = rest:find(",", pos, true) or #rest + 1
  local raw = rest:sub(pos, j - 1)
  if raw == "" then return nil, "an empty token in '" .. rest .. "'" end
  return selectors.parse_uint(raw) or { text = raw }, j
end

-- token_items(rest) -> list of ids and { text } items, or nil and a message
local function token_items(rest)
  local items, pos = {}, 1
  while true do
    local it, next_pos = item_at(rest, pos)
    if not it then return nil, next_pos end
    items[#items + 1] = it
    local c = rest:sub(next_pos, next_pos)
    if c == "" then return items end
    if c ~= "," then return nil, "expected ',' after a quoted token in '" .. rest .. "'" end
    pos = next_pos + 1
  end
end

-- parse(text) -> { kind, tokens = { id | { text = "..." } ... } } or nil and a message. Grammar:
-- `logit-diff[:A,B]`, `prob[:A]`, `logit[:A]`, `logprob[:A]`, `kl`. A and B are token ids (digits),
-- token strings in double quotes (`logit-diff:" Paris"," Rome"`; escapes \" \\ \n \t), or any
-- other text up to the comma (`logit-diff: Paris, Rome`, what a shell leaves of the quoted form).
-- Strings are resolved to ids through the tokenizer by token_ids(); missing tokens are filled in by
-- resolve() from the runs.
function M.parse(text)
  if type(text) == "table" then return text end
  if type(text) ~= "string" then return nil, "metric: expected " .. GRAMMAR end
  local kind, rest = text:match("^([%a%-]+):(.*)$")
  kind = kind or text
  local want = TOKENS[kind]
  if not want then
    return nil, "metric: unknown metric '" .. text .. "' (expected " .. GRAMMAR .. ")"
  end
  local m = { kind = kind, tokens = {} }
  if rest then
    if want == 0 then return nil, "metric: kl takes no tokens (got '" .. text .. "')" end
    -- order matters (A - B), so the items are split here rather than read as a sorted list
    local items, err = token_items(rest)
    if not items or #items ~= want then
      return nil, string.format("metric: %s needs %d token%s after ':' (ids, or strings as \" Paris\")%s (got '%s')",
        kind, want, want > 1 and "s" or "", err and (": " .. err) or "", rest)
    end
    m.tokens = items
  end
  return m
end

-- token_ids(m, to_single_token) -> m with every token string replaced by its id: to_single_token(text)
-- (the model's m:to_single_token) raises unless the text is exactly one token.
function M.token_ids(m, to_single_token)
  local out = { kind = m.kind, tokens = {} }
  for i, t in ipairs(m.tokens or {}) do
    if type(t) == "table" or type(t) == "string" then -- { text = } from parse(), or a Lua caller's string
      local ok, id = pcall(to_single_token, type(t) == "table" and t.text or t)
      if not ok then error("metric: " .. tostring(id):gsub("^to_single_token: ", ""), 0) end
      out.tokens[i] = id
    else
      out.tokens[i] = t
    end
  end
  return out
end

local function values(t) return t:values() end

-- Probabilities of one logits row, in double (ember.analysis.distribution says why).
local softmax, kl = distribution.softmax, distribution.kl

-- resolve(m, clean_logits, corrupted_logits, n_vocab [, names]) -> m with its token ids decided: the
-- default logit difference is clean top-1 minus corrupted top-1; the default token of the others is
-- the clean top-1. names: what the two runs are called in messages (default { "clean", "corrupted" }).
function M.resolve(m, clean, corrupted, n_vocab, names)
  local r = { kind = m.kind, tokens = { table.unpack(m.tokens) } }
  for _, t in ipairs(r.tokens) do
    if type(t) ~= "number" then error("metric: token strings must be resolved first (token_ids)", 0) end
  end
  local top_c, top_x = clean:argmax() - 1, corrupted:argmax() - 1
  if r.kind == "logit-diff" and #r.tokens == 0 then
    if top_c == top_x then
      error(string.format("metric: logit-diff needs two tokens: the %s and %s runs both predict token %d; "
        .. "give them as logit-diff:A,B", names and names[1] or "clean", names and names[2] or "corrupted", top_c), 0)
    end
    r.tokens = { top_c, top_x }
  elseif TOKENS[r.kind] == 1 and #r.tokens == 0 then
    r.tokens = { top_c }
  end
  if r.kind == "logit-diff" and r.tokens[1] == r.tokens[2] then -- 0 whatever the patch does
    error(string.format("metric: logit-diff of token %d with itself is always 0; give two different tokens",
      r.tokens[1]), 0)
  end
  for _, id in ipairs(r.tokens) do
    if id >= n_vocab then
      error(string.format("metric: token %d is outside the vocabulary (%d tokens)", id, n_vocab), 0)
    end
  end
  return r
end

-- label(m [, token_text]) -> "logit(12) - logit(40)" style title text.
function M.label(m, text)
  local function tok(id)
    local s = text and text(id)
    return s and string.format("%d '%s'", id, s) or tostring(id)
  end
  if m.kind == "logit-diff" then return "logit difference " .. tok(m.tokens[1]) .. " - " .. tok(m.tokens[2]) end
  if m.kind == "prob" then return "probability of " .. tok(m.tokens[1]) end
  if m.kind == "logit" then return "logit of " .. tok(m.tokens[1]) end
  if m.kind == "logprob" then return "log-probability of " .. tok(m.tokens[1]) end
  return "KL(clean || patched)"
end

-- evaluator(m, clean_logits) -> function(logits) -> number. The clean distribution is computed once.
function M.evaluator(m, clean)
  if m.kind == "logit-diff" then
    local a, b = m.tokens[1] + 1, m.tokens[2] + 1
    return function(t) return t:get(1, a) - t:get(1, b) end
  elseif m.kind == "prob" then
    local a = m.tokens[1] + 1
    return function(t) return softmax(values(t))[a] end
  elseif m.kind == "logit" then
    local a = m.tokens[1] + 1
    return function(t) return t:get(1, a) end
  elseif m.kind == "logprob" then
    local a = m.tokens[1] + 1
    return function(t) return math.log(softmax(values(t))[a]) end
  end
  local pc = softmax(values(clean))
  return function(t) return kl(pc, softmax(values(t))) end
end

return M
