-- Figures and the gnuplot boundary (docs/robustness.md "Data never becomes code"): the one
-- escaper of strings in gnuplot scripts, labels read from disk checked where they are read (the
-- repro of issue 27 item 1: two shards whose metric label holds "\n!cmd"), paths with '%', and no
-- library string used as a gsub replacement. Expectations come from gnuplot itself (what it prints
-- back) and from the bytes of the files, not from the library's own helpers.

local cjson = require("cjson")
local fs = require("ember.store.fs")
local plot = require("ember.analysis.plot")
local token_label = require("ember.analysis.token_label")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")
local read = require("helpers.files").read

local MODEL_ARGS = "--family llama --dtype f32 --layers 2 --seed 7"
local CLEAN, CORRUPTED = "The quick brown cat", "The slow brown fox"

local function need_gnuplot()
  if not plot.gnuplot() then pending("gnuplot is not installed (Debian: gnuplot-nox)") end
end

-- every byte value, alone and between letters, plus the payloads of the report
local function hostile_strings()
  local out = { "KL\n!id > PWNED\n", "a\r!touch x", "`touch bq`", "@macro", "it's", "back\\", "\0nul", "\27[31m",
    "\xff\xfe", "\xc0\xaf", "\xed\xa0\x80" }
  for b = 0, 255 do out[#out + 1] = "x" .. string.char(b) .. "y" end
  return out
end

describe("plot.quote", function()
  it("never emits a control byte, a newline or invalid UTF-8, and doubles the quote", function()
    for _, s in ipairs(hostile_strings()) do
      local q = plot.quote(s)
      assert.is_nil(q:find("[%z\1-\31\127]"), string.format("%q", q))
      assert.truthy(utf8.len(q), string.format("invalid UTF-8 in %q", q))
      assert.equal("'", q:sub(1, 1))
      assert.equal("'", q:sub(-1))
      -- inside, every quote is doubled: removing the pairs leaves none
      assert.is_nil(q:sub(2, -2):gsub("''", ""):find("'", 1, true), q)
    end
  end)

  it("reads back through gnuplot as the printable text, with no substitution or command run", function()
    need_gnuplot()
    local dir = fs.make_temp_dir("ember-plot-spec")
    local probe = dir .. "/ran"
    local strings = { "plain text", "it's", "`touch " .. probe .. "`", "@DATA", "$1 ; # x", "back\\",
      "KL\n!touch " .. probe .. "\n", "tab\there", "\xe2\x90\xa3 and \xc3\xa9", "\xff broken" }
    local lines = {}
    for _, s in ipairs(strings) do lines[#lines + 1] = "print " .. plot.quote(s) end
    local f = assert(io.open(dir .. "/t.gp", "wb"))
    f:write(table.concat(lines, "\n"), "\n")
    f:close()
    local ok = os.execute(string.format("cd %s && %s t.gp 2>out.txt", fs.shell_quote(dir),
      fs.shell_quote(plot.gnuplot())))
    assert.is_true(ok == true, read(dir .. "/out.txt"))
    local got = {}
    for l in read(dir .. "/out.txt"):gmatch("([^\n]*)\n") do got[#got + 1] = l end
    assert.equal(#strings, #got)
    -- the expected text, written out by hand: control bytes and broken UTF-8 as visible escapes
    local want = { "plain text", "it's", "`touch " .. probe .. "`", "@DATA", "$1 ; # x", "back\\",
      "KL\\n!touch " .. probe .. "\\n", "tab\\there", "\xe2\x90\xa3 and \xc3\xa9", "\\xFF broken" }
    assert.same(want, got)
    assert.is_false(fs.exists(probe))
    fs.remove_tree(dir)
  end)
end)

describe("token_label.visible", function()
  it("makes whitespace tokens visible and keeps valid UTF-8", function()
    assert.equal("\u{2423}Paris", token_label.visible(" Paris"))
    assert.equal("\\n", token_label.visible("\n"))
    assert.equal("\\n\\n", token_label.visible("\n\n"))
    assert.equal("\\t\u{2423}", token_label.visible("\t "))
    assert.equal("caf\xc3\xa9", token_label.visible("caf\xc3\xa9"))
    -- half of a two-byte character (a byte-level BPE piece) is shown as its byte
    assert.equal("\\xC3", token_label.visible("\xc3"))
    assert.equal("\\x00\\x7F", token_label.visible("\0\127"))
  end)
end)

describe("figures from hostile text", function()
  local work
  before_each(function() work = fs.make_temp_dir("ember-plot-spec") end)
  after_each(function() if work then fs.remove_tree(work) end end)

  it("draws titles, tics and series names holding newlines and '!cmd' as text, running nothing", function()
    need_gnuplot()
    local probe = work .. "/PWNED"
    local evil = "KL\n!touch " .. probe .. "\n"
    local out = plot.grid { dir = work, base = "h", title = evil, xlabel = evil, ylabel = "layer", cblabel = evil,
      xtics = { evil, "b" }, ytics = { "0", "1" }, rows = { { 1, 2 }, { 3, 4 } } }
    assert.is_false(fs.exists(probe))
    local svg = read(out.svg)
    assert.truthy(svg:find("KL\\n!touch " .. probe .. "\\n", 1, true), "the title is drawn as text")
    local l = plot.lines { dir = work, base = "l", title = evil, xlabel = "layer", ylabel = evil, xtics = { "0", "1" },
      series = { { name = evil, values = { 1, 2 } } } }
    assert.is_false(fs.exists(probe))
    assert.equal("\137PNG\r\n\26\n", read(l.png):sub(1, 8))
  end)

  it("draws into a directory whose name holds '%' (no path is a gsub replacement)", function()
    need_gnuplot()
    local dir = work .. "/a%1b%%c%"
    assert(fs.mkdir(dir))
    local out = plot.grid { dir = dir, base = "h", title = "t", xlabel = "x", ylabel = "y", xtics = { "a", "b" },
      ytics = { "0" }, rows = { { 1, 2 } } }
    assert.equal(dir .. "/h.png", out.png)
    assert.equal("\137PNG\r\n\26\n", read(out.png):sub(1, 8))
    assert.truthy(read(out.svg):find("<svg", 1, true))
  end)
end)

describe("heatmap colour bars", function()
  local function labels(sc)
    local out = {}
    for _, t in ipairs(sc.tics) do out[#out + 1] = t.label end
    return out
  end

  it("centres a diverging scale on 0 and keeps the baselines inside it", function()
    local sc = plot.scale { xtics = { "a", "b" }, rows = { { -1, 3 } }, marks = { { label = "clean", value = -4.5 } } }
    assert.equal("diverging", sc.palette) -- both signs: diverging by default
    assert.same({ -4.5, 4.5 }, { sc.lo, sc.hi })
    assert.same({ { label = "clean -4.5", value = -4.5 } }, sc.marks)
    -- tics every 2 from -4 to 4, without -4 (too close to the clean mark)
    assert.same({ "-2", "0", "2", "4" }, labels(sc))
    sc = plot.scale { xtics = { "a" }, rows = { { 0.25 } }, palette = "diverging" }
    assert.same({ -0.25, 0.25 }, { sc.lo, sc.hi })
  end)

  it("uses a sequential scale for values of one sign, and joins the labels of close marks", function()
    local sc = plot.scale { xtics = { "a", "b" }, rows = { { 0, 0.14 } },
      marks = { { label = "clean", value = 0 }, { label = "corrupted", value = 0.005 } } }
    assert.equal("sequential", sc.palette)
    assert.same({ 0, 0.14 }, { sc.lo, sc.hi })
    assert.same({ { label = "clean 0 / corrupted 0.005", value = 0 } }, sc.marks)
    assert.same({ 0, 0.005 }, sc.bars) -- both still drawn where they are
    local ok, err = pcall(plot.scale, { xtics = { "a" }, rows = { { 1 } }, palette = "rainbow" })
    assert.is_false(ok)
    assert.matches("unknown palette 'rainbow'", err, 1, true)
  end)

  it("puts the colour-bar label clear of the longest tic label, and every label on the canvas", function()
    need_gnuplot()
    local work = fs.make_temp_dir("ember-plot-spec")
    local out = plot.grid { dir = work, base = "h", title = "a title", xlabel = "position", ylabel = "layer",
      cblabel = "metric", xtics = { "0 \u{2423}The", "1 \\n" }, ytics = { "0", "1" },
      rows = { { -123.456, 7 }, { 0.5, 1 } },
      marks = { { label = "corrupted", value = -100.25 }, { label = "clean", value = 99.5 } } }
    local svg = read(out.svg)
    local width = tonumber(svg:match('viewBox="0 0 (%d+) %d+"'))
    -- text positions: gnuplot writes each label as <g transform="translate(x,y)" ... text-anchor="A"><text>T</text>
    local cb_right, cblabel_x = 0, nil
    local label_pattern = 'translate%(([%d.]+),[%d.]+%)( ?[^"]*)"[^>]-text%-anchor="(%a+)">%s*<text>([^<]*)</text>'
    for x, rot, anchor, text in svg:gmatch(label_pattern) do
      x = tonumber(x)
      if text == "metric" then cblabel_x = x
      elseif anchor == "start" and rot == "" then
        -- DejaVu Sans at 11 px: digits and most letters advance at most 0.64 em (7.04 px)
        cb_right = math.max(cb_right, x + utf8.len(text) * 7.04)
        assert.is_true(x + utf8.len(text) * 7.04 <= width, "off the canvas: " .. text)
      end
    end
    assert.truthy(cblabel_x, "the colour-bar label is drawn")
    assert.truthy(svg:find("corrupted -100.2", 1, true))
    assert.truthy(svg:find("clean 99.5", 1, true))
    -- the label is turned by 90 degrees: half its font height on each side of x
    assert.is_true(cblabel_x - 6 > cb_right, string.format("label at %g, tic labels end at %g", cblabel_x, cb_right))
    fs.remove_tree(work)
  end)
end)

describe("ember sweep merge of shards with hostile labels (issue 27 item 1)", function()
  local work, path
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    work = fs.make_temp_dir("ember-plot-merge")
  end)
  teardown(function() if work then fs.remove_tree(work) end end)

  local function shards(edit)
    local dirs = {}
    for i = 0, 1 do
      local d = string.format("%s/s%d-%s", work, i, edit.name)
      local code, _, err = C.ember("sweep", "--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out", d,
        "--layers", "0", "--positions", "10,11", "--shard", i .. "/2", "--threads", "1", "--progress", "none",
        "--no-plot")
      assert.equal(0, code, err)
      local mpath = d .. "/manifest.json"
      local doc = cjson.decode(read(mpath))
      edit.apply(doc)
      local f = assert(io.open(mpath, "wb"))
      f:write(cjson.encode(doc))
      f:close()
      dirs[#dirs + 1] = d
    end
    return dirs
  end

  local cases = {
    { name = "repro", field = "metric.label", apply = function(d) d.metric.label = "KL\n!id > PWNED\n" end },
    { name = "abs", field = "metric.label",
      apply = function(d) d.metric.label = "KL\n!touch " .. work .. "/PWNED2\n" end },
    { name = "tic", field = "grid.position_labels[1]",
      apply = function(d) d.grid.position_labels[2] = "11 x\n!touch " .. work .. "/PWNED3" end },
    { name = "stage", field = "grid.stages[0]", apply = function(d) d.grid.stages[1] = "../../escape" end },
  }
  for _, case in ipairs(cases) do
    it("refuses at read, naming " .. case.field .. ", and makes no file (" .. case.name .. ")", function()
      if not path then pending("tiny model unavailable") end
      local dirs = shards(case)
      local out = work .. "/merged-" .. case.name
      local code, _, err = C.ember("sweep", "merge", out, dirs[1], dirs[2])
      assert.is_not.equal(0, code)
      assert.matches(case.field, err, 1, true)
      assert.matches("the manifest was not written by ember", err, 1, true)
      assert.is_false(fs.exists(out))
      for _, name in ipairs({ "PWNED", "PWNED2", "PWNED3" }) do
        assert.is_false(fs.exists(work .. "/" .. name))
        assert.is_false(fs.exists(name))
      end
    end)
  end

  it("merges the untouched shards and draws their heatmap", function()
    if not path then pending("tiny model unavailable") end
    need_gnuplot()
    local dirs = shards({ name = "clean", apply = function() end })
    local out = work .. "/merged-ok"
    local code, _, err = C.ember("sweep", "merge", out, dirs[1], dirs[2])
    assert.equal(0, code, err)
    assert.truthy(fs.exists(out .. "/heatmap-after_layer.png"), err)
  end)
end)

describe("compare-models merge of reports with hostile text", function()
  it("refuses a dtype holding a newline and an unknown stage, naming the field", function()
    local cm = require("ember.analysis.compare_models")
    local function report(dtype, stage)
      return { shard = { index = 0, count = 1 }, a = { dtype = dtype }, b = { dtype = "Q8_0" }, stages = { stage } }
    end
    local ok, err = pcall(cm.merge, { report("F32\n!touch x", "after_layer") })
    assert.is_false(ok)
    assert.matches("report 1: a.dtype is not printable text ('F32\\n!touch x')", err, 1, true)
    ok, err = pcall(cm.merge, { report("F32", "x\n!y") })
    assert.is_false(ok)
    assert.matches("report 1: stages[0] is 'x\\n!y', not a per-layer stage", err, 1, true)
  end)
end)

describe("gsub replacements in the library", function()
  -- A string given as gsub's replacement is read for '%' escapes: a user's path or label there
  -- breaks (or changes) the result. Every replacement in lib/ and scripts/ must be a literal, a
  -- function or a table (an upper-case name: a table constant).
  local function sources()
    local out = {}
    local p = io.popen("find lib scripts -name '*.lua' | sort")
    for line in p:lines() do out[#out + 1] = line end
    p:close()
    return out
  end

  -- skips one Lua argument starting at i (a string literal or anything up to a comma at depth 0)
  local function skip_arg(s, i)
    i = s:find("%S", i)
    local c = s:sub(i, i)
    if c == '"' or c == "'" then
      local j = i + 1
      while true do
        local ch = s:sub(j, j)
        if ch == "\\" then j = j + 2 elseif ch == c then return j + 1 elseif ch == "" then return j else j = j + 1 end
      end
    end
    local depth = 0
    while i <= #s do
      local ch = s:sub(i, i)
      if ch == "(" or ch == "{" or ch == "[" then depth = depth + 1
      elseif ch == ")" or ch == "}" or ch == "]" then depth = depth - 1
      elseif ch == "," and depth == 0 then return i end
      i = i + 1
    end
    return i
  end

  it("is never a variable or an expression", function()
    local bad = {}
    for _, file in ipairs(sources()) do
      local text = read(file)
      for start in text:gmatch("gsub%(()") do
        -- `s:gsub(pat, repl)` has the pattern first; `string.gsub(s, pat, repl)` the subject before it
        local i = start
        if text:sub(start - 12, start - 1) == "string.gsub(" then i = skip_arg(text, i) + 1 end
        i = skip_arg(text, i)
        if text:sub(i, i) == "," then
          local rest = text:sub(i + 1, i + 60):match("^%s*(.*)$")
          -- a literal, a function, a table constructor, or an upper-case table constant
          local ok = rest:match("^[\"']") or rest:match("^%[%[") or rest:match("^function") or rest:match("^{")
            or rest:match("^[%u_][%u%d_]*%s*[,)]")
          if not ok then
            local line = select(2, text:sub(1, start):gsub("\n", "")) + 1
            bad[#bad + 1] = string.format("%s:%d: %s", file, line, rest)
          end
        end
      end
    end
    assert.same({}, bad)
  end)
end)
