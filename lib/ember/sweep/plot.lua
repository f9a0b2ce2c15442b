-- ember.sweep.plot — the heatmaps of a finished sweep (one per stage: layers x positions, tics
-- with the prompts' tokens, title with the metric), recorded in the sweep's manifest.
-- Must not change any cell: it reads the artifact, draws, and rewrites the manifest's plot section.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local plot = require("ember.analysis.plot")
local store = require("ember.sweep.store")

local M = {}

-- draw(dir) -> the manifest's plot section { title, xlabel, ylabel, cblabel, xtics, ytics, files }
function M.draw(dir)
  local sw = store.read(dir)
  local doc, g = sw.manifest, sw.manifest.grid
  local by = {}
  for _, c in ipairs(sw.cells) do by[c.index] = c end
  local ytics = {}
  for i, l in ipairs(g.layers) do ytics[i] = tostring(l) end
  local title = string.format("%s: patched clean -> corrupted", doc.metric.label)
  local files = json.array()
  local np, nl = #g.positions, #g.layers
  for si, stage in ipairs(g.stages) do
    local rows = {}
    for li = 1, nl do
      local row = {}
      for pi = 1, np do
        local c = by[((si - 1) * nl + (li - 1)) * np + (pi - 1)]
        row[pi] = c and c.value or nil
      end
      rows[li] = row
    end
    local out = plot.heatmap { dir = dir, base = "heatmap-" .. stage, title = title .. " at " .. stage,
      xlabel = "position (clean/corrupted token)", ylabel = "layer", cblabel = doc.metric.kind,
      xtics = g.position_labels, ytics = ytics, rows = rows }
    files[#files + 1] = json.ordered({ "stage", "svg", "png" }, { stage = stage, svg = fs.basename(out.svg),
      png = fs.basename(out.png) })
  end
  doc.plot = json.ordered({ "tool", "title", "xlabel", "ylabel", "cblabel", "xtics", "ytics", "files" }, {
    tool = "gnuplot", title = title, xlabel = "position (clean/corrupted token)", ylabel = "layer",
    cblabel = doc.metric.kind, xtics = json.array({ table.unpack(g.position_labels) }), ytics = json.array(ytics),
    files = files })
  store.write(dir, doc, sw.cells)
  return doc.plot
end

return M
