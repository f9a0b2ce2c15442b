-- ember.analysis.distribution — next-token distributions of a logits row in double precision: the
-- softmax and the KL divergence that sweep metrics and compare-models report. Must not read models
-- or files: it takes a row's values (f32 widened to double) and returns numbers.
--
-- Why not the core's t:softmax(): it rounds to f32, and these numbers are small differences of
-- near-equal distributions (a KL of 1e-9 between a clean and an almost restored run); probabilities
-- rounded to f32 (relative step 6e-8) would bury them. One owner, so both reports round alike.

local M = {}

-- softmax(v) -> the probabilities of the logits list v (doubles), the maximum subtracted first.
function M.softmax(v)
  local mx = -math.huge
  for i = 1, #v do if v[i] > mx then mx = v[i] end end
  local p, sum, exp = {}, 0.0, math.exp
  for i = 1, #v do local e = exp(v[i] - mx); p[i] = e; sum = sum + e end
  for i = 1, #v do p[i] = p[i] / sum end
  return p
end

-- kl(p, q) -> KL(p || q) = sum of p log(p / q) over the entries where p > 0.
function M.kl(p, q)
  local d, log = 0.0, math.log
  for i = 1, #p do
    if p[i] > 0 then d = d + p[i] * (log(p[i]) - log(q[i])) end
  end
  return d
end

return M
