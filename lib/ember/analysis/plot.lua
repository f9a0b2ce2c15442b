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

local function tics(labels)
  local parts = {}
  for i, l in ipairs(labels) do parts[i] = q(l) .. " " .. (i - 1) end
  return "(" .. table.concat(parts, ", ") .. ")"
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
-- command, which reads the data file as DATA (a name the script defines, no path of the user's).
local function render(dir, base, setup, plot_cmd, data, size)
  local gp, why = M.gnuplot()
  if not gp then fail("%s", why) end
  -- the scratch directory sits inside the output directory, so the final rename never crosses
  -- file systems
  local tmp = fs.temp_sibling(fs.join(dir, "." .. base))
  local mok, merr = fs.mkdir(tmp)
  if not mok then fail("%s", merr) end
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
    script[#script + 1] = plot_cmd
    script[#script + 1] = "unset output"
  end
  write_file(fs.join(tmp, "plot.gp"), table.concat(script, "\n") .. "\n")
  local ok = os.execute("cd " .. fs.shell_quote(tmp) .. " && " .. fs.shell_quote(gp) .. " plot.gp >gnuplot.log 2>&1")
  if not ok then
    local msg = fs.read(fs.join(tmp, "gnuplot.log"), "gnuplot log")
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

-- heatmap{ dir, base, title, xlabel, ylabel, cblabel, xtics = {labels}, ytics = {labels},
--          rows = { {v...}, ... } (one row per y tic; nil/NaN = not computed) } -> { svg, png }
function M.heatmap(o)
  local ny, nx = #o.rows, #o.xtics
  local data = {}
  for _, row in ipairs(o.rows) do
    local cols = {}
    for x = 1, nx do cols[x] = num(row[x]) end
    data[#data + 1] = table.concat(cols, " ")
  end
  local setup = common(o)
  setup[#setup + 1] = "set xtics rotate by -60 " .. tics(o.xtics)
  setup[#setup + 1] = "set ytics " .. tics(o.ytics)
  setup[#setup + 1] = string.format("set xrange [-0.5:%g]", nx - 0.5)
  setup[#setup + 1] = string.format("set yrange [-0.5:%g]", ny - 0.5)
  setup[#setup + 1] = "set cblabel " .. q(o.cblabel or "")
  setup[#setup + 1] = "set palette defined (0 '#f7fbff', 0.5 '#6baed6', 1 '#08306b')"
  setup[#setup + 1] = "set tics out nomirror"
  local w = math.max(520, 120 + nx * 38)
  local h = math.max(360, 200 + ny * 30)
  return render(o.dir, o.base, table.concat(setup, "\n"), "plot DATA matrix with image notitle",
    table.concat(data, "\n") .. "\n", { w, h })
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
  setup[#setup + 1] = "set key below"
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
