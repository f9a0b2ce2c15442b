-- ember.analysis.quant_select — the passes of `ember quant-recipe` (docs/quant-recipe.md): the first
-- pass (each group of weights alone from A; a group identical in A and B certified 0 with no pass),
-- the greedy selection re-measured jointly under a byte budget, and the recipe's lines for
-- llama-quantize's --tensor-type-file (with their reading back, for the round-trip check). Must not
-- load models nor write files: the caller's `load(names)` gives B with those tensors from A.

local qr = require("ember.analysis.quant_recipe")

local M = {}

local function fail(msg, ...) error("quant-recipe: " .. string.format(msg, ...), 0) end

M.ALGORITHM = "greedy: groups in decreasing first-pass recovered share per added byte (ties by name); each "
  .. "one within the budget is added when B with it and the groups already chosen taken from A, measured "
  .. "jointly, recovers more than without it; stop at the target"

local function names_of(groups)
  local out = {}
  for _, g in ipairs(groups) do
    for _, t in ipairs(g.tensors) do out[#out + 1] = t.name end
  end
  return out
end

-- one measured configuration: B with the tensors of `groups` from A
local function measure_with(o, groups)
  local m = o.load(names_of(groups))
  local ok, r = pcall(qr.measure, m, o.prompts, o.ref)
  m:close()
  if not ok then error(r, 0) end
  r.recovered = qr.recovered(o.base.divergence, r.divergence)
  return r
end

-- first_pass(o) -> o.groups, each with .recovered, .certified (identical in A and B: 0, no pass), and
-- the measurement's kl / top1 / divergence. o: { groups, prompts, ref, base, load, same(name),
-- progress(msg) }, and optionally done (name -> a measurement saved earlier: taken as it is),
-- mine(i) (a shard measures only the groups i it returns true for) and save(g) (after each group).
-- Returns the groups, and how many were measured and resumed.
function M.first_pass(o)
  local measured, resumed = 0, 0
  for i, g in ipairs(o.groups) do
    local saved = o.done and o.done[g.name]
    if saved then
      require("ember.analysis.quant_first_pass").restore(g, saved)
      resumed = resumed + 1
    elseif not o.mine or o.mine(i) then
      local identical = true
      for _, t in ipairs(g.tensors) do
        if not o.same(t.name) then identical = false end
      end
      if identical then
        g.certified, g.recovered = true, 0
      else
        local r = measure_with(o, { g })
        g.recovered, g.divergence, g.kl, g.top1 = r.recovered, r.divergence, r.kl, r.top1
      end
      measured = measured + 1
      if o.save then o.save(g) end
      o.progress(string.format("first pass %d/%d %s: recovered %.4g%s", i, #o.groups, g.name, g.recovered,
        identical and " (identical in A and B: certified, no pass)" or ""))
    end
  end
  return o.groups, measured, resumed
end

-- candidates(groups) -> the groups that recovered something alone, best share per added byte first
local function candidates(groups)
  local out = {}
  for _, g in ipairs(groups) do
    if not g.certified and g.recovered > 0 then out[#out + 1] = g end
  end
  local function per_byte(g) return g.recovered / math.max(g.added_bytes, 1) end
  table.sort(out, function(x, y)
    if per_byte(x) ~= per_byte(y) then return per_byte(x) > per_byte(y) end
    return x.name < y.name
  end)
  return out
end

-- select(o) -> { steps = { { group, added_bytes, recovered, kl, top1, accepted, skipped } }, chosen =
-- { groups }, recovered, added_bytes, reached }. o as first_pass's, plus target and budget (bytes or nil).
function M.select(o)
  local cand = candidates(o.groups)
  if o.budget and #cand > 0 then
    local smallest = cand[1]
    for _, g in ipairs(cand) do if g.added_bytes < smallest.added_bytes then smallest = g end end
    if smallest.added_bytes > o.budget then
      fail("--budget-mib: %.6g MiB is smaller than any group's added bytes (the smallest, %s, adds %.6g MiB)",
        o.budget / 1048576, smallest.name, smallest.added_bytes / 1048576)
    end
  end
  local r = { steps = {}, chosen = {}, recovered = 0, added_bytes = 0, reached = false }
  for i, g in ipairs(cand) do
    if r.recovered >= o.target then break end
    local step = { group = g.name, added_bytes = r.added_bytes + g.added_bytes }
    if o.budget and step.added_bytes > o.budget then
      step.skipped = "budget"
    else
      local trial = { table.unpack(r.chosen) }
      trial[#trial + 1] = g
      local m = measure_with(o, trial)
      step.recovered, step.kl, step.top1 = m.recovered, m.kl, m.top1
      step.accepted = m.recovered > r.recovered
      if step.accepted then
        r.chosen, r.recovered, r.added_bytes = trial, m.recovered, step.added_bytes
        r.kl, r.top1 = m.kl, m.top1
      end
    end
    r.steps[#r.steps + 1] = step
    o.progress(string.format("selection %d/%d %s: %s", i, #cand, g.name, step.skipped and "over the budget"
      or string.format("joint recovered %.4g, %s", step.recovered, step.accepted and "kept" or "dropped")))
  end
  r.reached = r.recovered >= o.target
  return r
end

-- ---- the recipe file ------------------------------------------------------------------------------

-- llama-quantize reads each NAME of --tensor-type(-file) as a regex searched in tensor names (so
-- `output.weight` would also pick blk.N.attn_output.weight): each line is the name escaped and
-- anchored, which only that tensor matches.
local function escape(name) return "^" .. name:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?{}|\\]", "\\%0") .. "$" end

-- lines(b_tensors, chosen) -> the recipe's lines (escaped name = type), one per weight of two or more
-- dimensions in B's order: the chosen groups' recipe types, every other weight its type in B (so
-- `llama-quantize --pure` writes B's own types there), and the count of lines whose type changes.
function M.lines(tensors, chosen)
  local pick = {}
  for _, g in ipairs(chosen) do
    for name, ty in pairs(g.types) do pick[name] = ty end
  end
  local out, changed = {}, 0
  for _, t in ipairs(tensors) do
    if #t.shape >= 2 then
      local ty = pick[t.name] or t.type:lower()
      if pick[t.name] then changed = changed + 1 end
      out[#out + 1] = escape(t.name) .. "=" .. ty
    end
  end
  return out, changed
end

-- read_lines(text) -> { { name, type } }: a recipe file read back (the round-trip check)
function M.read_lines(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do
    local pat, ty = line:match("^%^(.*)%$=([%w_]+)$")
    if not pat then fail("recipe line '%s' is not ^NAME$=TYPE", line) end
    out[#out + 1] = { name = (pat:gsub("\\(.)", "%1")), type = ty }
  end
  return out
end

-- base_type(b_tensors) -> the type most of B's weights have, upper case (llama-quantize's type argument)
function M.base_type(tensors)
  local count, best = {}, nil
  for _, t in ipairs(tensors) do
    if #t.shape >= 2 then
      local ty = t.type:lower()
      count[ty] = (count[ty] or 0) + 1
      if not best or count[ty] > count[best] or (count[ty] == count[best] and ty < best) then best = ty end
    end
  end
  return (best or "f32"):upper()
end

return M
