-- ember.analysis.compare — compares two activation artifacts: aligns records on (stage, layer, phase,
-- start_position), measures each aligned pair, and assigns one class of SPEC §6.3.
-- Must not read files itself beyond artifact.read, and must never relax a class silently: the
-- definitions live in docs/artifacts.md and this file implements exactly those.

local artifact = require("ember.store.artifact")
local json = require("ember.store.json")
local token_label = require("ember.analysis.token_label")
local selectors = require("ember.run.selectors")

local M = {}

M.CLASSES = selectors.CLASSES -- strictest first

local RANK = {}
for i, c in ipairs(M.CLASSES) do RANK[c] = i end

-- at_least(class, required): is `class` the required class or a stricter one?
function M.at_least(class, required)
  assert(RANK[class] and RANK[required], "unknown comparison class")
  return RANK[class] <= RANK[required]
end

-- Manifest fields never compared (SPEC §6.3): when the artifact was made, where it was written, and
-- whether the model digest was computed for the run or read from the digest cache (the digest
-- itself, model.sha256, is compared).
M.IGNORED = { ["created_at_unix"] = true, ["capture.output_dir"] = true, ["model.sha256_source"] = true }
-- The tensors themselves are compared record by record, not as provenance.
M.CONTENT = { ["records"] = true, ["tensor_file"] = true }
-- What the run computed from: same model bytes, tokenizer, prompt, token ids and sampling settings.
-- The KV cache type decides how every cached key and value was rounded: a numerics setting, so two
-- runs that differ in it are never `exact` nor `exact-semantic`.
M.SEMANTIC = { "model.sha256", "tokenizer.sha256", "prompt.sha256", "input_ids", "generated_ids", "settings",
  "execution.kv_cache" }

-- ---- provenance ----------------------------------------------------------------------------------

-- Flattens a manifest into path -> JSON text of the value; arrays are leaves (token ids compare
-- as a whole), objects recurse, so a difference is reported at the deepest differing field.
local function flatten(v, path, out)
  if type(v) == "table" and #v == 0 and next(v) ~= nil then
    for k, x in pairs(v) do
      flatten(x, path == "" and tostring(k) or (path .. "." .. tostring(k)), out)
    end
  else
    out[path] = json.encode(v)
  end
  return out
end

local function top_level(path) return path:match("^[^.]+") end

