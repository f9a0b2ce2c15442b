-- ember.analysis.plot — figures drawn by gnuplot (Debian's gnuplot-nox): heatmaps of sweep grids and line
-- plots of per-layer divergence, each written as SVG and PNG. Must not compute what it draws.
--
-- gnuplot gets a data file and a script in a private temporary directory beside the figure and
-- runs there, so the script names only its own files ("data.txt", "out.svg") and never a path of
-- the user's; its outputs are renamed into place, so a figure appears complete or not at all.
--
-- Every string that reaches the script goes through M.quote, the one escaper: a single-quoted
-- gnuplot string (no backquote or macro substitution there) that cannot hold a newline, a control
-- byte or invalid UTF-8, so no label can end the line it sits on and start a command of its own.

local fs = require("ember.store.fs")
local token_label = require("ember.analysis.token_label")

local M = {}

local function fail(msg, ...) error("plot: " .. string.format(msg, ...), 0) end

-- gnuplot's path, or nil and why (EMBER_GNUPLOT overrides the search)
function M.gnuplot()
  local env = os.getenv("EMBER_GNUPLOT")
  if env and env ~= "" then return env end
  local p = io.popen("command -v gnuplot 2>/dev/null")
  local path = p:read("l")
  p:close()
  if path and path ~= "" then return path end
  return nil, "gnuplot is not installed (Debian: apt-get install gnuplot-nox)"
end

-- quote(s) -> a gnuplot single-quoted string holding s: control bytes and invalid UTF-8 written as
-- visible escapes (token_label.printable), the quote itself doubled (the only escape gnuplot reads
-- inside single quotes). The result never holds a byte below 0x20 or 0x7F.
local function q(s) return "'" .. token_label.printable(s):gsub("'", "''") .. "'" end
M.quote = q

-- tics(labels [, every]) -> a gnuplot tic list: label i at i-1, only every `every`-th one
local function tics(labels, every)
  local parts = {}
  for i, l in ipairs(labels) do
    if (i - 1) % (every or 1) == 0 then parts[#parts + 1] = q(l) .. " " .. (i - 1) end
  end
  return "(" .. table.concat(parts, ", ") .. ")"
end

local function every_nth(labels, every)
  local out = {}
  for i = 1, #labels, every do out[#out + 1] = labels[i] end
  return out
end

local function num(v)
  if v == nil or v ~= v then return "NaN" end
  return string.format("%.9g", v)
end

local function write_file(path, text)
  local f, err = io.open(path, "wb")
  if not f then fail("cannot write %s: %s", path, tostring(err)) end
  f:write(text)
  f:close()
end

-- Runs one script for both terminals, in a fresh directory inside `dir`; `plot_cmd` is the plot
-- command (or one per terminal, { svg =, png = }), which reads the data file as DATA (a name the
-- script defines, no path of the user's).
local function render(dir, base, setup, plot_cmd, data, size)
  local gp, why = M.gnuplot()
  if not gp then fail("%s", why) end
  -- the scratch directory sits inside the output directory, so the final rename never crosses
  -- file systems
  local tmp = fs.temp_dir_beside(fs.join(dir, "." .. base), "plot")
  write_file(fs.join(tmp, "data.txt"), data)
  local terms = {
    svg = string.format("set terminal svg size %d,%d dynamic noenhanced font 'sans,11' background rgb 'white'", size[1],
      size[2]),
    png = string.format("set terminal pngcairo size %d,%d noenhanced font 'sans,10' background rgb 'white'", size[1],
      size[2]),
  }
  local script = { "DATA = 'data.txt'" }
  for _, kind in ipairs({ "svg", "png" }) do
    script[#script + 1] = terms[kind]
    script[#script + 1] = "set output 'out." .. kind .. "'"
    script[#script + 1] = setup
    script[#script + 1] = type(plot_cmd) == "table" and plot_cmd[kind] or plot_cmd
    script[#script + 1] = "unset output"
  end
  write_file(fs.join(tmp, "plot.gp"), table.concat(script, "\n") .. "\n")
  local ok = os.execute("cd " .. fs.shell_quote(tmp) .. " && " .. fs.shell_quote(gp) .. " plot.gp >gnuplot.log 2>&1")
  if not ok then
    local msg = fs.read(fs.join(tmp, "gnuplot.log"), "gnuplot log", 1 << 20)
    fs.remove_tree(tmp)
    fail("gnuplot failed: %s", msg)
  end
  local result = {}
  for _, kind in ipairs({ "svg", "png" }) do
    local final = fs.join(dir, base .. "." .. kind)
    local rok, rerr = os.rename(fs.join(tmp, "out." .. kind), final)
    if not rok then fs.remove_tree(tmp); fail("cannot move %s into place: %s", final, tostring(rerr)) end
    result[kind] = final
  end
  fs.remove_tree(tmp)
  return result
end

local function common(o)
  local lines = { "set title " .. q(o.title), "set xlabel " .. q(o.xlabel), "set ylabel " .. q(o.ylabel) }
  return lines
end

-- ---- heatmaps -----------------------------------------------------------------------------------

-- Pixel sizes of the layout. Labels are measured in characters of CHAR_W pixels (sans at 10-11
-- points averages under 7), so every margin is computed from the labels it must hold instead of
-- left to gnuplot's estimate (which let the colour-bar label run into long tic labels).
local CHAR_W, CELL_W, CELL_H = 7, 30, 26
local NOT_COMPUTED, NOT_COMPUTED_LABEL = "#c8c8c8", "grey: not computed"
local PALETTES = {
  sequential = "set palette defined (0 '#f7fbff', 0.5 '#6baed6', 1 '#08306b')",
  -- blue below 0, white at 0, red above: the colour says the sign, the depth the size
  diverging = "set palette defined (0 '#2166ac', 0.25 '#92c5de', 0.5 '#f7f7f7', 0.75 '#f4a582', 1 '#b2182b')",
}

local function width_of(labels)
  local n = 0
  for _, l in ipairs(labels) do n = math.max(n, utf8.len(token_label.printable(l)) or #l) end
  return n * CHAR_W
end

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end

local function nice_step(span)
  local raw = span / 5
  local mag = 10 ^ math.floor(math.log(raw, 10))
  for _, m in ipairs({ 1, 2, 2.5, 5, 10 }) do if raw <= m * mag * (1 + 1e-9) then return m * mag end end
  return 10 * mag
end

local function fmt(v)
  local s = string.format("%.4g", v)
  return s == "-0" and "0" or s
end

-- scale(o) -> { lo, hi, palette, tics = { {label, value} }, marks = { {label, value} }, bars }: the
-- colour bar heatmap(o) draws. A diverging scale is symmetric around 0 (white there); baselines
-- (o.marks) are inside the range and replace the regular tics too close to them (two close marks
-- share one label); `bars` are the marks' values, each drawn as a bar.
function M.scale(o)
  local lo, hi
  local function take(v) if finite(v) then lo, hi = math.min(lo or v, v), math.max(hi or v, v) end end
  for _, row in ipairs(o.rows) do for x = 1, #o.xtics do take(row[x]) end end
  for _, m in ipairs(o.marks or {}) do take(m.value) end
  lo, hi = lo or 0, hi or 1
  local r = o.range
  if r ~= nil then -- a fixed scale (attention probabilities: 0 to 1 whatever the values)
    if type(r) ~= "table" or not finite(r[1]) or not finite(r[2]) or r[1] >= r[2] then
      fail("heatmap: range must be { lo, hi } with lo < hi, both finite")
    end
    lo, hi = r[1], r[2]
  end
  local palette = o.palette or ((lo < 0 and hi > 0) and "diverging" or "sequential")
  if not PALETTES[palette] then fail("unknown palette '%s' (sequential | diverging)", tostring(palette)) end
  if r ~= nil then -- as given
  elseif palette == "diverging" then
    local m = math.max(-lo, hi)
    if m == 0 then m = 1 end
    lo, hi = -m, m
  elseif lo == hi then
    lo, hi = lo - 0.5, hi + 0.5
  end
  local span, step = hi - lo, nice_step(hi - lo)
  local tics, marks, bars = {}, {}, {}
  for _, m in ipairs(o.marks or {}) do
    if finite(m.value) then
      bars[#bars + 1] = m.value
      local last = marks[#marks]
      if last and math.abs(last.value - m.value) < 0.08 * span then -- one label for two close marks
        last.label = last.label .. " / " .. m.label .. " " .. fmt(m.value)
      else
        marks[#marks + 1] = { label = m.label .. " " .. fmt(m.value), value = m.value }
      end
    end
  end
  for k = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) do
    local v, near = k * step, false
    for _, m in ipairs(marks) do near = near or math.abs(m.value - v) < 0.08 * span end
    if not near then tics[#tics + 1] = { label = fmt(v), value = v } end
  end
  return { lo = lo, hi = hi, palette = palette, tics = tics, marks = marks, bars = bars }
end

local function clamp(v, lo, hi) return math.max(lo, math.min(hi, v)) end

-- layout(o, sc) -> canvas size and the plot's and colour bar's boxes, in pixels from the bottom left.
-- Cells shrink for large grids (the plot stays within about 1200 x 800 pixels) and then only
-- every n-th tic is labelled, so labels never run into each other.
local function layout(o, sc, any_nan)
  local nx, ny = #o.xtics, #o.rows
  -- cells holding a text (o.cells) are as wide as their longest text
  local cell_w = CELL_W
  for _, row in ipairs(o.cells or {}) do cell_w = math.max(cell_w, width_of(row) * 8 // 10 + 8) end
  local cw, ch = clamp(math.floor((o.cells and 1600 or 1200) / nx), 2, cell_w), clamp(math.floor(800 / ny), 2, CELL_H)
  local every_x, every_y = math.ceil(15 / cw), math.ceil(14 / ch)
  local cb_labels = {}
  for _, t in ipairs(sc.tics) do cb_labels[#cb_labels + 1] = t.label end
  for _, m in ipairs(sc.marks) do cb_labels[#cb_labels + 1] = m.label end
  local left = 24 + 14 + width_of(every_nth(o.ytics, every_y)) + 10
  -- x tics are turned by 60 degrees
  local bottom = 24 + 16 + math.ceil(width_of(every_nth(o.xtics, every_x)) * 0.87) + 8
  local pw, ph = math.max(260, nx * cw), math.max(160, ny * ch)
  local right = 24 + 16 + 8 + width_of(cb_labels) + 14 + 24
  if any_nan then right = math.max(right, 24 + width_of({ o.nan_label or NOT_COMPUTED_LABEL }) + 12) end
  -- gnuplot centres the title over the plot: wide enough that it stays on the canvas
  pw = math.max(pw, width_of({ o.title or "" }) + 16 - 2 * math.min(left, right))
  local top = 44
  local w, h = left + pw + right, bottom + ph + top
  return { w = w, h = h, left = left, bottom = bottom, pw = pw, ph = ph, cb_x = left + pw + 24, cb_w = 16,
    every_x = every_x, every_y = every_y }
end

-- The setup lines of a heatmap: axes, margins, colour bar and its marks, all placed in screen
-- coordinates from `lay`.
local function heatmap_setup(o, sc, lay, any_nan)
  local function sx(px) return string.format("%.5f", px / lay.w) end
  local function sy(px) return string.format("%.5f", px / lay.h) end
  -- the axis labels go at the canvas's foot and left edge, clear of the tics (gnuplot's own places
  -- for them, with fixed margins, can fall off the canvas)
  local setup = { "set title " .. q(o.title),
    string.format("set label %s at screen %s,%s center", q(o.xlabel), sx(lay.left + lay.pw / 2), sy(12)),
    string.format("set label %s at screen %s,%s center rotate by 90", q(o.ylabel), sx(14),
      sy(lay.bottom + lay.ph / 2)) }
  local nx, ny = #o.xtics, #o.rows
  setup[#setup + 1] = "set xtics rotate by -60 " .. tics(o.xtics, lay.every_x)
  setup[#setup + 1] = "set ytics " .. tics(o.ytics, lay.every_y)
  setup[#setup + 1] = string.format("set xrange [-0.5:%g]", nx - 0.5)
  if o.origin == "top" then -- row 1 at the top, as a matrix is written
    setup[#setup + 1] = string.format("set yrange [%g:-0.5]", ny - 0.5)
  else
    setup[#setup + 1] = string.format("set yrange [-0.5:%g]", ny - 0.5)
  end
  setup[#setup + 1] = string.format("set cbrange [%.17g:%.17g]", sc.lo, sc.hi)
  setup[#setup + 1] = PALETTES[sc.palette]
  setup[#setup + 1] = "set tics out nomirror"
  setup[#setup + 1] = string.format("set lmargin at screen %s; set rmargin at screen %s", sx(lay.left),
    sx(lay.left + lay.pw))
  setup[#setup + 1] = string.format("set bmargin at screen %s; set tmargin at screen %s", sy(lay.bottom),
    sy(lay.bottom + lay.ph))
  setup[#setup + 1] = string.format("set colorbox user origin screen %s,%s size screen %s,%s", sx(lay.cb_x),
    sy(lay.bottom), sx(lay.cb_w), sy(lay.ph))
  local cbt = {}
  for _, t in ipairs(sc.tics) do cbt[#cbt + 1] = q(t.label) .. " " .. string.format("%.17g", t.value) end
  for _, m in ipairs(sc.marks) do cbt[#cbt + 1] = q(m.label) .. " " .. string.format("%.17g", m.value) end
  setup[#setup + 1] = "set cbtics out (" .. table.concat(cbt, ", ") .. ")"
  for _, v in ipairs(sc.bars) do -- each baseline as a black bar across the colour bar
    local y = lay.bottom + (v - sc.lo) / (sc.hi - sc.lo) * lay.ph
    setup[#setup + 1] = string.format("set arrow from screen %s,%s to screen %s,%s nohead front lw 2 lc rgb 'black'",
      sx(lay.cb_x - 4), sy(y), sx(lay.cb_x + lay.cb_w + 4), sy(y))
  end
  setup[#setup + 1] = string.format("set label %s at screen %s,%s center rotate by 90", q(o.cblabel or ""),
    sx(lay.w - 18), sy(lay.bottom + lay.ph / 2))
  if any_nan then
    setup[#setup + 1] = string.format(
      "set object 1 rectangle from graph 0,0 to graph 1,1 behind fillcolor rgb '%s' fillstyle solid noborder",
      NOT_COMPUTED)
    setup[#setup + 1] = string.format("set label %s at screen %s,%s left", q(o.nan_label or NOT_COMPUTED_LABEL),
      sx(lay.cb_x),
      sy(lay.bottom - 16))
  end
  return setup
end

-- grid{ dir, base, title, xlabel, ylabel, cblabel, xtics = {labels}, ytics = {labels},
--       rows = { {v...}, ... } (one row per y tic; nil/NaN = not computed, grey), origin = "bottom"
--       (row 1 at the bottom, the default) | "top", palette = "sequential" | "diverging" (default:
--       diverging when the values have both signs; a diverging scale is centred on 0), marks =
--       { {label, value} } (baselines, drawn as labelled bars on the colour bar), cells = { {text...},
--       ... } (optional: a short text written over each cell, rows as `rows`), nan_label (the legend of
--       the grey cells, default "grey: not computed"), range = { lo, hi } (the colour scale, instead
--       of the values' own span) } -> { svg, png }
function M.grid(o)
  local ny, nx = #o.rows, #o.xtics
  if nx == 0 or ny == 0 then fail("heatmap: nothing to draw (%d rows x %d columns)", ny, nx) end
  -- gnuplot draws no image narrower than 2 x 2 points: a single row or column is written twice, and
  -- the copy falls outside the axes' range (set from nx and ny), where gnuplot clips it away
  local data, any_nan = {}, false
  for _, row in ipairs(o.rows) do
    local cols = {}
    for x = 1, nx do
      cols[x] = num(row[x])
      any_nan = any_nan or cols[x] == "NaN"
    end
    if nx == 1 then cols[2] = cols[1] end
    data[#data + 1] = table.concat(cols, " ")
  end
  if ny == 1 then data[2] = data[1] end
  local sc = M.scale(o)
  local lay = layout(o, sc, any_nan)
  local setup = heatmap_setup(o, sc, lay, any_nan)
  -- o.cells: a text per cell (rows as o.rows), written over it (a token in its activation's colour)
  for y, row in ipairs(o.cells or {}) do
    for x = 1, nx do
      if row[x] and row[x] ~= "" then
        local v = o.rows[y][x]
        local dark = finite(v) and (v - sc.lo) / (sc.hi - sc.lo) > 0.6 -- white text on the deep colours
        setup[#setup + 1] = string.format("set label %s at first %d,%d center front font ',8' textcolor rgb '%s'",
          q(row[x]), x - 1, y - 1, dark and "white" or "black")
      end
    end
  end
  return render(o.dir, o.base, table.concat(setup, "\n"),
    -- SVG: one rectangle per cell (an embedded bitmap would be smoothed by viewers)
    { svg = "plot DATA matrix with image pixels notitle", png = "plot DATA matrix with image notitle" },
    table.concat(data, "\n") .. "\n", { lay.w, lay.h })
end

local function index_labels(n)
  local out = {}
  for i = 1, n do out[i] = tostring(i - 1) end
  return out
end

-- The labels of one axis of heatmap(): `labels` as given, or `tokens` (token pieces) as "i piece"
-- with whitespace visible, or the indices 0 .. n-1.
local function axis_labels(labels, tokens, n, what)
  if labels ~= nil and tokens ~= nil then fail("heatmap: give %slabels or %stokens, not both", what, what) end
  local l = labels
  if tokens ~= nil then
    l = {}
    for i, p in ipairs(tokens) do l[i] = string.format("%d %s", i - 1, token_label.visible(p)) end
  end
  if l == nil then return index_labels(n) end
  if type(l) ~= "table" or #l ~= n then
    fail("heatmap: %s%s has %s entries, the tensor %d %s", what, tokens and "tokens" or "labels",
      type(l) == "table" and tostring(#l) or "no", n, what == "x" and "columns" or "rows")
  end
  local out = {}
  for i, v in ipairs(l) do out[i] = tostring(v) end
  return out
end

local HEATMAP_OPTIONS = { out = true, title = true, xlabel = true, ylabel = true, cblabel = true, xlabels = true,
  ylabels = true, xtokens = true, ytokens = true, palette = true, marks = true, origin = true, range = true }

-- heatmap(t, opts) -> { svg, png }: a 2-D tensor (or view) [rows, cols] drawn as a heatmap, row 1 at
-- the top. opts: out = "DIR/name" (writes name.svg and name.png; a .svg/.png ending is dropped),
-- title, xlabel, ylabel, cblabel, xlabels / ylabels (one label per column / row) or xtokens /
-- ytokens (token pieces, shown as "i piece" with whitespace visible), palette, marks, origin, range
-- (see grid). NaN cells are grey.
function M.heatmap(t, opts)
  local mt = getmetatable(t)
  local name = type(mt) == "table" and rawget(mt, "__name")
  if name ~= "ember.Tensor" and name ~= "ember.TensorView" then
    fail("heatmap: expected an ember.Tensor or ember.TensorView, got %s", type(t))
  end
  opts = opts or {}
  for k in pairs(opts) do
    if not HEATMAP_OPTIONS[k] then fail("heatmap: unknown option '%s'", tostring(k)) end
  end
  if type(opts.out) ~= "string" or opts.out == "" then fail("heatmap: out = \"DIR/name\" is required") end
  local shape = t:shape()
  if #shape ~= 2 then fail("heatmap: expected a 2-D tensor, got shape [%s]", table.concat(shape, ", ")) end
  local nr, nc = shape[1], shape[2]
  local values, rows = t:values(), {}
  for r = 1, nr do
    local row = {}
    for c = 1, nc do row[c] = values[(r - 1) * nc + c] end
    rows[r] = row
  end
  local base = fs.basename(opts.out):gsub("%.svg$", ""):gsub("%.png$", "")
  return M.grid { dir = fs.dirname(opts.out), base = base, title = opts.title or "", xlabel = opts.xlabel or "column",
    ylabel = opts.ylabel or "row", cblabel = opts.cblabel or "value", xtics = axis_labels(opts.xlabels, opts.xtokens,
      nc, "x"), ytics = axis_labels(opts.ylabels, opts.ytokens, nr, "y"), rows = rows, origin = opts.origin or "top",
    palette = opts.palette, marks = opts.marks, range = opts.range }
end

-- lines{ dir, base, title, xlabel, ylabel, xtics = {labels}, series = { {name, values = {...}} },
--        logscale = bool } -> { svg, png }
function M.lines(o)
  local n = #o.xtics
  local data = {}
  for i = 1, n do
    local row = { tostring(i - 1) }
    for _, s in ipairs(o.series) do row[#row + 1] = num(s.values[i]) end
    data[#data + 1] = table.concat(row, " ")
  end
  local setup = common(o)
  setup[#setup + 1] = "set xtics " .. tics(o.xtics)
  setup[#setup + 1] = "set key below height 1" -- a line of room between the x label and the key
  setup[#setup + 1] = "set grid ytics"
  if o.logscale then setup[#setup + 1] = "set logscale y" end
  local plots = {}
  for k, s in ipairs(o.series) do
    plots[k] = string.format("DATA using 1:%d with linespoints title %s", k + 1, q(s.name))
  end
  return render(o.dir, o.base, table.concat(setup, "\n"), "plot " .. table.concat(plots, ", "),
    table.concat(data, "\n") .. "\n", { math.max(640, 200 + n * 40), 420 + 20 * #o.series })
end

return M
