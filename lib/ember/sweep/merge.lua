-- ember.sweep.merge — joins the shards of one sweep into a single sweep artifact, and compares
-- two sweeps cell by cell. Must not join what was not computed the same way: shards whose
-- provenance (model, prompts, metric, grid, ember version, kernel set) differs are refused by name.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local store = require("ember.sweep.store")

local M = {}

local function fail(msg, ...) error("sweep merge: " .. string.format(msg, ...), 0) end

-- merge(out, dirs) -> { dir, manifest, cells }. Every shard must be complete, of the same sweep,
-- with the same shard count, and together they must hold each shard index exactly once.
function M.merge(out, dirs)
  if #dirs == 0 then fail("no shard directories given") end
  if fs.exists(out) then fail("output '%s' already exists (choose another directory)", out) end
  local shards = {}
  for i, d in ipairs(dirs) do shards[i] = store.read(d) end
  local first = shards[1]
  local count
  local by_index, cells, taken = {}, {}, {}
  for _, s in ipairs(shards) do
    local m = s.manifest
    if type(m.shard) ~= "table" then fail("'%s' is not a shard (it was run without --shard)", s.dir) end
    local diffs = store.differences(first.manifest, m, { "shard.count" })
    if #diffs > 0 then
      local d = diffs[1]
      fail("shard '%s' does not belong with '%s': %s differs (%s there, %s in '%s')", s.dir, first.dir, d.path, d.b,
        d.a, first.dir)
    end
    count = m.shard.count
    if by_index[m.shard.index] then
      fail("shards '%s' and '%s' are both shard %d/%d", by_index[m.shard.index].dir, s.dir, m.shard.index, count)
    end
    by_index[m.shard.index] = s
    for _, c in ipairs(s.cells) do
      if taken[c.index] then fail("cell %d is in both '%s' and '%s'", c.index, taken[c.index], s.dir) end
      taken[c.index] = s.dir
      cells[#cells + 1] = c
    end
  end
  for k = 0, count - 1 do
    if not by_index[k] then fail("shard %d/%d is missing (got %d of %d shards)", k, count, #shards, count) end
  end
  table.sort(cells, function(a, b) return a.index < b.index end)
  local doc = {}
  for k, v in pairs(first.manifest) do doc[k] = v end
  doc.shard = json.null
  doc.merged_from = json.array()
  for k = 0, count - 1 do
    local s = by_index[k]
    doc.merged_from[#doc.merged_from + 1] = json.ordered({ "dir", "shard", "cells", "threads", "manifest_sha256" }, {
      dir = s.dir, shard = string.format("%d/%d", k, count), cells = #s.cells, threads = s.manifest.execution.threads,
      manifest_sha256 = require("ember").sha256(fs.read(fs.join(s.dir, store.MANIFEST))) })
  end
  local shape = doc.grid.shape
  doc.status = #cells == shape[1] * shape[2] * shape[3] and "complete" or "partial"
  doc.plot = nil
  store.write(out, doc, cells)
  return { dir = out, manifest = doc, cells = cells }
end

local function bits(v) return string.pack("<d", v) end

-- compare(a, b) -> { equal, compared, differing = { {index, target, what} }, only_in_a, only_in_b,
-- provenance = { {path, a, b} } }. `equal` needs the same semantic provenance, the same set of
-- cells, and every cell bit-identical: value, recovered, certification, logits sha256, top-1.
function M.compare(a, b)
  local res = { compared = 0, differing = {}, only_in_a = 0, only_in_b = 0,
    provenance = store.differences(a.manifest, b.manifest) }
  local by = {}
  for _, c in ipairs(b.cells) do by[c.index] = c end
  local seen = {}
  for _, ca in ipairs(a.cells) do
    local cb = by[ca.index]
    seen[ca.index] = true
    if not cb then
      res.only_in_a = res.only_in_a + 1
    else
      res.compared = res.compared + 1
      local what
      if bits(ca.value) ~= bits(cb.value) then what = string.format("value %.17g vs %.17g", ca.value, cb.value)
      elseif ca.logits_sha256 ~= cb.logits_sha256 then what = "logits sha256"
      elseif ca.certified ~= cb.certified then what = "certified"
      elseif ca.top1 ~= cb.top1 then what = "top1"
      elseif (ca.recovered == json.null) ~= (cb.recovered == json.null)
        or (ca.recovered ~= json.null and bits(ca.recovered) ~= bits(cb.recovered)) then what = "recovered" end
      if what then res.differing[#res.differing + 1] = { index = ca.index, target = ca.target, what = what } end
    end
  end
  for _, cb in ipairs(b.cells) do if not seen[cb.index] then res.only_in_b = res.only_in_b + 1 end end
  res.equal = #res.provenance == 0 and #res.differing == 0 and res.only_in_a == 0 and res.only_in_b == 0
    and res.compared > 0
  return res
end

-- format(res, a, b) -> the text `ember sweep compare` prints
function M.format(res, a, b)
  local out = {}
  out[#out + 1] = string.format("sweep compare: %s vs %s", a.dir, b.dir)
  out[#out + 1] = string.format("cells: %d compared, %d differing, %d only in A, %d only in B", res.compared,
    #res.differing, res.only_in_a, res.only_in_b)
  for i, d in ipairs(res.differing) do
    if i > 20 then out[#out + 1] = string.format("  ... %d more", #res.differing - 20); break end
    out[#out + 1] = string.format("  cell %d (%s): %s", d.index, d.target, d.what)
  end
  for _, p in ipairs(res.provenance) do
    out[#out + 1] = string.format("provenance differs: %s (%s vs %s)", p.path, p.a, p.b)
  end
  out[#out + 1] = "result: " .. (res.equal and "IDENTICAL (every cell bit-identical)" or "DIFFERENT")
  return table.concat(out, "\n") .. "\n"
end

return M
