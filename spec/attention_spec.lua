-- ember.plot.heatmap and `ember attention` (docs/lua-api.md, docs/inspection.md): a tensor drawn
-- cell for cell (colours and places read back from the SVG against the palette's end colours),
-- token labels with whitespace visible, and attention patterns that equal what a hand-written
-- attention_pattern hook sees, one figure per head.

local ember = require("ember")
local fs = require("ember.store.fs")
local plot = require("ember.analysis.plot")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")
local read = require("helpers.files").read

local MODEL_ARGS = "--family llama --dtype f32 --layers 2 --seed 7"
local PROMPT = "The quick brown cat"

local function need_gnuplot()
  if not plot.gnuplot() then pending("gnuplot is not installed (Debian: gnuplot-nox)") end
end

-- The cells of a heatmap's SVG: gnuplot draws each as a filled polygon; the plot's cells are the
-- ones left of the colour bar (which gnuplot draws as many thin polygons further right).
local function cells(svg)
  local out = {}
  for r, g, b, pts in svg:gmatch("<polygon fill = 'rgb%(%s*(%d+),%s*(%d+),%s*(%d+)%)' points = '([^']*)'") do
    local xs, ys = {}, {}
    for x, y in pts:gmatch("([%d.]+),([%d.]+)") do xs[#xs + 1], ys[#ys + 1] = tonumber(x), tonumber(y) end
    out[#out + 1] = { rgb = { tonumber(r), tonumber(g), tonumber(b) }, x = math.min(table.unpack(xs)),
      y = math.min(table.unpack(ys)), w = math.max(table.unpack(xs)) - math.min(table.unpack(xs)),
      h = math.max(table.unpack(ys)) - math.min(table.unpack(ys)) }
  end
  return out
end

describe("ember.plot.heatmap", function()
  local work
  before_each(function() work = fs.make_temp_dir("ember-attention-spec") end)
  after_each(function() if work then fs.remove_tree(work) end end)

  it("draws each value of a 2-D tensor in its cell, row 1 at the top, on the sequential palette", function()
    need_gnuplot()
    local t = ember.tensor(2, 3, { { 0, 1, 2 }, { 3, 4, 6 } })
    local out = ember.plot.heatmap(t, { out = work .. "/t.svg", title = "a tensor", xtokens = { " Paris", "\n", "x" } })
    assert.equal(work .. "/t.svg", out.svg)
    assert.equal(work .. "/t.png", out.png)
    assert.equal("\137PNG\r\n\26\n", read(out.png):sub(1, 8))
    local svg = read(out.svg)
    -- the six cells are the six widest polygons (the colour bar's are 16 px wide)
    local all = cells(svg)
    table.sort(all, function(a, b) return a.w > b.w end)
    local six = { table.unpack(all, 1, 6) }
    assert.is_true(six[6].w > 20)
    table.sort(six, function(a, b) if a.y ~= b.y then return a.y < b.y end return a.x < b.x end)
    -- the palette's ends (#f7fbff at the minimum, #08306b at the maximum), written out here
    assert.same({ 247, 251, 255 }, six[1].rgb) -- row 1, column 1: the value 0, top left
    assert.same({ 8, 48, 107 }, six[6].rgb) -- row 2, column 3: the value 6, bottom right
    for i = 2, 6 do assert.is_true(six[i].rgb[1] < six[i - 1].rgb[1], "darker with the value") end
    -- token tics: index and piece, whitespace visible
    for _, tic in ipairs({ ">0 \u{2423}Paris<", ">1 \\n<", ">2 x<", ">0<", ">1<", ">a tensor<" }) do
      assert.truthy(svg:find(tic, 1, true), "missing " .. tic)
    end
  end)

  it("draws on a fixed colour scale with range = { lo, hi }, whatever the values' own span", function()
    need_gnuplot()
    -- one value, 1: alone it spans nothing; on the scale 0..1 it is the palette's dark end (#08306b)
    local function colour(t, opts)
      opts.out = work .. "/r"
      local all = cells(read(ember.plot.heatmap(t, opts).svg))
      table.sort(all, function(a, b) return a.w > b.w end)
      return all[1].rgb
    end
    assert.same({ 8, 48, 107 }, colour(ember.tensor(1, 1, { 1 }), { range = { 0, 1 } }))
    assert.same({ 247, 251, 255 }, colour(ember.tensor(1, 1, { 0 }), { range = { 0, 1 } }))
    assert.same({ 247, 251, 255 }, colour(ember.tensor(1, 2, { 2, 3 }), { range = { 2, 10 } }))
    local ok, err = pcall(ember.plot.heatmap, ember.tensor(1, 1, { 1 }), { out = work .. "/r", range = { 1, 1 } })
    assert.is_false(ok)
    assert.matches("heatmap: range must be { lo, hi } with lo < hi", err, 1, true)
  end)

  it("draws a single row and a single column (gnuplot alone draws no image under 2 x 2)", function()
    need_gnuplot()
    for _, shape in ipairs({ { 1, 3 }, { 3, 1 } }) do
      local t = ember.tensor(shape[1], shape[2], { 0, 1, 2 })
      local shown = {}
      for _, c in ipairs(cells(read(ember.plot.heatmap(t, { out = work .. "/line" }).svg))) do
        if c.w > 20 and c.h > 1 then shown[#shown + 1] = c end -- the cells, not the colour bar's strips
      end
      table.sort(shown, function(a, b) if a.y ~= b.y then return a.y < b.y end return a.x < b.x end)
      -- 0, 1, 2 in reading order: the palette's ends (#f7fbff, #08306b) and its middle (#6baed6)
      assert.same({ { 247, 251, 255 }, { 107, 174, 214 }, { 8, 48, 107 } },
        { shown[1] and shown[1].rgb, shown[2] and shown[2].rgb, shown[3] and shown[3].rgb })
      assert.equal(3, #shown, table.concat(shape, "x"))
    end
  end)

  it("refuses what it cannot draw, naming the option", function()
    local t = ember.tensor(1, 2, { 1, 2 })
    local cases = {
      { { out = work .. "/a", xlabels = { "a" } }, "heatmap: xlabels has 1 entries, the tensor 2 columns" },
      { { out = work .. "/a", xlabels = { "a", "b" }, xtokens = { "a", "b" } }, "give xlabels or xtokens, not both" },
      { { out = work .. "/a", colour = "red" }, "heatmap: unknown option 'colour'" },
      { {}, "heatmap: out = \"DIR/name\" is required" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(ember.plot.heatmap, t, c[1])
      assert.is_false(ok)
      assert.matches(c[2], err, 1, true)
    end
    local ok, err = pcall(ember.plot.heatmap, { 1, 2 }, { out = work .. "/a" })
    assert.is_false(ok)
    assert.matches("expected an ember.Tensor or ember.TensorView, got table", err, 1, true)
  end)
end)

describe("ember attention", function()
  local path, model, work
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    if path then model = ember.load { model = path, threads = 1 } end
    work = fs.make_temp_dir("ember-attention-spec")
  end)
  teardown(function()
    if model then model:close() end
    if work then fs.remove_tree(work) end
  end)

  -- layer `layer`'s pattern seen by a hook written here, head by head
  local function by_hook(layer)
    local heads = {}
    local exp = { name = "see-pattern" }
    function exp:attention_pattern(ctx, p)
      if ctx.layer_index == layer then
        for h = 0, model.info.n_heads - 1 do heads[h] = p:head(h):clone() end
      end
    end
    local s <close> = model:session {}
    s:prefill(model:tokenize(PROMPT), { experiment = exp })
    return heads
  end

  it("gives each head's pattern as the hook sees it: causal rows summing to 1", function()
    if not model then pending("tiny model unavailable") end
    local att = require("ember.analysis.attention")
    local res = att.patterns { model = model, prompt = PROMPT, layer = 1 }
    local want = by_hook(1)
    local n = #model:tokenize(PROMPT)
    assert.equal(model.info.n_heads, res.n_heads)
    for h = 0, res.n_heads - 1 do
      local p = res.heads[h]
      assert.same({ n, n }, p:shape())
      assert.is_true(p:compare(want[h]).bitwise_equal)
      for q = 1, n do
        local sum = 0
        for k = 1, n do
          local v = p:get(q, k)
          if k > q then assert.equal(0, v) end -- a query never sees a later key
          sum = sum + v
        end
        assert.is_true(math.abs(sum - 1) < 1e-5, string.format("head %d row %d sums to %.9g", h, q, sum))
      end
    end
  end)

  it("draws one figure per head with the prompt's tokens on both axes", function()
    if not model then pending("tiny model unavailable") end
    need_gnuplot()
    local dir = work .. "/all"
    local code, out, err = C.ember("attention", "--model", path, "--prompt", PROMPT, "--layer", "1", "--out", dir)
    assert.equal(0, code, err)
    local n_heads = model.info.n_heads
    assert.matches(string.format("layer 1, %d of %d heads", n_heads, n_heads), err, 1, true)
    local listed = {}
    for line in out:gmatch("[^\n]+") do listed[#listed + 1] = line end
    assert.equal(2 * n_heads, #listed)
    -- the labels, made here: position, then the piece with its spaces as U+2423 (the prompt's
    -- pieces hold no other whitespace or control byte)
    local ids = model:tokenize(PROMPT)
    local labels = {}
    for i, id in ipairs(ids) do
      local piece = model:detokenize({ id })
      assert.is_nil(piece:find("[%c]"))
      labels[i] = string.format("%d %s", i - 1, piece == "" and ("<" .. id .. ">") or piece:gsub(" ", "\u{2423}"))
    end
    for h = 0, n_heads - 1 do
      local base = string.format("%s/attention-L1-H%d", dir, h)
      assert.equal(base .. ".svg", listed[2 * h + 1])
      assert.equal("\137PNG\r\n\26\n", read(base .. ".png"):sub(1, 8))
      local svg = read(base .. ".svg")
      assert.truthy(svg:find(string.format(">attention pattern, layer 1 head %d<", h), 1, true))
      for _, l in ipairs(labels) do
        -- gnuplot's SVG writes '<' and '&' as entities
        local text = l:gsub("&", "&amp;"):gsub("<", "&lt;")
        local _, count = svg:gsub(">" .. text:gsub("%p", "%%%0") .. "<", "")
        assert.equal(2, count, "tic on both axes: " .. l)
      end
    end
  end)

  it("draws every pattern on the probability scale 0..1: a one-token prompt's 1 is the darkest colour", function()
    if not model then pending("tiny model unavailable") end
    need_gnuplot()
    local att = require("ember.analysis.attention")
    local res = att.draw { model = model, ids = { model:tokenize(PROMPT)[1] }, layer = 0, heads = 0,
      out = work .. "/one" }
    assert.equal(1, res.heads[0]:get(1, 1))
    local all = cells(read(res.files[1].svg))
    table.sort(all, function(a, b) return a.w > b.w end)
    assert.same({ 8, 48, 107 }, all[1].rgb) -- the sequential palette's end, #08306b
  end)

  it("draws one head with --head, and refuses layers, heads and flags it cannot use", function()
    if not model then pending("tiny model unavailable") end
    need_gnuplot()
    local dir = work .. "/one"
    local code, out, err = C.ember("attention", "--model", path, "--prompt", PROMPT, "--layer", "0", "--head", "3",
      "--out", dir)
    assert.equal(0, code, err)
    assert.equal(dir .. "/attention-L0-H3.svg\n" .. dir .. "/attention-L0-H3.png\n", out)
    code, _, err = C.ember("attention", "--model", path, "--prompt", PROMPT, "--layer", "2", "--out", dir)
    assert.equal(1, code)
    assert.matches("attention: layer 2 is out of range (the model has 2 layers: 0-1)", err, 1, true)
    code, _, err = C.ember("attention", "--model", path, "--prompt", PROMPT, "--layer", "0", "--head", "9")
    assert.equal(1, code)
    assert.matches("attention: head 9 is out of range (the layer has 4 heads: 0-3)", err, 1, true)
    code, _, err = C.ember("attention", "--model", path, "--prompt", PROMPT)
    assert.equal(2, code)
    assert.matches("attention: --layer is required", err, 1, true)
    code, _, err = C.ember("attention", "--model", path, "--prompt", PROMPT, "--layer", "0", "--steer", "x")
    assert.equal(2, code)
    assert.matches("'attention' refuses active experiments (--steer)", err, 1, true)
  end)
end)
