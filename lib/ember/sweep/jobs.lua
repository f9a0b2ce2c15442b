-- ember.sweep.jobs — `ember sweep --jobs N`: the N shards of a sweep as local processes (each an
-- `ember sweep --shard I/N`, ember.run.shards), their progress summed on stderr, then one merge
-- into --out. Must not compute cells itself: every shard is an ordinary, resumable `ember sweep` run.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local store = require("ember.sweep.store")
local shards = require("ember.run.shards")

local M = {}

M.command = shards.command

local function cells_in(dir)
  local read, text = pcall(fs.read, fs.join(dir, store.MANIFEST), dir, store.MAX_MANIFEST_BYTES)
  if not read then return 0, nil end
  local ok, doc = pcall(json.decode, text)
  if not ok or type(doc) ~= "table" or type(doc.cells) ~= "table" then return 0, nil end
  local counted, total = pcall(store.grid_cells, type(doc.grid) == "table" and doc.grid or {}, dir)
  return #doc.cells, counted and total or nil
end

-- run{ args = shard flags (no --out/--jobs), out, jobs, progress, stderr } -> merge result
function M.run(o)
  local progress, started = o.progress, false
  local dirs = shards.run { command = "sweep", args = o.args, extra = "--progress none", n = o.jobs,
    base = o.out .. ".shards", label = "sweep --jobs", noun = "cells", count = cells_in,
    on_count = function(done, total, before)
      if progress and total then
        if not started then progress:start(total, before); started = true end
        while progress.done < done do progress:step() end
      end
    end,
    finish = function(ok) if progress and started then progress:finish(ok) end end }
  local res = require("ember.sweep.merge").merge(o.out, dirs)
  return { status = res.manifest.status, merged = res, shards = dirs }
end

return M
