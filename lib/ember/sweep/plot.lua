-- ember.sweep.plot — the heatmaps of a finished sweep (per stage, layers x positions: the metric and
-- the recovered share, tics with the prompts' tokens, baselines on the colour bars), recorded in
-- the sweep's manifest.
-- Must not change any cell: it reads the artifact, draws, and rewrites the manifest's plot section.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local plot = require("ember.analysis.plot")
local store = require("ember.sweep.store")

local M = {}

local FILE_KEYS = store.PLOT_FILE_KEYS
local XLABEL, YLABEL = "position (clean/corrupted token)", "layer"

-- What each stage is drawn as: the metric itself (a signed metric, the logit difference, on a
-- diverging scale centred on 0; KL and probabilities on a sequential one), then the recovered
-- share (0 = the corrupted baseline, 1 = the clean run; below 0 or above 1 are overshoots, so it
-- is diverging too). Both mark the clean and corrupted baselines on their colour bars.
local function figures(doc)
  local m = doc.metric
  return {
    { value = "metric", base = "heatmap-", field = "value", cblabel = m.kind,
      palette = m.kind == "logit-diff" and "diverging" or "sequential",
      marks = { { label = "clean", value = doc.clean.value }, { label = "corrupted", value = doc.corrupted.value } } },
    { value = "recovered", base = "recovered-", field = "recovered", cblabel = "recovered share of " .. m.kind,
      palette = "diverging", marks = { { label = "clean", value = 1 }, { label = "corrupted", value = 0 } } },
  }
end

local function rows_of(by, si, nl, np, field)
  local rows = {}
  for li = 1, nl do
    local row = {}
    for pi = 1, np do
      local c = by[((si - 1) * nl + (li - 1)) * np + (pi - 1)]
      local v = c and c[field]
      row[pi] = type(v) == "number" and v or nil -- a null recovered share (clean = corrupted) is not drawn
    end
    rows[li] = row
  end
  return rows
end

-- draw(dir) -> the manifest's plot section { tool, title, xlabel, ylabel, cblabel, xtics, ytics,
-- files = { {stage, value = "metric"|"recovered", title, cblabel, palette, svg, png} } }
function M.draw(dir)
  local sw = store.read(dir)
  local doc, g = sw.manifest, sw.manifest.grid
  local by = {}
  for _, c in ipairs(sw.cells) do by[c.index] = c end
  local ytics = {}
  for i, l in ipairs(g.layers) do ytics[i] = tostring(l) end
  local title = string.format("%s: patched clean -> corrupted", doc.metric.label)
  local files = json.array()
  for si, stage in ipairs(g.stages) do
    for _, fig in ipairs(figures(doc)) do
      local ftitle = (fig.value == "metric" and title or ("recovered share, " .. title)) .. " at " .. stage
      local out = plot.grid { dir = dir, base = fig.base .. stage, title = ftitle, xlabel = XLABEL, ylabel = YLABEL,
        cblabel = fig.cblabel, xtics = g.position_labels, ytics = ytics,
        rows = rows_of(by, si, #g.layers, #g.positions, fig.field), palette = fig.palette, marks = fig.marks }
      files[#files + 1] = json.ordered(FILE_KEYS, { stage = stage, value = fig.value, title = ftitle,
        cblabel = fig.cblabel, palette = fig.palette, svg = fs.basename(out.svg), png = fs.basename(out.png) })
    end
  end
  doc.plot = json.ordered({ "tool", "title", "xlabel", "ylabel", "cblabel", "xtics", "ytics", "files" }, {
    tool = "gnuplot", title = title, xlabel = XLABEL, ylabel = YLABEL, cblabel = doc.metric.kind,
    xtics = json.array({ table.unpack(g.position_labels) }), ytics = json.array(ytics), files = files })
  store.write(dir, doc, sw.cells)
  return doc.plot
end

return M
