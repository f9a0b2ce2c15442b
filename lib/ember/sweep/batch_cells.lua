-- ember.sweep.batch_cells — the pairs of a sweep over a dataset (--pairs) as the sequences of one
-- batch (model:batch): each sequence holds its pair's corrupted baseline's cache, and a cell
-- evaluates every pair it needs in one pass, each sequence rewound to the cell's position and its
-- rows from there patched with its own pair's clean activation (reuse.lua's rule, for all of them
-- at once). A batch changes no sequence's bits, so every pair's logits are the ones it computes
-- alone (spec/sweep_pairs_spec.lua compares the cells both ways). Prompt positions only: a sweep
-- with decode steps runs its pairs one after another. Must not measure or store (sweep/init.lua).

local M = {}
M.__index = M

local function fail(msg, ...) error("sweep: " .. string.format(msg, ...), 0) end

-- new(model, units) -> the batch of the units (pairs of one prompt length), each sequence holding its
-- corrupted baseline's run; the baselines' logits are checked against the units' own
function M.new(model, units)
  local P = #units[1].corrupted_ids
  local self = setmetatable({ units = units, P = P, valid = {} }, M)
  self.batch = model:batch { size = #units, context = P }
  local ids = {}
  for i, u in ipairs(units) do ids[i] = u.corrupted_ids end
  local logits = self.batch:prefill(ids)
  for i, u in ipairs(units) do
    if logits[i]:bytes() ~= u.corr_bytes then
      fail("pair %d%s: its corrupted run in a batch differs from its run alone (a batch must change no bit)", i,
        u.where)
    end
    self.valid[i] = P -- cache rows 0..valid-1 hold the corrupted baseline's
  end
  return self
end

-- An experiment whose hooks give each sequence's rows to that sequence's own experiment, with the
-- context its own evaluation would have (its start position and row count).
local function per_sequence(exps, stage)
  local exp = { name = "sweep-batch" }
  exp[stage] = function(_, ctx, view)
    for _, q in ipairs(ctx.sequences) do
      local e = exps[q.index]
      if e then
        local own = setmetatable({ start_position = q.start_position, input_token_count = q.length },
          { __index = function(_, k) return ctx[k] end })
        e[stage](e, own, view:sequence(q.index))
      end
    end
  end
  return exp
end

-- run(list, p, exps, stage) -> logits: the pairs `list` (unit numbers) evaluated from position p to
-- the prompt's end with exps[i] (unit i's patch, at `stage`), in one batch pass; the result in the
-- order of list. The caches of the positions a previous cell overwrote are evaluated again first
-- (the baseline's rows, without a hook), then every sequence is rewound to p.
function M:run(list, p, exps, stage)
  local b, again, again_ids = self.batch, {}, {}
  for _, i in ipairs(list) do
    local v = self.valid[i]
    if v >= p then
      b:rewind(i, p)
    else
      b:rewind(i, v)
      again[#again + 1] = i
      again_ids[#again_ids + 1] = { table.unpack(self.units[i].corrupted_ids, v + 1, p) }
    end
  end
  if #again > 0 then b:prefill(again_ids, { sequences = again }) end
  local rest = {}
  for k, i in ipairs(list) do rest[k] = { table.unpack(self.units[i].corrupted_ids, p + 1, self.P) } end
  local logits = b:prefill(rest, { sequences = list, experiment = per_sequence(exps, stage) })
  for _, i in ipairs(list) do self.valid[i] = p end -- the rows from p on are the patched run's now
  return logits
end

function M:close() self.batch:close() end

return M
