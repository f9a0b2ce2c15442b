-- ember.run.patch — replaces a live activation in place with a captured one (SPEC §6.2).
-- Must not guess: every evaluation of the target resolves to exactly one source record, and a
-- source record that is never applied fails the run.
--
-- Everything that allocates happens in patch.experiment() (setup): source tensors come from
-- artifact.read as ember.Tensors and are looked up by phase and start position, so the hook only
-- reads context fields, compares integers and calls view:copy_from. Two options cost a little in
-- the hook: position targeting takes a row sub-view per targeted row, and certify = true reads
-- the replaced bytes to compare them with the source's.

local artifact = require("ember.store.artifact")
local selectors = require("ember.run.selectors")

local M = {}

local function fail(msg, ...)
  error("activation-patch: " .. string.format(msg, ...), 0)
end

-- experiment{ source = artifact table or directory, target = { layer, stage }, model = model
--             [, positions = { p, ... }] [, certify = bool] }
-- -> the patch experiment (name "activation-patch"). Raises on every setup problem: missing or
-- ambiguous source, family / layer / width / dtype mismatch, a targeted position no record holds.
-- The source may come from another prompt of the same length (clean -> corrupted): records are
-- matched by position and row count, never by prompt.
function M.experiment(opts)
  local src = opts.source
  if type(src) == "string" then src = artifact.read(src) end
  local target, info = opts.target, opts.model.info
  local L, stage = target.layer, target.stage
  -- the logits stages (before_logits, after_logits) have no layer and one row per evaluation
  local logits_stage = selectors.STAGE_SET[stage] and not selectors.LAYER_STAGE_SET[stage]
  if logits_stage then
    if L ~= nil then fail("target stage '%s' has no layer (got layer %s)", stage, tostring(L)) end
    if opts.positions ~= nil then
      fail("target stage '%s' holds only the last position; positions do not apply", stage)
    end
  elseif not selectors.RESIDUAL_LAYER_STAGE_SET[stage] then
    fail("target %s", select(2, selectors.check_residual_layer_stage(stage)))
  elseif math.type(L) ~= "integer" or L < 0 or L >= info.n_layers then
    fail("target layer %s is out of range (the model has %d layers: 0-%d)", tostring(L), info.n_layers,
      info.n_layers - 1)
  end
  local what = L and string.format("%s layer %d", stage, L) or stage
  local width = stage == "after_logits" and info.n_vocab or info.hidden_size
  local sm = src.manifest
  if sm.model.family ~= info.family then
    fail("family mismatch: source artifact '%s' was captured from a %s model, this model is %s",
      src.dir, tostring(sm.model.family), info.family)
  end

  -- Position targeting: nil patches every row of every evaluation (the whole tensor); a list
  -- patches only those absolute positions (prefill rows and decode positions), row by row.
  local targets
  if opts.positions ~= nil then
    if type(opts.positions) ~= "table" or #opts.positions == 0 then
      fail("positions must be a non-empty list of absolute positions")
    end
    targets = {}
    for _, p in ipairs(opts.positions) do
      if math.type(p) ~= "integer" or p < 0 then fail("position %s is not a non-negative integer", tostring(p)) end
      targets[p] = true
    end
  end
  local certify = opts.certify == true

  -- phase -> start_position -> entry; built once, read by the hook
  local by_phase = { prefill = {}, decode = {} }
  local entries, holder = {}, {}
  local any = false
  for _, r in ipairs(src.records) do
    if r.stage == stage and r.layer == L then
      any = true
      local slot = by_phase[r.phase]
      local prev = slot[r.start_position]
      if prev then
        fail("ambiguous source: records %d and %d of '%s' are both %s; a target must resolve to exactly one record",
          prev.record.index, r.index, src.dir, artifact.record_label(r))
      end
      if r.shape[2] ~= width then
        fail("width mismatch: source record %d (%s) has %d columns, the model's %s is %d",
          r.index, artifact.record_label(r), r.shape[2], stage == "after_logits" and "vocabulary" or "hidden size",
          width)
      end
      local rows = r.shape[1]
      local e = { record = r, rows = rows, applied = 0 }
      if targets then
        -- one owned [1, cols] tensor per targeted row; a record holding no targeted position is
        -- not an entry (it never has to be applied)
        e.items = {}
        for row = 1, rows do
          local pos = r.start_position + row - 1
          if targets[pos] then
            local other = holder[pos]
            if other then
              fail("ambiguous source: position %d is held by records %d (%s) and %d (%s) of '%s'", pos,
                other.index, artifact.record_label(other), r.index, artifact.record_label(r), src.dir)
            end
            holder[pos] = r
            local t = r.tensor:row(row) -- a tensor's row is an owned [1, cols] copy
            e.items[#e.items + 1] = { row = row, position = pos, bytes = certify and t:bytes() or nil, tensor = t }
          end
        end
        if #e.items > 0 then slot[r.start_position] = e; entries[#entries + 1] = e end
      else
        e.tensor = r.tensor
        e.bytes = certify and r.tensor:bytes() or nil
        slot[r.start_position] = e
        entries[#entries + 1] = e
      end
    end
  end
  if not any then
    local have = {}
    for _, r in ipairs(src.records) do
      local k = r.stage .. (r.layer and (" layer " .. r.layer) or "")
      if not have[k] then have[k] = true; have[#have + 1] = k end
    end
    fail("no source record for %s in '%s' (it holds: %s)", what, src.dir,
      #have > 0 and table.concat(have, ", ") or "no records")
  end
  if targets then
    local missing = {}
    for p in pairs(targets) do if not holder[p] then missing[#missing + 1] = p end end
    table.sort(missing)
    if #missing > 0 then
      fail("no source record for %s at position%s %s in '%s': every targeted position needs one", what,
        #missing > 1 and "s" or "", table.concat(missing, ","), src.dir)
    end
  end

  local exp = { name = "activation-patch", source = src, target = target, entries = entries,
    positions = opts.positions,
    stats = { applied = 0, prefill = 0, decode = 0, source_records = #entries } }
  local stats = exp.stats
  -- row counters only where they mean something, so a plain patch reports what it always did
  local count_rows = targets ~= nil or certify
  local rows = { patched = 0, identical = 0 }
  if count_rows then stats.rows_patched = 0 end
  if certify then stats.rows_identical = 0 end
  exp[stage] = function(_, ctx, view)
    if ctx.layer_index ~= L then return end
    local phase = ctx.phase
    local e = by_phase[phase][ctx.start_position]
    if e == nil then
      if targets then
        -- only an evaluation that holds a targeted position needs a source
        local first = ctx.start_position
        for p = first, first + ctx.input_token_count - 1 do
          if targets[p] then
            fail("no source record for %s %s @%d in '%s' (it holds targeted position %d)",
              what, phase, first, src.dir, p)
          end
        end
        return
      end
      fail("no source record for %s %s @%d in '%s': every evaluation of the target needs one",
        what, phase, ctx.start_position, src.dir)
    end
    if (logits_stage and 1 or ctx.input_token_count) ~= e.rows then
      fail("shape mismatch at %s: the live tensor has %d rows, source record %d has %d (different prompt?)",
        artifact.record_label(e.record), ctx.input_token_count, e.record.index, e.rows)
    end
    if e.items then
      for _, it in ipairs(e.items) do
        local rv = view:row(it.row)
        -- certified: the bytes replaced were already the source's, so nothing changed
        if certify and rv:bytes() == it.bytes then rows.identical = rows.identical + 1 end
        rv:copy_from(it.tensor)
        rows.patched = rows.patched + 1
      end
    else
      if certify and view:bytes() == e.bytes then rows.identical = rows.identical + e.rows end
      view:copy_from(e.tensor)
      rows.patched = rows.patched + e.rows
    end
    if count_rows then stats.rows_patched = rows.patched end
    if certify then stats.rows_identical = rows.identical end
    e.applied = e.applied + 1
    stats.applied = stats.applied + 1
    stats[phase] = stats[phase] + 1
  end
  -- identical() -> true when every row the patch wrote already held exactly the source's bytes
  -- (needs certify = true); such a run must be bit-identical to the unpatched one.
  function exp.identical()
    assert(certify, "activation-patch: identical() needs certify = true")
    return rows.patched > 0 and rows.identical == rows.patched
  end
  function exp:on_generation_complete()
    for _, e in ipairs(entries) do
      if e.applied == 0 then
        fail("source record %d (%s) was never applied: the run never evaluated that target",
          e.record.index, artifact.record_label(e.record))
      end
    end
  end
  return exp
end

return M
