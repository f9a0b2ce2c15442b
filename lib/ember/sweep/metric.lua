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

-- parse(text) -> { kind, tokens = {ids...} } or nil and a message. Grammar: `logit-diff[:A,B]`,
-- `prob[:A]`, `logit[:A]`, `logprob[:A]`, `kl`; A and B are token ids. Missing ids are filled in
-- by resolve() from the runs.
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
    -- order matters (A - B), so the ids are split here rather than read as a sorted list
    local ids = {}
    for item in (rest .. ","):gmatch("([^,]*),") do ids[#ids + 1] = selectors.parse_uint(item) or false end
    local bad = false
    for _, id in ipairs(ids) do if id == false then bad = true end end
    if bad or #ids ~= want then
      return nil, string.format("metric: %s needs %d token id%s after ':' (got '%s')", kind, want,
        want > 1 and "s" or "", rest)
    end
    m.tokens = ids
  end
  return m
end

local function values(t) return t:values() end

-- Probabilities of one logits row, in double (ember.analysis.distribution says why).
local softmax, kl = distribution.softmax, distribution.kl

-- resolve(m, clean_logits, corrupted_logits, n_vocab [, names]) -> m with its token ids decided: the
-- default logit difference is clean top-1 minus corrupted top-1; the default token of the others is
-- the clean top-1. names: what the two runs are called in messages (default { "clean", "corrupted" }).
function M.resolve(m, clean, corrupted, n_vocab, names)
  local r = { kind = m.kind, tokens = { table.unpack(m.tokens) } }
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
