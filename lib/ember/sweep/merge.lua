-- ember.sweep.merge — joins the shards of one sweep into a single sweep artifact, and compares
-- two sweeps cell by cell. Must not join what was not computed the same way: shards whose
-- provenance (model, prompts, metric, grid, ember version, kernel set) differs are refused by name.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local store = require("ember.sweep.store")
local token_label = require("ember.analysis.token_label")
local core = require("ember.core")

local M = {}

local function fail(msg, ...) error("sweep merge: " .. string.format(msg, ...), 0) end

-- The command that (re)computes shard k of N: the shard's own recorded command line with its
-- --shard and --out replaced (and no --max-cells budget), each word shell-quoted where it needs it
-- (printed, never run).
local function rerun_command(argv, k, n, dir)
  local words, i = {}, 1
  local skip = { ["--shard"] = true, ["--out"] = true, ["--max-cells"] = true }
  while i <= #argv do
    local a = tostring(argv[i])
    local name = a:match("^(%-%-[%w%-]+)=")
    if skip[a] then i = i + 1 elseif not (name and skip[name]) then words[#words + 1] = a end
    i = i + 1
  end
  words[#words + 1] = "--shard"
  words[#words + 1] = string.format("%d/%d", k, n)
  words[#words + 1] = "--out"
  words[#words + 1] = dir
  for j, w in ipairs(words) do
    w = token_label.printable(w)
    words[j] = w:match("^[%w%-%._/=:,@+]+$") and w or fs.shell_quote(w)
  end
  return table.concat(words, " ")
end

-- cells_of_shard(doc, k, n) -> how many of the grid's cells shard k of n computes
local function cells_of_shard(doc, k, n)
  local total = store.grid_cells(doc.grid, "sweep merge")
  return math.max(0, (total - 1 - k) // n + 1)
end

-- The shards that are not there or not finished (a Slurm task cancelled, failed or still
-- running), and what to run for each: one message naming them all.
local function incomplete(first, by_index, absent, count)
  local lines, cmds = {}, {}
  local parent = fs.dirname(first.dir)
  for _, d in ipairs(absent) do
    lines[#lines + 1] = string.format("  '%s' does not exist (its task never ran, or was cancelled before its first "
      .. "write)", d)
  end
  local absent_by_name = {}
  for _, d in ipairs(absent) do absent_by_name[fs.basename(d)] = d end
  for k = 0, count - 1 do
    local s = by_index[k]
    -- a missing shard's directory: the absent one named after it (the Slurm layout, DIR.shards/k)
    local dir = s and s.dir or absent_by_name[tostring(k)] or fs.join(parent, tostring(k))
    if not s then
      lines[#lines + 1] = string.format("  shard %d/%d: missing (no directory given holds it)", k, count)
    elseif s.manifest.status ~= "complete" then
      lines[#lines + 1] = string.format("  shard %d/%d ('%s'): %s, %d of %d cells", k, count, s.dir,
        tostring(s.manifest.status), #s.cells, cells_of_shard(s.manifest, k, count))
    end
    if not s or s.manifest.status ~= "complete" then
      cmds[#cmds + 1] = "  " .. rerun_command(first.manifest.argv or {}, k, count, dir)
    end
  end
  fail("%d of %d shards are not complete:\n%s\nrerun each (a partial shard resumes where it stopped), then merge "
    .. "again:\n%s", #cmds, count, table.concat(lines, "\n"), table.concat(cmds, "\n"))
end

-- merge(out, dirs) -> { dir, manifest, cells }. Every shard must be complete, of the same sweep,
-- with the same shard count, and together they must hold each shard index exactly once; shards
-- missing or unfinished are all named in one message, with the command that completes each.
function M.merge(out, dirs)
  if #dirs == 0 then fail("no shard directories given") end
  if fs.exists(out) then fail("output '%s' already exists (choose another directory)", out) end
  local shards, absent = {}, {}
  for _, d in ipairs(dirs) do
    if not fs.exists(d) then
      absent[#absent + 1] = d
    else
      local s = store.read(d, { partial_ok = true })
      -- a complete shard is read again with every check (the grid file's sha256 too)
      shards[#shards + 1] = s.manifest.status == "complete" and store.read(d) or s
    end
  end
  if #shards == 0 then fail("none of the %d shard directories exists", #dirs) end
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
  local done = #absent == 0
  for k = 0, count - 1 do done = done and by_index[k] ~= nil and by_index[k].manifest.status == "complete" end
  if not done then incomplete(first, by_index, absent, count) end
  table.sort(cells, function(a, b) return a.index < b.index end)
  local doc = {}
  for k, v in pairs(first.manifest) do doc[k] = v end
  doc.shard = json.null
  doc.merged_from = json.array()
  for k = 0, count - 1 do
    local s = by_index[k]
    doc.merged_from[#doc.merged_from + 1] = json.ordered({ "dir", "shard", "cells", "threads", "manifest_sha256" }, {
      dir = s.dir, shard = string.format("%d/%d", k, count), cells = #s.cells, threads = s.manifest.execution.threads,
      manifest_sha256 = core.sha256(fs.read(fs.join(s.dir, store.MANIFEST), "sweep merge", store.MAX_MANIFEST_BYTES)) })
  end
  doc.status = #cells == store.grid_cells(doc.grid, "sweep merge") and "complete" or "partial"
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
