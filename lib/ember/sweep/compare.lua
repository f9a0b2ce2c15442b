-- ember.sweep.compare — `ember compare-artifacts` for two sweep artifacts: the cell-by-cell check
-- of `ember sweep compare` (sweep_merge.compare), given one of compare-artifacts' classes.
-- Must not decide bit-identity itself: sweep_merge.compare does, so both commands always agree.

local compare = require("ember.analysis.compare")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local merge = require("ember.sweep.merge")
local store = require("ember.sweep.store")

local M = {}

-- is_sweep(dir) -> true when DIR/manifest.json declares the sweep schema. Anything else (another
-- schema, no manifest, unreadable JSON) is left to the activation artifact reader and its errors.
function M.is_sweep(dir)
  local path = fs.join(dir, store.MANIFEST)
  if not fs.is_dir(dir) or not fs.exists(path) then return false end
  local ok, doc = pcall(function() return json.decode(fs.read(path, path, store.MAX_MANIFEST_BYTES), path) end)
  return ok and type(doc) == "table" and doc.schema == store.SCHEMA
end

-- How sweep manifest fields count (docs/artifacts.md, "Comparing two sweeps"): when and where a
-- sweep was written is ignored, what decides the cells' values is semantic, the rest is recorded.
local OUT_PLACEHOLDER = "<out>"
local function normalized_argv(m)
  if type(m.argv) ~= "table" then return m.argv end
  local out = {}
  for i, a in ipairs(m.argv) do
    if m.argv[i - 1] == "--out" then a = OUT_PLACEHOLDER
    elseif type(a) == "string" and a:sub(1, 6) == "--out=" then a = "--out=" .. OUT_PLACEHOLDER end
    out[i] = a
  end
  return out
end
M.RULES = {
  ignored = { created_at_unix = true },
  content = { cells = true, grid_file = true }, -- compared cell by cell; the grid file is built from the cells
  semantic = store.SEMANTIC,
  argv = normalized_argv,
}

local function same_ids(x, y)
  if type(x) ~= "table" or type(y) ~= "table" or #x ~= #y then return false end
  for i = 1, #x do if x[i] ~= y[i] then return false end end
  return true
end

