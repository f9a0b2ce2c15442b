-- ember.patch — replaces a live activation in place with a captured one (SPEC §6.2).
-- Must not guess: every evaluation of the target resolves to exactly one source record, and a
-- source record that is never applied fails the run.
--
-- Everything that allocates happens in patch.experiment() (setup): source tensors come from
-- artifact.read as ember.Tensors and are looked up by phase and start position, so the hook only
-- reads context fields, compares integers and calls view:copy_from.

local artifact = require("ember.artifact")
local selectors = require("ember.selectors")

local M = {}

local function fail(msg, ...)
  error("activation-patch: " .. string.format(msg, ...), 0)
end

-- experiment{ source = artifact table or directory, target = { layer, stage }, model = model }
-- -> the patch experiment (name "activation-patch"). Raises on every setup problem: missing or
-- ambiguous source, family / layer / width / dtype mismatch.
function M.experiment(opts)
  local src = opts.source
  if type(src) == "string" then src = artifact.read(src) end
  local target, info = opts.target, opts.model.info
  local L, stage = target.layer, target.stage
  if not selectors.LAYER_STAGE_SET[stage] then
    fail("target stage '%s' is not a per-layer stage (%s)", tostring(stage), table.concat(selectors.LAYER_STAGES, "|"))
  end
  if math.type(L) ~= "integer" or L < 0 or L >= info.n_layers then
    fail("target layer %s is out of range (the model has %d layers: 0-%d)", tostring(L), info.n_layers, info.n_layers - 1)
  end
  local sm = src.manifest
  if sm.model.family ~= info.family then
    fail("family mismatch: source artifact '%s' was captured from a %s model, this model is %s",
      src.dir, tostring(sm.model.family), info.family)
  end

  -- phase -> start_position -> entry; built once, read by the hook
  local by_phase = { prefill = {}, decode = {} }
  local entries = {}
  for _, r in ipairs(src.records) do
    if r.stage == stage and r.layer == L then
      local slot = by_phase[r.phase]
      local prev = slot[r.start_position]
      if prev then
        fail("ambiguous source: records %d and %d of '%s' are both %s; a target must resolve to exactly one record",
          prev.record.index, r.index, src.dir, artifact.record_label(r))
      end
      if r.shape[2] ~= info.hidden_size then
        fail("width mismatch: source record %d (%s) has %d columns, the model's hidden size is %d",
          r.index, artifact.record_label(r), r.shape[2], info.hidden_size)
      end
      local e = { record = r, rows = r.shape[1], applied = 0, tensor = r.tensor }
      slot[r.start_position] = e
      entries[#entries + 1] = e
    end
  end
  if #entries == 0 then
    local have = {}
    for _, r in ipairs(src.records) do
      local k = r.stage .. (r.layer and (" layer " .. r.layer) or "")
      if not have[k] then have[k] = true; have[#have + 1] = k end
    end
    fail("no source record for %s layer %d in '%s' (it holds: %s)", stage, L, src.dir,
      #have > 0 and table.concat(have, ", ") or "no records")
  end

  local exp = { name = "activation-patch", source = src, target = target, entries = entries,
    stats = { applied = 0, prefill = 0, decode = 0, source_records = #entries } }
  local stats = exp.stats
  exp[stage] = function(_, ctx, view)
    if ctx.layer_index ~= L then return end
    local phase = ctx.phase
    local e = by_phase[phase][ctx.start_position]
    if e == nil then
      fail("no source record for %s layer %d %s @%d in '%s': every evaluation of the target needs one",
        stage, L, phase, ctx.start_position, src.dir)
    end
    if ctx.input_token_count ~= e.rows then
      fail("shape mismatch at %s: the live tensor has %d rows, source record %d has %d (different prompt?)",
        artifact.record_label(e.record), ctx.input_token_count, e.record.index, e.rows)
    end
    view:copy_from(e.tensor)
    e.applied = e.applied + 1
    stats.applied = stats.applied + 1
    stats[phase] = stats[phase] + 1
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
