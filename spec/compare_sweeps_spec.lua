-- `ember compare-artifacts` on two sweep directories (docs/artifacts.md, "Comparing two sweeps"):
-- real sweeps of a tiny model compared cell by cell, one cell altered on disk to be reported by
-- name, the classes with --require and --json, and refusal of a sweep paired with a capture.

local cjson = require("cjson")
local fs = require("ember.store.fs")
local store = require("ember.sweep.store")
local fx = require("helpers.fixtures")
local C = require("helpers.cli")

local CLEAN, CORRUPTED = "The quick brown cat", "The slow brown fox" -- 12 tokens each
local MODEL_ARGS = "--family llama --dtype f32 --layers 2 --seed 7"

-- the JSON a command printed on stdout
local function json_of(_, out) return cjson.decode(out) end

-- the next double above v (v > 0): the smallest change a cell's value can have
local function next_up(v)
  return (string.unpack("<d", string.pack("<i8", string.unpack("<i8", string.pack("<d", v)) + 1)))
end

describe("ember compare-artifacts on sweeps", function()
  local path, work
  setup(function()
    path = fx.tiny_model(MODEL_ARGS)
    work = fs.make_temp_dir("ember-compare-sweeps-spec")
  end)
  teardown(function() if work then fs.remove_tree(work) end end)

  local function need_model()
    if not path then pending("tiny model unavailable (build/make-tiny-model " .. MODEL_ARGS .. ")") end
  end

  local function sweep(name, ...)
    local out = work .. "/" .. name
    if fs.exists(out) then return out end
    local code, _, err = C.ember("sweep", "--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--out", out,
      "--progress", "none", "--no-plot", ...)
    assert.equal(0, code, err)
    return out
  end

  -- a copy of sweep `src` with `edit(cells)` applied, written back consistently (grid file included)
  local function altered(src, name, edit)
    local sw = store.read(src)
    edit(sw.cells)
    local out = work .. "/" .. name
    store.write(out, sw.manifest, sw.cells)
    return out
  end

  it("finds two identical sweeps exact, cell by cell", function()
    need_model()
    local a, b = sweep("a", "--threads", "1"), sweep("b", "--threads", "1")
    local code, out, err = C.ember("compare-artifacts", a, b, "--require", "exact")
    assert.equal(0, code, err)
    assert.matches("cells: 24 aligned, 24 bit-identical, 0 differ, 0 only in A, 0 only in B", out, 1, true)
    assert.matches("class: exact (", out, 1, true)
    -- the only differences are the ignored ones (when it ran); --out is ignored in argv
    local res = json_of(C.ember("compare-artifacts", a, b, "--json"))
    assert.equal("exact", res.class)
    assert.equal("sweep", res.kind)
    assert.equal(24, res.summary.identical)
    for _, d in ipairs(res.provenance_differences) do assert.equal("ignored", d.kind, d.path) end
  end)

  it("finds another thread count exact-semantic (threads are recorded, not compared)", function()
    need_model()
    local a, t2 = sweep("a", "--threads", "1"), sweep("t2", "--threads", "2")
    local code, out = C.ember("compare-artifacts", a, t2, "--json")
    assert.equal(0, code)
    local res = cjson.decode(out)
    assert.equal("exact-semantic", res.class)
    local paths = {}
    for _, d in ipairs(res.provenance_differences) do paths[d.path] = d.kind end
    assert.equal("recorded", paths["execution.threads"])
    local err
    code, _, err = C.ember("compare-artifacts", a, t2, "--require", "exact")
    assert.equal(1, code)
    assert.matches("class exact-semantic does not meet --require exact", err, 1, true)
    assert.equal(0, (C.ember("compare-artifacts", a, t2, "--require", "exact-semantic")))
  end)

  it("reports a sweep with one changed cell, naming the cell", function()
    need_model()
    local a = sweep("a", "--threads", "1")
    local orig
    local b = altered(a, "one-cell", function(cells)
      orig = cells[8].value -- cell index 7: layer 0, position 7
      cells[8] = store.cell { index = cells[8].index, stage = cells[8].stage, layer = cells[8].layer,
        position = cells[8].position, value = next_up(orig), recovered = cells[8].recovered,
        certified = cells[8].certified, equals_corrupted = cells[8].equals_corrupted, top1 = cells[8].top1,
        logits_sha256 = cells[8].logits_sha256, source = cells[8].source, settings_sha256 = cells[8].settings_sha256 }
    end)
    local code, out, err = C.ember("compare-artifacts", a, b)
    assert.equal(0, code, err) -- without --require the comparison itself succeeded
    assert.matches("cells: 24 aligned, 23 bit-identical, 1 differ", out, 1, true)
    assert.matches(string.format("cell 7 (0:after_layer@7): value %.17g vs %.17g", orig, next_up(orig)), out, 1, true)
    -- the patched runs still predict the same tokens: output-equivalent, not exact
    assert.matches("class: output-equivalent (1 of 24 aligned cells differ)", out, 1, true)
    code, _, err = C.ember("compare-artifacts", a, b, "--require", "exact-semantic")
    assert.equal(1, code)
    assert.matches("class output-equivalent does not meet --require exact-semantic", err, 1, true)
    local res = json_of(C.ember("compare-artifacts", a, b, "--json"))
    assert.equal(1, #res.cells)
    assert.equal(7, res.cells[1].index)
    assert.equal("0:after_layer@7", res.cells[1].target)
    assert.equal(0, res.cells[1].layer)
    assert.equal(7, res.cells[1].position)
    -- `ember sweep compare` agrees that they differ
    assert.equal(1, (C.ember("sweep", "compare", a, b)))

    -- a changed prediction in one cell fails every class, and names that cell
    local c = altered(a, "one-top1", function(cells)
      local x = cells[3]
      cells[3] = store.cell { index = x.index, stage = x.stage, layer = x.layer, position = x.position, value = x.value,
        recovered = x.recovered, certified = x.certified, equals_corrupted = x.equals_corrupted, top1 = x.top1 + 1,
        logits_sha256 = x.logits_sha256, source = x.source, settings_sha256 = x.settings_sha256 }
    end)
    code, out = C.ember("compare-artifacts", a, c, "--require", "top1-equivalent")
    assert.equal(1, code)
    assert.matches("cell 2 (0:after_layer@2): top1", out, 1, true)
    assert.matches("class: failed (", out, 1, true)
  end)

  it("compares a partial sweep with a complete one on the cells they share", function()
    need_model()
    local a = sweep("a", "--threads", "1")
    local p = sweep("partial", "--threads", "1", "--max-cells", "5")
    local res = json_of(C.ember("compare-artifacts", a, p, "--json"))
    assert.equal("top1-equivalent", res.class)
    assert.equal(5, res.summary.aligned)
    assert.equal(5, res.summary.identical)
    assert.equal(19, res.summary.only_in_a)
  end)

  it("refuses a sweep paired with an activation artifact, and a sweep whose grid file was changed", function()
    need_model()
    local a = sweep("a", "--threads", "1")
    local cap = work .. "/capture"
    local code, _, err = C.ember("--model", path, "--prompt", CLEAN, "--max-tokens", "1", "--capture-activations",
      cap, "--capture-stages", "after_layer", "--run-manifest", work .. "/run.json")
    assert.equal(0, code, err)
    code, _, err = C.ember("compare-artifacts", a, cap)
    assert.equal(1, code)
    assert.matches(string.format("'%s' is a sweep and '%s' is not a sweep", a, cap), err, 1, true)
    -- a grid file that no longer matches its manifest is an error naming the sweep, not a result
    local bad = altered(a, "bad-grid", function() end)
    local f = assert(io.open(bad .. "/grid.safetensors", "ab"))
    f:write("x")
    f:close()
    code, _, err = C.ember("compare-artifacts", a, bad)
    assert.equal(1, code)
    assert.matches("sweep '" .. bad .. "': sha256 of grid.safetensors does not match the manifest", err, 1, true)
  end)

  it("names the sweep and the cell when a manifest's cell has fields of the wrong kind", function()
    need_model()
    local a = sweep("a", "--threads", "1")
    local text = require("helpers.files").read(a .. "/manifest.json")
    for _, case in ipairs({
      { function(d) d.cells[1] = 3 end, "cell 0: not an object" },
      { function(d) d.cells[2].value = "high" end, "cell 1: value is not a number" },
      { function(d) d.cells[1].layer = "0" end, "cell 0: layer is not an integer" },
      { function(d) d.cells[1].source = 7 end, "cell 0: source is not an object" },
      { function(d) d.metric.tokens = "12" end, "metric.tokens is not a list" },
    }) do
      local doc = cjson.decode(text)
      case[1](doc)
      local out = work .. "/edited"
      fs.remove_tree(out)
      assert(fs.mkdir(out))
      local f = assert(io.open(out .. "/manifest.json", "wb"))
      f:write(cjson.encode(doc))
      f:close()
      local ok, err = pcall(store.read, out, { partial_ok = true })
      assert.is_false(ok)
      assert.matches("sweep '" .. out .. "': ", tostring(err), 1, true)
      assert.matches(case[2], tostring(err), 1, true)
    end
  end)
end)

teardown(function() fx.cleanup() end)
