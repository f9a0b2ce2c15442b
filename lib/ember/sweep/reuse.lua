-- ember.sweep.reuse — a sweep cell evaluates only what its patch can change. A patch at position p
-- leaves every position before p as the corrupted baseline computed it (a causal model: a row
-- depends on the rows before it only), so the session keeps the baseline's KV cache of 0..p-1
-- (session:rewind) and evaluates p onwards; and a cell whose tokens are the same in both runs up
-- to p writes the bytes already there, so it needs no pass at all.
-- Must not measure or store: sweep/init.lua does, with the same bits as a run from position 0
-- (spec/sweep_spec.lua compares every cell of a grid both ways; tests/test_session_rewind.c the
-- engine's identity underneath).

local M = {}
M.__index = M

-- The token each run feeds at every position: the prompt, then decode step k's input (the token
-- generated at step k) at position #prompt + k - 1.
local function fed(ids, generated, steps)
  local seq = { table.unpack(ids) }
  for k = 1, steps do seq[#seq + 1] = generated[k] end
  return seq
end

-- new{ session, clean_ids, corrupted_ids, clean_generated, corrupted_generated, steps } -> the
-- reuse state of one sweep; the session must hold the corrupted baseline's run, whole.
function M.new(o)
  local self = setmetatable({ session = o.session, prompt_len = #o.corrupted_ids, steps = o.steps,
    corrupted_ids = o.corrupted_ids, generated = o.corrupted_generated }, M)
  self.seq = fed(o.corrupted_ids, o.corrupted_generated, o.steps)
  -- same_upto: the number of leading positions whose tokens both runs feed alike
  local clean = fed(o.clean_ids, o.clean_generated, o.steps)
  local n = 0
  while n < #self.seq and self.seq[n + 1] == clean[n + 1] do n = n + 1 end
  self.same_upto = n
  self.valid = o.session.position -- cache rows 0..valid-1 hold the corrupted baseline's
  return self
end

-- same_prefix(p) -> both runs feed the same tokens at positions 0..p: the clean row at p is the
-- corrupted one, bit for bit, and patching it changes nothing.
function M:same_prefix(p)
  return p < self.same_upto
end

-- Brings the cache to the corrupted baseline's rows 0..p-1 with the position at p: a rewind, and
-- the positions a previous cell overwrote evaluated again as the baseline did (prompt positions
-- as one prefill, decode positions one decode each: the baseline's own evaluations).
function M:prefix(p)
  local s = self.session
  if self.valid >= p then
    s:rewind(p)
    return
  end
  s:rewind(self.valid)
  local P = self.prompt_len
  if self.valid < P then
    local upto = p < P and p or P
    s:prefill({ table.unpack(self.seq, self.valid + 1, upto) })
    self.valid = upto
  end
  for q = self.valid, p - 1 do s:decode(self.seq[q + 1]) end
  self.valid = p
end

-- run(p, exp) -> logits, generated: the corrupted run with exp attached, evaluated from position
-- p on (the prefill's rest and every decode step, or from decode step k when p = #prompt + k - 1),
-- as run_once would have given it from position 0.
function M:run(p, exp)
  self:prefix(p)
  local s, P, opts = self.session, self.prompt_len, { experiment = exp }
  local logits
  local generated = {}
  if p < P then
    logits = s:prefill({ table.unpack(self.corrupted_ids, p + 1, P) }, opts)
  else
    local k = p - P + 1 -- decode step k: the logits before it are the baseline's, so is its input
    for i = 1, k do generated[i] = self.generated[i] end
    logits = s:decode(generated[k], opts)
  end
  for _ = #generated + 1, self.steps do
    local t = logits:argmax() - 1
    generated[#generated + 1] = t
    logits = s:decode(t, opts)
  end
  self.valid = p -- the rows from p on are the patched run's now
  return logits, generated
end

return M