local function under(path, prefix)
  return path == prefix or path:sub(1, #prefix + 1) == prefix .. "."
end

local function is_semantic(path, semantic)
  for _, s in ipairs(semantic or M.SEMANTIC) do
    if under(path, s) or under(s, path) then return true end
  end
  return false
end

-- The output directory is ignored in argv too (as the value of --capture-activations): two
-- captures of the same run necessarily go to different directories, the writer never overwrites.
local OUTPUT_DIR_PLACEHOLDER = "<capture.output_dir>"
local function normalized_argv(m)
  local dir = type(m.capture) == "table" and m.capture.output_dir
  if type(m.argv) ~= "table" or type(dir) ~= "string" then return m.argv end
  local out = {}
  for i, a in ipairs(m.argv) do
    if a == dir and m.argv[i - 1] == "--capture-activations" then
      a = OUTPUT_DIR_PLACEHOLDER
    elseif a == "--capture-activations=" .. dir then
      a = "--capture-activations=" .. OUTPUT_DIR_PLACEHOLDER
    end
    out[i] = a
  end
  return out
end

-- provenance_differences(ma, mb [, rules]) -> list of { path, a, b, kind = "ignored"|"semantic"|"recorded" }
-- rules (default: the activation artifact's) lets another artifact kind classify its own fields:
-- { ignored = {path=true}, content = {key=true}, semantic = {path...}, argv = function(m) -> argv }
-- (sweep/compare.lua uses it for sweep manifests).
function M.provenance_differences(ma, mb, rules)
  local ignored = rules and rules.ignored or M.IGNORED
  local content = rules and rules.content or M.CONTENT
  local semantic = rules and rules.semantic or M.SEMANTIC
  local argv_of = rules and rules.argv or normalized_argv
  local fa, fb = {}, {}
  for k, v in pairs(ma) do if not content[k] then flatten(k == "argv" and argv_of(ma) or v, k, fa) end end
  for k, v in pairs(mb) do if not content[k] then flatten(k == "argv" and argv_of(mb) or v, k, fb) end end
  -- manifests written before the KV cache type was recorded used the f32 cache
  for _, f in ipairs({ fa, fb }) do
    if f["execution.kernels"] ~= nil and f["execution.kv_cache"] == nil then
      f["execution.kv_cache"] = json.encode("f32")
    end
  end
  local paths, seen = {}, {}
  for p in pairs(fa) do seen[p] = true; paths[#paths + 1] = p end
  for p in pairs(fb) do if not seen[p] then paths[#paths + 1] = p end end
  table.sort(paths)
  local out = {}
  for _, p in ipairs(paths) do
    if fa[p] ~= fb[p] then
      local kind = "recorded"
      if ignored[p] or ignored[top_level(p)] then kind = "ignored"
      elseif is_semantic(p, semantic) then kind = "semantic" end
      out[#out + 1] = { path = p, a = fa[p] or "(absent)", b = fb[p] or "(absent)", kind = kind }
    end
  end
  return out
end

-- ---- per-record metrics --------------------------------------------------------------------------

-- metrics(a, b) for two records of equal shape (their `tensor`s): bitwise equality and the SPEC §6.3
-- measures, computed by the core (t:compare). max/mean/RMS are of |a - b|; l2 = ||a - b||;
-- rel_l2 = ||a - b|| / ||a||; cosine of a and b. Undefined values (cosine with a zero vector,
-- rel_l2 with ||a|| = 0 and a difference) are nil.
function M.metrics(ra, rb)
  return ra.tensor:compare(rb.tensor)
end

-- ---- alignment and classes -----------------------------------------------------------------------

local function index_records(art, label)
  local by_key, order = {}, {}
  for _, r in ipairs(art.records) do
    local k = artifact.record_key(r)
    if by_key[k] then
      return nil, string.format("duplicate record %s in %s (records %d and %d): records must be unique "
        .. "per (stage, layer, phase, start_position)", artifact.record_label(r), label, by_key[k].index, r.index)
    end
    by_key[k] = r
    order[#order + 1] = k
  end
  return by_key, order
end

-- same_ids(x, y) -> true when x and y are lists of the same ids (false when either is no list).
local function same_ids(x, y)
  if type(x) ~= "table" or type(y) ~= "table" or #x ~= #y then return false end
  for i = 1, #x do if x[i] ~= y[i] then return false end end
  return true
end
M.same_ids = same_ids

-- ---- outcome -------------------------------------------------------------------------------------

-- The built-in experiments that only observe: left out when an intervention is named.
local OBSERVERS = { capture = true, ["activation-stats"] = true }

-- What each run's manifest says it did: { name (the members that are not observers, and the
-- arguments), modified }.
local function intervention(m)
  local e = type(m.experiment) == "table" and m.experiment or {}
  local names = {}
  for _, mem in ipairs(type(e.members) == "table" and e.members or {}) do
    if type(mem) == "table" and type(mem.name) == "string" and not OBSERVERS[mem.name] then
      names[#names + 1] = mem.name
    end
  end
  local name = #names > 0 and table.concat(names, "+") or (type(e.name) == "string" and e.name or "none")
  if type(e.args) == "string" and e.args ~= "" then name = name .. " " .. e.args end
  return { name = token_label.printable(name), modified = e.modified == true }
end

local function where(r)
  return string.format("%s%s (%s, position %s)", r.stage, r.layer == nil and "" or (" layer " .. r.layer), r.phase,
    tostring(r.start_position))
end

-- outcome(res, ma, mb) -> one line saying what the comparison means for the runs: an intended
-- intervention's effect is named as such (the class alone, `failed` when an ablation changed the
-- generated text, reads like an error). The class is never changed by it.
local function outcome(res, ma, mb)
  local ia, ib = intervention(ma), intervention(mb)
  local first
  for _, r in ipairs(res.records) do
    if r.status == "differs" or r.status == "shape-mismatch" then first = r; break end
  end
  local who
  if ia.modified and ib.modified then
    who = string.format("both runs were modified (A by %s, B by %s)", ia.name, ib.name)
  elseif ia.modified or ib.modified then
    local side, i = ia.modified and "A" or "B", ia.modified and ia or ib
    who = string.format("%s was modified by its intervention (%s)", side, i.name)
  end
  if res.class == "exact" or res.class == "exact-semantic" then
    if who then return who .. "; every captured record is bit-identical to the other run's: the intervention "
      .. "restored (or left unchanged) what was captured" end
    return "the same computation: every captured record bit-identical"
  end
  if not res.input_ids_equal then return "the runs had different inputs (input ids differ): not comparable as one "
    .. "run with and without an intervention" end
  local change = first and ("records differ from " .. where(first) .. " on") or "the record sets differ"
  local ids = res.generated_ids_equal and "the generated ids are equal" or "the generated ids differ"
  if who then
    return string.format("%s, and it changed the run as an intervention does: %s; %s (class %s measures how far "
      .. "the outputs moved, not an error)", who, change, ids, res.class)
  end
  return string.format("neither run records an intervention, yet %s; %s: not an intended change (see the "
    .. "provenance differences)", change, ids)
end

-- aligned_row(ra, rb, s, acc) -> the result row of an aligned pair (rb nil: only in A); counts it in
-- the summary s and in acc = { all_identical, top1_all, logits_aligned }.
local function aligned_row(ra, rb, s, acc)
  local row = { key = artifact.record_key(ra), label = artifact.record_label(ra), stage = ra.stage,
    layer = ra.layer, phase = ra.phase, start_position = ra.start_position, shape_a = ra.shape }
  if not rb then
    row.status = "only-in-a"
    s.only_in_a = s.only_in_a + 1
    return row
  end
  s.aligned = s.aligned + 1
  row.shape_b = rb.shape
  if ra.shape[1] ~= rb.shape[1] or ra.shape[2] ~= rb.shape[2] then
    row.status = "shape-mismatch"
    acc.all_identical = false
    s.differing = s.differing + 1
    if ra.stage == "after_logits" then acc.top1_all = false; acc.logits_aligned = acc.logits_aligned + 1 end
    return row
  end
  row.metrics = M.metrics(ra, rb)
  if row.metrics.bitwise_equal then
    row.status = "identical"
    s.identical = s.identical + 1
  else
    row.status = "differs"
    acc.all_identical = false
    s.differing = s.differing + 1
  end
  if ra.stage == "after_logits" then
    acc.logits_aligned = acc.logits_aligned + 1
    -- top-1 token id per row: lowest id on ties, NaN never wins (as greedy sampling)
    row.top1_a = ra.tensor:top1()
    row.top1_b = rb.tensor:top1()
    row.top1_equal = same_ids(row.top1_a, row.top1_b)
    if not row.top1_equal then acc.top1_all = false end
  end
  return row
end

-- classify(res, acc): res.class, the strictest class that holds, and res.reason, why the stricter
-- ones did not.
local function classify(res, acc)
  local s = res.summary
  local same_set = s.only_in_a == 0 and s.only_in_b == 0
  local semantic_equal, full_equal = true, true
  for _, d in ipairs(res.provenance_differences) do
    if d.kind == "semantic" then semantic_equal = false end
    if d.kind ~= "ignored" then full_equal = false end
  end
  res.semantic_provenance_equal = semantic_equal
  local why = {}
  if s.aligned == 0 then
    res.class, res.reason = "failed", "cannot align: no record appears in both artifacts"
    return
  end
  local tensors_exact = same_set and acc.all_identical
  if not same_set then
    why[#why + 1] = string.format("record sets differ (%d only in A, %d only in B)", s.only_in_a, s.only_in_b)
  end
  if not acc.all_identical then
    why[#why + 1] = string.format("%d of %d aligned records differ", s.differing, s.aligned)
  end
  if not semantic_equal then why[#why + 1] = "semantic provenance differs" end
  if tensors_exact and full_equal then
    res.class = "exact"
  elseif tensors_exact and semantic_equal then
    res.class = "exact-semantic"
    why[#why + 1] = "recorded provenance differs"
  elseif res.input_ids_equal and res.generated_ids_equal then
    res.class = "output-equivalent"
  elseif res.input_ids_equal and acc.logits_aligned > 0 and acc.top1_all then
    res.class = "top1-equivalent"
    if not res.generated_ids_equal then why[#why + 1] = "generated ids differ" end
  else
    res.class = "failed"
    if not res.input_ids_equal then why[#why + 1] = "input ids differ" end
    if not res.generated_ids_equal then why[#why + 1] = "generated ids differ" end
    if acc.logits_aligned == 0 then why[#why + 1] = "no aligned after_logits record to check top-1"
    elseif not acc.top1_all then why[#why + 1] = "top-1 token differs in some aligned after_logits record" end
  end
  res.reason = #why > 0 and table.concat(why, "; ") or "all criteria hold"
end

-- compare_records(a, b) -> the result without its outcome line
local function compare_records(a, b)
  local res = {
    a = a.dir, b = b.dir, records = {}, provenance_differences = {},
    summary = { aligned = 0, identical = 0, differing = 0, only_in_a = 0, only_in_b = 0 },
  }
  local ma, mb = a.manifest, b.manifest
  res.input_ids_equal = same_ids(ma.input_ids, mb.input_ids)
  res.generated_ids_equal = same_ids(ma.generated_ids, mb.generated_ids)
  res.provenance_differences = M.provenance_differences(ma, mb)

  local ka, order_a = index_records(a, "A")
  local kb, order_b = index_records(b, "B")
  if not ka or not kb then
    res.class = "failed"
    res.reason = "cannot align: " .. (ka and order_b or order_a) -- the second value is the message
    return res
  end
  local acc = { all_identical = true, top1_all = true, logits_aligned = 0 }
  for _, k in ipairs(order_a) do
    res.records[#res.records + 1] = aligned_row(ka[k], kb[k], res.summary, acc)
  end
  for _, k in ipairs(order_b) do
    if not ka[k] then
      local rb = kb[k]
      res.summary.only_in_b = res.summary.only_in_b + 1
      res.records[#res.records + 1] = { key = k, label = artifact.record_label(rb), stage = rb.stage,
        layer = rb.layer, phase = rb.phase, start_position = rb.start_position, shape_b = rb.shape,
        status = "only-in-b" }
    end
  end
  classify(res, acc)
  return res
end

-- compare(a, b) -> result (see docs/artifacts.md, "Comparison"); a and b come from artifact.read.
function M.compare(a, b)
  local res = compare_records(a, b)
  res.outcome = outcome(res, a.manifest, b.manifest)
  return res
end

-- compare_dirs(dir_a, dir_b) -> result; reading errors (corruption, bad schema) are raised.
function M.compare_dirs(dir_a, dir_b)
  return M.compare(artifact.read(dir_a), artifact.read(dir_b))
end

-- ---- output --------------------------------------------------------------------------------------

local function num(x)
  if x == nil then return "-" end
  if x == 0 then return "0" end
  return string.format("%.4g", x)
end

-- How many differing records the summary lists in full, and how many stage/layer groups.
M.SUMMARY_FIRST, M.SUMMARY_GROUPS = 5, 20

local RECORD_HEADER = { "stage", "layer", "phase", "pos", "shape", "status", "max_abs", "mean_abs", "rms_abs",
  "cosine", "rel_l2" }
local RECORD_FMT = "  %-16s %5s %-7s %5s %-11s %-14s %10s %10s %10s %10s %10s"

local function record_line(r)
  local shape = r.shape_a or r.shape_b
  local m = r.metrics or {}
  local status = r.status
  if r.top1_equal == false then status = status .. " top1!" end
  return string.format(RECORD_FMT, r.stage, r.layer == nil and "-" or tostring(r.layer), r.phase,
    tostring(r.start_position), string.format("%dx%d", shape[1], shape[2]), status, num(m.max_abs_diff),
    num(m.mean_abs_diff), num(m.rms_abs_diff), num(m.cosine), num(m.rel_l2))
end

-- The records that are not bit-identical, grouped by (stage, layer) in the order the groups first
-- appear: { stage, layer, differing, total, max_abs, min_cosine, max_rel_l2 }.
local function groups_of(records)
  local groups, by_key = {}, {}
  for _, r in ipairs(records) do
    local key = r.stage .. "|" .. tostring(r.layer)
    local g = by_key[key]
    if not g then
      g = { stage = r.stage, layer = r.layer, differing = 0, total = 0 }
      by_key[key] = g
      groups[#groups + 1] = g
    end
    g.total = g.total + 1
    if r.status ~= "identical" then
      g.differing = g.differing + 1
      local m = r.metrics or {}
      if m.max_abs_diff and (g.max_abs == nil or m.max_abs_diff > g.max_abs) then g.max_abs = m.max_abs_diff end
      if m.cosine and (g.min_cosine == nil or m.cosine < g.min_cosine) then g.min_cosine = m.cosine end
      if m.rel_l2 and (g.max_rel_l2 == nil or m.rel_l2 > g.max_rel_l2) then g.max_rel_l2 = m.rel_l2 end
    end
  end
  local out = {}
  for _, g in ipairs(groups) do if g.differing > 0 then out[#out + 1] = g end end
  return out
end

-- provenance_lines(differences) -> the report lines for provenance_differences' list: "provenance:
-- identical", or a heading and one line a difference with values over 60 characters cut short.
-- Shared by the reports of both comparisons (format_text here, compare_sweeps.format_text).
function M.provenance_lines(diffs)
  if #diffs == 0 then return { "provenance: identical" } end
  local lines = { "provenance differences:" }
  for _, d in ipairs(diffs) do
    local a, b = d.a, d.b
    if #a > 60 then a = a:sub(1, 57) .. "..." end
    if #b > 60 then b = b:sub(1, 57) .. "..." end
    lines[#lines + 1] = string.format("  %-9s %s: %s -> %s", d.kind, d.path, a, b)
  end
  return lines
end

-- format_text(result [, { records = bool }]) -> the human-readable report: by default a summary
-- (counts, the first differing records, the largest differences per stage and layer, ids,
-- provenance, class); with records = true the table of every aligned record instead.
function M.format_text(res, opts)
  opts = opts or {}
  local out = {}
  local function line(...) out[#out + 1] = string.format(...) end
  line("compare-artifacts")
  line("  A: %s", res.a)
  line("  B: %s", res.b)
  local s = res.summary
  line("records: %d aligned, %d bit-identical, %d differ, %d only in A, %d only in B",
    s.aligned, s.identical, s.differing, s.only_in_a, s.only_in_b)
  if opts.records then
    if #res.records > 0 then
      line(RECORD_FMT, table.unpack(RECORD_HEADER))
      for _, r in ipairs(res.records) do line("%s", record_line(r)) end
    end
  else
    local first = {}
    for _, r in ipairs(res.records) do
      if r.status ~= "identical" then first[#first + 1] = r end
    end
    if #first > 0 then
      line("first differing records (of %d; --records lists every record):", #first)
      line(RECORD_FMT, table.unpack(RECORD_HEADER))
      for i = 1, math.min(#first, M.SUMMARY_FIRST) do line("%s", record_line(first[i])) end
      local groups = groups_of(res.records)
      local shown = groups
      if #groups > M.SUMMARY_GROUPS then -- the largest by max_abs, then in execution order
        local sorted = { table.unpack(groups) }
        table.sort(sorted, function(x, y) return (x.max_abs or -1) > (y.max_abs or -1) end)
        local keep = {}
        for i = 1, M.SUMMARY_GROUPS do keep[sorted[i]] = true end
        shown = {}
        for _, g in ipairs(groups) do if keep[g] then shown[#shown + 1] = g end end
      end
      line("largest differences per stage and layer%s:", #shown < #groups
        and string.format(" (the %d largest of %d)", #shown, #groups) or "")
      line("  %-16s %5s %9s %10s %10s %10s", "stage", "layer", "differ", "max_abs", "min_cos", "max_rel_l2")
      for _, g in ipairs(shown) do
        line("  %-16s %5s %9s %10s %10s %10s", g.stage, g.layer == nil and "-" or tostring(g.layer),
          g.differing .. "/" .. g.total, num(g.max_abs), num(g.min_cosine), num(g.max_rel_l2))
      end
    end
  end
  line("input ids: %s; generated ids: %s", res.input_ids_equal and "equal" or "DIFFER",
    res.generated_ids_equal and "equal" or "DIFFER")
  for _, l in ipairs(M.provenance_lines(res.provenance_differences)) do out[#out + 1] = l end
  line("class: %s (%s)", res.class, res.reason)
  if res.outcome then line("outcome: %s", res.outcome) end
  return table.concat(out, "\n") .. "\n"
end

-- to_json(result) -> deterministic JSON text of the result (jq-friendly).
function M.to_json(res)
  local recs = json.array()
  for i, r in ipairs(res.records) do
    local m = r.metrics
    recs[i] = json.ordered({ "stage", "layer", "phase", "start_position", "status", "shape_a", "shape_b",
      "bitwise_equal", "differing_elements", "max_abs_diff", "mean_abs_diff", "rms_abs_diff", "cosine", "l2",
      "rel_l2", "top1_a", "top1_b", "top1_equal" }, {
      stage = r.stage, layer = r.layer == nil and json.null or r.layer, phase = r.phase,
      start_position = r.start_position, status = r.status,
      shape_a = r.shape_a and json.array({ r.shape_a[1], r.shape_a[2] }) or json.null,
      shape_b = r.shape_b and json.array({ r.shape_b[1], r.shape_b[2] }) or json.null,
      bitwise_equal = m and m.bitwise_equal or false,
      differing_elements = m and m.differing_elements or json.null,
      max_abs_diff = m and m.max_abs_diff or json.null, mean_abs_diff = m and m.mean_abs_diff or json.null,
      rms_abs_diff = m and m.rms_abs_diff or json.null, cosine = m and m.cosine or json.null,
      l2 = m and m.l2 or json.null, rel_l2 = m and m.rel_l2 or json.null,
      top1_a = r.top1_a and json.array({ table.unpack(r.top1_a) }) or nil,
      top1_b = r.top1_b and json.array({ table.unpack(r.top1_b) }) or nil,
      top1_equal = r.top1_equal,
    })
  end
  local diffs = json.array()
  for i, d in ipairs(res.provenance_differences) do
    diffs[i] = json.ordered({ "path", "kind", "a", "b" }, { path = d.path, kind = d.kind, a = d.a, b = d.b })
  end
  return json.encode(json.ordered({ "class", "reason", "outcome", "a", "b", "summary", "input_ids_equal",
    "generated_ids_equal", "semantic_provenance_equal", "provenance_differences", "records" }, {
    class = res.class, reason = res.reason, outcome = res.outcome, a = res.a, b = res.b,
    summary = json.ordered({ "aligned", "identical", "differing", "only_in_a", "only_in_b" }, res.summary),
    input_ids_equal = res.input_ids_equal, generated_ids_equal = res.generated_ids_equal,
    semantic_provenance_equal = res.semantic_provenance_equal == true,
    provenance_differences = diffs, records = recs,
  }), { indent = "  " })
end

return M
