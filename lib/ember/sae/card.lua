-- ember.sae.card — a feature card: the text and the picture of one feature's top-activating
-- examples (ember.sae.top's result): how often it fires, and each example's tokens with the
-- feature's activation on every one of them. Must not run a model (the examples carry the tokens).

local plot = require("ember.analysis.plot")
local token_label = require("ember.analysis.token_label")

local M = {}

-- The longest a token is shown in a picture's cell.
M.CELL_CHARS = 8

local function short(piece)
  local s = token_label.visible(piece)
  if utf8.len(s) and utf8.len(s) > M.CELL_CHARS then s = s:sub(1, utf8.offset(s, M.CELL_CHARS) - 1) .. "…" end
  return s
end

-- text(f, o) -> the card as lines: f = { feature, fired, max, examples }, o = { tokens (scanned),
-- hook, sae (its path) }. The example's top token is in [[ ]], each token followed by its
-- activation where the feature fires.
function M.text(f, o)
  local lines = { string.format("feature %d of %s (%s): fires on %d of %d tokens (%.3g%%), max %.4g", f.feature,
    o.sae or "the SAE", o.hook or "?", f.fired, o.tokens, o.tokens > 0 and 100 * f.fired / o.tokens or 0,
    f.max or 0 / 0) }
  if #f.examples == 0 then lines[#lines + 1] = "  (it never fires on these prompts)" end
  for i, ex in ipairs(f.examples) do
    local parts = {}
    for j, piece in ipairs(ex.tokens) do
      local pos, a = ex.first + j - 1, ex.activations[j]
      local t = token_label.visible(piece)
      if pos == ex.position then t = "[[" .. t .. "]]" end
      if a > 0 then t = string.format("%s(%.3g)", t, a) end
      parts[#parts + 1] = t
    end
    lines[#lines + 1] = string.format("#%-2d %8.4g  prompt %d position %d:  %s", i, ex.activation, ex.prompt,
      ex.position, table.concat(parts, " "))
  end
  return lines
end

-- picture(f, o) -> { svg, png }: one row per example (the best at the top), one column per position
-- around its top token (o.before before it, o.after after it), coloured by the activation and
-- labelled with the token; o.dir, o.base name the files.
function M.picture(f, o)
  local rows, cells, ytics, xtics = {}, {}, {}, {}
  for c = -o.before, o.after do xtics[#xtics + 1] = c == 0 and "top" or string.format("%+d", c) end
  for i, ex in ipairs(f.examples) do
    local row, cell = {}, {}
    for c = 0, o.before + o.after do
      local j = ex.position - o.before + c - ex.first + 1
      row[c + 1] = ex.activations[j] or 0 / 0
      cell[c + 1] = ex.tokens[j] and short(ex.tokens[j]) or ""
    end
    rows[i], cells[i] = row, cell
    ytics[i] = string.format("#%d p%d@%d", i, ex.prompt, ex.position)
  end
  if #rows == 0 then return nil end
  return plot.grid { dir = o.dir, base = o.base, title = string.format("feature %d: top %d examples", f.feature,
    #rows), xlabel = "position relative to the top token", ylabel = "example (prompt @ position)",
    cblabel = "activation", xtics = xtics, ytics = ytics, rows = rows, cells = cells, origin = "top",
    palette = "sequential", nan_label = "grey: outside the prompt" }
end

return M
