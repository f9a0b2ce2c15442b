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

local function is_tensor(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__name") == "ember.Tensor"
end

-- The records of an in-memory capture (capture.experiment after its run), checked as the artifact
-- reader checks a record on disk, each tensor an owned ember.Tensor of the record's shape.
local function memory_records(records)
  local out = {}
  for i, r in ipairs(records) do
    local where = "source: in-memory capture record " .. (i - 1)
    if type(r) ~= "table" then fail("%s is a %s, not a record", where, type(r)) end
    local ok, err = pcall(artifact.check_record_fields, r, where)
    if not ok then fail("%s", err) end
    if not is_tensor(r.tensor) then
      fail("%s (%s) holds no owned ember.Tensor (a view expires with its hook: keep view:clone())", where,
        artifact.record_label(r))
    end
    local shape = r.tensor:shape()
    if shape[1] ~= r.shape[1] or shape[2] ~= r.shape[2] then
      fail("%s (%s): its tensor is [%d, %d], the record says [%d, %d]", where, artifact.record_label(r), shape[1],
        shape[2], r.shape[1], r.shape[2])
    end
    out[i] = { index = i - 1, stage = r.stage, layer = r.layer, phase = r.phase, start_position = r.start_position,
      shape = r.shape, tensor = r.tensor }
  end
  return out
end

-- The source as the patch reads it: { where (how messages name it), family, records }. From an
-- artifact directory (read and verified), an artifact already read (artifact.read), or an in-memory
-- capture (capture.experiment, after the run it observed: it knows the model's family).
local function resolve_source(src)
  if type(src) == "string" then src = artifact.read(src) end
  if type(src) ~= "table" then
    fail("source must be an artifact directory, an artifact read with ember.store.artifact.read, or an in-memory "
      .. "capture (ember.run.capture.experiment), got a %s", type(src))
  end
  if type(src.manifest) == "table" and type(src.records) == "table" then
    return { where = "'" .. tostring(src.dir) .. "'", family = src.manifest.model.family, records = src.records,
      model_sha256 = src.manifest.model.sha256, artifact = src.dir, artifact_sha256 = src.manifest_sha256 }
  end
  if type(src.records) ~= "table" then
    fail("source is a table with neither an artifact's manifest nor a capture's records")
  end
  if type(src.model) ~= "table" then
    fail("source: the in-memory capture has not observed a run yet (it learns the model's family when its run "
      .. "starts); run it first, or write it to an artifact")
  end
  return { where = "the in-memory capture", family = src.model.family, records = memory_records(src.records) }
end

-- The options, checked before anything is read: a mistake is a message, never a Lua error inside.
local function check_options(opts)
  if type(opts) ~= "table" then fail("expected a table of options, got a %s", type(opts)) end
  local model = opts.model
  if model == nil or type(model.info) ~= "table" then fail("model = <the loaded model> is required") end
  if type(opts.target) ~= "table" then fail("target = { layer = L, stage = STAGE } is required") end
  if opts.source == nil then fail("source = <artifact directory | artifact | in-memory capture> is required") end
end

-- target(opts, info) -> L, stage, what (its label), width, logits_stage: the target checked against
-- the model. The logits stages (before_logits, after_logits) have no layer and one row per evaluation.
local function target(opts, info)
  local L, stage = opts.target.layer, selectors.stage_name(opts.target.stage) or opts.target.stage
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
  return L, stage, what, width, logits_stage
end

-- Position targeting: nil patches every row of every evaluation (the whole tensor); a list
-- patches only those absolute positions (prefill rows and decode positions), row by row.
local function position_set(positions)
  if positions == nil then return nil end
  if type(positions) ~= "table" or #positions == 0 then
    fail("positions must be a non-empty list of absolute positions")
  end
  local targets = {}
  for _, p in ipairs(positions) do
    if math.type(p) ~= "integer" or p < 0 then fail("position %s is not a non-negative integer", tostring(p)) end
    targets[p] = true
  end
  return targets
end

-- entry(r, t, holder, source) -> the entry of source record r: its tensor (or, with position targets,
-- one owned [1, cols] tensor per targeted row, and nil when it holds none: it never has to be
-- applied), with the bytes certify compares. holder: position -> the record holding it.
local function entry(r, t, holder, source)
  local e = { record = r, rows = r.shape[1], applied = 0 }
  if not t.targets then
    e.tensor = r.tensor
    e.bytes = t.certify and r.tensor:bytes() or nil
    return e
  end
  e.items = {}
  for row = 1, e.rows do
    local pos = r.start_position + row - 1
    if t.targets[pos] then
      local other = holder[pos]
      if other then
        fail("ambiguous source: position %d is held by records %d (%s) and %d (%s) of %s", pos,
          other.index, artifact.record_label(other), r.index, artifact.record_label(r), source.where)
      end
      holder[pos] = r
      local v = r.tensor:row(row) -- a tensor's row is an owned [1, cols] copy
      e.items[#e.items + 1] = { row = row, position = pos, bytes = t.certify and v:bytes() or nil, tensor = v }
    end
  end
  return #e.items > 0 and e or nil
end

-- entries_of(source, t) -> by_phase (phase -> start_position -> entry; built once, read by the hook)
-- and the entries in record order. Every record of the target is checked; none, or a targeted
-- position no record holds, fails naming what the source does hold.
local function entries_of(source, t)
  local by_phase, entries, holder, any = { prefill = {}, decode = {} }, {}, {}, false
  for _, r in ipairs(source.records) do
    if r.stage == t.stage and r.layer == t.L then
      any = true
      local slot = by_phase[r.phase]
      local prev = slot[r.start_position]
      if prev then
        fail("ambiguous source: records %d and %d of %s are both %s; a target must resolve to exactly one record",
          prev.record.index, r.index, source.where, artifact.record_label(r))
      end
      if r.shape[2] ~= t.width then
        fail("width mismatch: source record %d (%s) has %d columns, the model's %s is %d", r.index,
          artifact.record_label(r), r.shape[2], t.stage == "after_logits" and "vocabulary" or "hidden size", t.width)
      end
      local e = entry(r, t, holder, source)
      if e then slot[r.start_position] = e; entries[#entries + 1] = e end
    end
  end
  if not any then
    local have = {}
    for _, r in ipairs(source.records) do
      local k = r.stage .. (r.layer and (" layer " .. r.layer) or "")
      if not have[k] then have[k] = true; have[#have + 1] = k end
    end
    fail("no source record for %s in %s (it holds: %s)", t.what, source.where,
      #have > 0 and table.concat(have, ", ") or "no records")
  end
  if t.targets then
    local missing = {}
    for p in pairs(t.targets) do if not holder[p] then missing[#missing + 1] = p end end
    table.sort(missing)
    if #missing > 0 then
      fail("no source record for %s at position%s %s in %s: every targeted position needs one", t.what,
        #missing > 1 and "s" or "", table.concat(missing, ","), source.where)
    end
  end
  return by_phase, entries
end

-- continued(slot, first) -> the entry whose record holds position first past its start (the
-- evaluation of a session rewound into it), or nil; a scan of one phase's few entries, no allocation
local function continued(slot, first)
  for start, e in pairs(slot) do
    if first > start and first < start + e.rows then return e end
  end
  return nil
end

-- hook(t, source, by_phase, stats, rows) -> the target stage's hook: it finds the evaluation's entry,
-- checks its rows and copies the source in (comparing first when certifying); it allocates nothing.
local function hook(t, source, by_phase, stats, rows)
  local L, targets, certify, what, logits_stage = t.L, t.targets, t.certify, t.what, t.logits_stage
  -- row counters only where they mean something, so a plain patch reports what it always did
  local count_rows = targets ~= nil or certify
  return function(_, ctx, view)
    if ctx.layer_index ~= L then return end
    local phase = ctx.phase
    local first = ctx.start_position
    local e = by_phase[phase][first]
    -- a session rewound into a record (session:rewind) evaluates the record's last rows only: with
    -- position targets, its rows are the record's from first on
    local skip = 0
    if e == nil and targets then
      e = continued(by_phase[phase], first)
      if e then skip = first - e.record.start_position end
    end
    if e == nil then
      if targets then
        -- only an evaluation that holds a targeted position needs a source
        for p = first, first + ctx.input_token_count - 1 do
          if targets[p] then
            fail("no source record for %s %s @%d in %s (it holds targeted position %d)",
              what, phase, first, source.where, p)
          end
        end
        return
      end
      fail("no source record for %s %s @%d in %s: every evaluation of the target needs one",
        what, phase, ctx.start_position, source.where)
    end
    if (logits_stage and 1 or ctx.input_token_count) ~= e.rows - skip then
      fail("shape mismatch at %s: the live tensor has %d rows, source record %d has %d (different prompt?)",
        artifact.record_label(e.record), ctx.input_token_count, e.record.index, e.rows - skip)
    end
    if e.items then
      local any = false
      for _, it in ipairs(e.items) do
        if it.row > skip then
          local rv = view:row(it.row - skip)
          -- certified: the bytes replaced were already the source's, so nothing changed
          if certify and rv:bytes() == it.bytes then rows.identical = rows.identical + 1 end
          rv:copy_from(it.tensor)
          rows.patched = rows.patched + 1
          any = true
        end
      end
      if not any then return end -- its targeted rows lie before this evaluation
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
end

-- provenance(source, opts) -> what the run manifest records of the source (the experiment's
-- `details`): the artifact and the sha256 of its manifest, the sha256 of the model it was captured
-- from and of this model, and whether they differ. A source from another model of the same family
-- and width patches activations that model computed: refused unless opts.allow_foreign_source, and
-- then said on stderr (opts.notice) and recorded.
local function provenance(source, opts)
  local here = require("ember.store.manifest").model_sha256(opts.model)
  -- an in-memory capture does not know its model's file: nothing to compare (recorded as unknown)
  local foreign = source.model_sha256 ~= nil and source.model_sha256 ~= here
  if foreign and not opts.allow_foreign_source then
    fail("source %s was captured from another model (sha256 %s; this model is %s): patching across models needs "
      .. "--allow-foreign-source (allow_foreign_source = true)", source.where, tostring(source.model_sha256), here)
  end
  if foreign and opts.notice then
    opts.notice(string.format("ember: activation-patch: the source %s comes from another model (sha256 %s, this "
      .. "model %s)", source.where, tostring(source.model_sha256), here))
  end
  local details = { source = source.artifact or "in-memory capture", source_manifest_sha256 = source.artifact_sha256,
    source_model_sha256 = source.model_sha256, model_sha256 = here }
  if source.model_sha256 ~= nil then details.foreign_source = foreign end -- unknown: left out
  return details
end

-- experiment{ source = artifact directory, artifact table or in-memory capture, target = { layer,
--             stage }, model = model [, positions = { p, ... }] [, certify = bool]
--             [, allow_foreign_source = bool, notice = function(text)] }
-- -> the patch experiment (name "activation-patch"). Raises on every setup problem: missing or
-- ambiguous source, family / layer / width / dtype mismatch, a targeted position no record holds.
-- The source may come from another prompt of the same length (clean -> corrupted): records are
-- matched by position and row count, never by prompt.
function M.experiment(opts)
  check_options(opts)
  local src = opts.source
  local source = resolve_source(src)
  local info = opts.model.info
  local t = {}
  t.L, t.stage, t.what, t.width, t.logits_stage = target(opts, info)
  if source.family ~= info.family then
    fail("family mismatch: source %s was captured from a %s model, this model is %s", source.where,
      tostring(source.family), info.family)
  end
  local details = provenance(source, opts)
  t.targets, t.certify = position_set(opts.positions), opts.certify == true
  local by_phase, entries = entries_of(source, t)

  local exp = { name = "activation-patch", source = src, target = opts.target, entries = entries,
    positions = opts.positions, details = details,
    stats = { applied = 0, prefill = 0, decode = 0, source_records = #entries } }
  local stats, rows = exp.stats, { patched = 0, identical = 0 }
  if t.targets ~= nil or t.certify then stats.rows_patched = 0 end
  if t.certify then stats.rows_identical = 0 end
  exp[t.stage] = hook(t, source, by_phase, stats, rows)
  -- identical() -> true when every row the patch wrote already held exactly the source's bytes
  -- (needs certify = true); such a run must be bit-identical to the unpatched one.
  function exp.identical()
    assert(t.certify, "activation-patch: identical() needs certify = true")
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
