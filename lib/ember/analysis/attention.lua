-- ember.analysis.attention — the attention pattern of one layer, one figure per head (queries down,
-- keys across, both labelled with the prompt's tokens), drawn by plot.lua as SVG and PNG. Must not
-- change the run: the pattern is read through model.cache (a read-only prefill) and only drawn.

local cache = require("ember.model.cache")
local fs = require("ember.store.fs")
local plot = require("ember.analysis.plot")
local token_label = require("ember.analysis.token_label")

local M = {}

local function fail(msg, ...) error("attention: " .. string.format(msg, ...), 0) end

local OPTIONS = { model = true, prompt = true, ids = true, bos = true, layer = true, heads = true, out = true }

-- The heads to draw: `heads` (a list of 0-based heads, or one number), or all of the layer's.
local function head_list(heads, n_heads)
  if heads == nil then
    local all = {}
    for h = 0, n_heads - 1 do all[#all + 1] = h end
    return all
  end
  if math.type(heads) == "integer" then heads = { heads } end
  if type(heads) ~= "table" or #heads == 0 then fail("heads must be a head index or a list of them") end
  for _, h in ipairs(heads) do
    if math.type(h) ~= "integer" or h < 0 or h >= n_heads then
      fail("head %s is out of range (the layer has %d heads: 0-%d)", tostring(h), n_heads, n_heads - 1)
    end
  end
  return heads
end

-- patterns(opts) -> { ids, tokens = { labels }, n_heads, order = { heads drawn }, heads = { [h] =
-- Tensor [queries, keys] } }
-- opts: { model, prompt = text | ids = {...}, bos, layer, heads } (out is draw()'s)
function M.patterns(opts)
  if type(opts) ~= "table" then fail("expected a table of options, got %s", type(opts)) end
  for k in pairs(opts) do if not OPTIONS[k] then fail("unknown option '%s'", tostring(k)) end end
  local model = opts.model
  if model == nil then fail("model is required") end
  local n_layers = model.info.n_layers
  if math.type(opts.layer) ~= "integer" or opts.layer < 0 or opts.layer >= n_layers then
    fail("layer %s is out of range (the model has %d layers: 0-%d)", tostring(opts.layer), n_layers, n_layers - 1)
  end
  local c = cache.run_with_cache(model, { prompt = opts.prompt, ids = opts.ids, bos = opts.bos,
    stages = { "attention_pattern" }, layers = { opts.layer } })
  local p = c.attention_pattern[opts.layer] -- [n_heads * queries, keys], with its head layout
  local n_heads = p:shape()[1] // #c.ids
  local out = { ids = c.ids, tokens = token_label.positions(model, c.ids), n_heads = n_heads, heads = {} }
  out.order = head_list(opts.heads, n_heads)
  for _, h in ipairs(out.order) do out.heads[h] = p:head(h) end
  return out
end

-- draw(opts) -> { files = { { head, svg, png } }, tokens, n_heads }: opts as patterns(), plus
-- out = DIR (made when missing) for attention-L<layer>-H<head>.svg/.png.
function M.draw(opts)
  local pats = M.patterns(opts)
  if type(opts.out) ~= "string" or opts.out == "" then fail("out = DIR is required") end
  local ok, err = fs.mkdir_p(opts.out)
  if not ok then fail("--out: %s", err) end
  local files = {}
  for _, h in ipairs(pats.order) do
    local r = plot.heatmap(pats.heads[h], { out = fs.join(opts.out, string.format("attention-L%d-H%d", opts.layer, h)),
      title = string.format("attention pattern, layer %d head %d", opts.layer, h), xlabel = "key position (token)",
      ylabel = "query position (token)", cblabel = "attention probability", xlabels = pats.tokens,
      ylabels = pats.tokens, palette = "sequential", range = { 0, 1 } }) -- probabilities: one scale for every head
    files[#files + 1] = { head = h, svg = r.svg, png = r.png }
  end
  return { files = files, tokens = pats.tokens, n_heads = pats.n_heads, heads = pats.heads }
end

return M