-- compare(a, b) -> result with compare-artifacts' fields (class, reason, summary, input_ids_equal,
-- semantic_provenance_equal, provenance_differences) plus `cells`: one entry per differing cell.
-- a and b come from sweep_store.read.
function M.compare(a, b)
  local ma, mb = a.manifest, b.manifest
  local cmp = merge.compare(a, b)
  local res = { kind = "sweep", a = a.dir, b = b.dir, cells = {},
    provenance_differences = compare.provenance_differences(ma, mb, M.RULES) }
  res.input_ids_equal = same_ids(ma.clean.input_ids, mb.clean.input_ids)
    and same_ids(ma.corrupted.input_ids, mb.corrupted.input_ids)

  local by_a, by_b = {}, {}
  for _, c in ipairs(a.cells) do by_a[c.index] = c end
  for _, c in ipairs(b.cells) do by_b[c.index] = c end
  local top1_all = true
  for _, ca in ipairs(a.cells) do
    local cb = by_b[ca.index]
    if cb and ca.top1 ~= cb.top1 then top1_all = false end
  end
  for _, d in ipairs(cmp.differing) do
    local ca, cb = by_a[d.index], by_b[d.index]
    res.cells[#res.cells + 1] = { index = d.index, target = d.target, stage = ca.stage, layer = ca.layer,
      position = ca.position, what = d.what, value_a = ca.value, value_b = cb.value, top1_a = ca.top1,
      top1_b = cb.top1 }
  end
  res.summary = { cells_a = #a.cells, cells_b = #b.cells, aligned = cmp.compared,
    identical = cmp.compared - #cmp.differing, differing = #cmp.differing, only_in_a = cmp.only_in_a,
    only_in_b = cmp.only_in_b }
  local s = res.summary
  local semantic_equal, full_equal = #cmp.provenance == 0, true
  for _, d in ipairs(res.provenance_differences) do
    if d.kind ~= "ignored" then full_equal = false end
  end
  res.semantic_provenance_equal = semantic_equal

  -- The classes, strictest first; `reason` says why the stricter ones did not hold.
  if s.aligned == 0 then
    res.class, res.reason = "failed", "cannot align: no cell appears in both sweeps"
    return res
  end
  local why = {}
  local same_set = s.only_in_a == 0 and s.only_in_b == 0
  local cells_exact = same_set and s.differing == 0
  if not same_set then
    why[#why + 1] = string.format("cell sets differ (%d only in A, %d only in B)", s.only_in_a, s.only_in_b)
  end
  if s.differing > 0 then why[#why + 1] = string.format("%d of %d aligned cells differ", s.differing, s.aligned) end
  if not semantic_equal then why[#why + 1] = "semantic provenance differs" end
  -- a sweep's "output" is each patched run's prediction, and the baselines' own predictions
  local baselines_top1 = ma.clean.top1 == mb.clean.top1 and ma.corrupted.top1 == mb.corrupted.top1
  if cells_exact and full_equal then
    res.class = "exact"
  elseif cells_exact and semantic_equal then
    res.class = "exact-semantic"
    why[#why + 1] = "recorded provenance differs"
  elseif res.input_ids_equal and same_set and top1_all and baselines_top1 then
    res.class = "output-equivalent"
  elseif res.input_ids_equal and top1_all then
    res.class = "top1-equivalent"
    if not baselines_top1 then why[#why + 1] = "a baseline's top-1 token differs" end
  else
    res.class = "failed"
    if not res.input_ids_equal then why[#why + 1] = "input ids differ" end
    if not top1_all then why[#why + 1] = "top-1 token differs in some aligned cell" end
  end
  res.reason = #why > 0 and table.concat(why, "; ") or "all criteria hold"
  return res
end

-- A complete sweep is read with every check (its grid file must match the manifest); a partial one
-- is read too, its missing cells counting as cells only in the other sweep.
local function read(dir)
  local sw = store.read(dir, { partial_ok = true })
  if sw.manifest.status == "complete" then return store.read(dir) end
  return sw
end

-- compare_dirs(dir_a, dir_b) -> result; reading errors are raised, naming the sweep.
function M.compare_dirs(dir_a, dir_b)
  return M.compare(read(dir_a), read(dir_b))
end

-- format_text(result) -> the human-readable report (the differing cells, at most 20 listed).
function M.format_text(res)
  local out = {}
  local function line(...) out[#out + 1] = string.format(...) end
  line("compare-artifacts (sweeps)")
  line("  A: %s", res.a)
  line("  B: %s", res.b)
  local s = res.summary
  line("cells: %d aligned, %d bit-identical, %d differ, %d only in A, %d only in B", s.aligned, s.identical,
    s.differing, s.only_in_a, s.only_in_b)
  for i, c in ipairs(res.cells) do
    if i > 20 then line("  ... %d more", #res.cells - 20); break end
    line("  cell %d (%s): %s", c.index, c.target, c.what)
  end
  line("input ids: %s", res.input_ids_equal and "equal" or "DIFFER")
  for _, l in ipairs(compare.provenance_lines(res.provenance_differences)) do out[#out + 1] = l end
  line("class: %s (%s)", res.class, res.reason)
  return table.concat(out, "\n") .. "\n"
end

-- to_json(result) -> deterministic JSON text of the result; `kind` is "sweep".
function M.to_json(res)
  local cells = json.array()
  for i, c in ipairs(res.cells) do
    cells[i] = json.ordered({ "index", "target", "stage", "layer", "position", "what", "value_a", "value_b",
      "top1_a", "top1_b" }, c)
  end
  local diffs = json.array()
  for i, d in ipairs(res.provenance_differences) do
    diffs[i] = json.ordered({ "path", "kind", "a", "b" }, { path = d.path, kind = d.kind, a = d.a, b = d.b })
  end
  return json.encode(json.ordered({ "class", "reason", "kind", "a", "b", "summary", "input_ids_equal",
    "semantic_provenance_equal", "provenance_differences", "cells" }, {
    class = res.class, reason = res.reason, kind = res.kind, a = res.a, b = res.b,
    summary = json.ordered({ "cells_a", "cells_b", "aligned", "identical", "differing", "only_in_a", "only_in_b" },
      res.summary),
    input_ids_equal = res.input_ids_equal, semantic_provenance_equal = res.semantic_provenance_equal,
    provenance_differences = diffs, cells = cells,
  }), { indent = "  " })
end

return M
