-- compare-artifacts on crafted artifacts: every class of SPEC §6.3 (as defined in
-- docs/artifacts.md), duplicate rejection, and per-record metrics checked against values worked
-- out by hand.

local artifact = require("ember.store.artifact")
local compare = require("ember.analysis.compare")
local cjson = require("cjson")
local ember = require("ember")
local H = require("helpers.artifacts")

-- make(sections_patch, values, records_patch) -> artifact table as artifact.read returns it
local function make(patch_sections, values, patch_records)
  local dir = H.tmpdir() .. "/art"
  local recs = H.records(values)
  if patch_records then patch_records(recs) end
  artifact.write(dir, H.sections(patch_sections), recs)
  return artifact.read(dir)
end

local function class_of(a, b) return compare.compare(a, b).class end

describe("compare classes", function()
  after_each(H.cleanup)

  it("exact: the same run repeated (only created_at_unix and the output directory differ)", function()
    local a = make()
    local b = make(function(s)
      s.created_at_unix = 1800000000
      s.capture.output_dir = "/elsewhere"
      s.argv[3] = "/elsewhere" -- the directory also appears in argv, and is ignored there too
    end)
    local res = compare.compare(a, b)
    assert.equal("exact", res.class)
    assert.equal(4, res.summary.identical)
    for _, d in ipairs(res.provenance_differences) do assert.equal("ignored", d.kind) end
  end)

  it("exact-semantic: bit-identical tensors, recorded provenance differs", function()
    local a = make()
    local b = make(function(s)
      s.experiment = { name = "activation-patch+capture", args = "/tmp/a 1:after_mlp", modified = true, members = {} }
      s.capture.config_sha256 = string.rep("e", 64)
      s.argv = { "ember", "--activation-patch", "/tmp/a" }
    end)
    local res = compare.compare(a, b)
    assert.equal("exact-semantic", res.class)
    local kinds = {}
    for _, d in ipairs(res.provenance_differences) do kinds[d.path] = d.kind end
    assert.equal("recorded", kinds["experiment.name"])
    assert.equal("recorded", kinds["capture.config_sha256"])
    assert.equal("recorded", kinds["argv"])
  end)

  it("equal generated ids with one different tensor is output-equivalent, never exact", function()
    local a = make()
    local b = make(nil, { [1] = { 0.5, -1.0, 2.0, 0.25, 0.0, -3.25 } })
    local res = compare.compare(a, b)
    assert.equal("output-equivalent", res.class)
    assert.is_true(res.generated_ids_equal)
    assert.is_false(compare.at_least(res.class, "exact-semantic"))
    assert.matches("1 of 4 aligned records differ", res.reason, 1, true)
  end)

  it("a semantic provenance difference is never exact-semantic even with identical tensors", function()
    local a = make()
    for _, patch in ipairs({
      function(s) s.model.sha256 = string.rep("b", 64) end,
      function(s) s.tokenizer.sha256 = string.rep("b", 64) end,
      function(s) -- another prompt: "ho" and its sha256 (sha256sum)
        s.prompt.text, s.prompt.sha256 = "ho", "a821c62e8104f8519d639b4c0948aece641b143f6601fa145993bb2e2c7299d4"
      end,
      function(s) s.settings.seed = 1 end,
    }) do
      local res = compare.compare(a, make(patch))
      assert.equal("output-equivalent", res.class)
      assert.is_false(res.semantic_provenance_equal)
    end
  end)

  it("a different record set is not exact even when every aligned record is identical", function()
    local a = make()
    local b = make(nil, nil, function(recs) table.remove(recs, 3) end)
    local res = compare.compare(a, b)
    assert.equal(1, res.summary.only_in_a)
    assert.equal("output-equivalent", res.class)
  end)

  it("top1-equivalent: generated ids differ but every aligned logits row keeps its top-1 token", function()
    local a = make()
    local b = make(function(s) s.generated_ids = { 3, 0 } end,
      { [2] = { 0.2, 2.4, -1.0, 0.3 }, [4] = { 2.9, 0.1, 0.5, -2.0 } })
    assert.equal("top1-equivalent", class_of(a, b))
  end)

  it("failed: a logits row changes its top-1 token and the ids differ", function()
    local a = make()
    local b = make(function(s) s.generated_ids = { 0, 1 } end, { [2] = { 2.6, 2.5, -1.0, 0.3 } })
    local res = compare.compare(a, b)
    assert.equal("failed", res.class)
    assert.matches("top-1", res.reason, 1, true)
    local row
    for _, r in ipairs(res.records) do if r.label == "after_logits prefill @0" then row = r end end
    assert.same({ 1 }, row.top1_a)
    assert.same({ 0 }, row.top1_b)
  end)

  it("failed: different prompts (input ids) cannot be output-equivalent", function()
    local a = make()
    local b = make(function(s) s.input_ids = { 1, 3 } end)
    local res = compare.compare(a, b)
    assert.equal("failed", res.class)
    assert.matches("input ids differ", res.reason, 1, true)
  end)

  it("failed: artifacts with no record in common cannot be aligned", function()
    local a = make(nil, nil, function(recs)
      for _, r in ipairs(recs) do r.start_position = r.start_position + 10 end
    end)
    local b = make()
    local res = compare.compare(a, b)
    assert.equal("failed", res.class)
    assert.matches("cannot align", res.reason, 1, true)
  end)

  it("rejects duplicate (stage, layer, phase, start_position) records", function()
    local a = make(nil, nil, function(recs)
      recs[#recs + 1] = { stage = "after_mlp", layer = 1, phase = "decode", start_position = 2, shape = { 1, 3 },
        data = H.f32({ 9, 9, 9 }) }
    end)
    local b = make()
    for _, res in ipairs({ compare.compare(a, b), compare.compare(b, a) }) do
      assert.equal("failed", res.class)
      assert.matches("duplicate record after_mlp layer 1 decode @2", res.reason, 1, true)
      assert.matches("records 2 and 4", res.reason, 1, true)
    end
  end)

  it("orders the classes strictest first for --require", function()
    assert.is_true(compare.at_least("exact", "exact-semantic"))
    assert.is_true(compare.at_least("exact-semantic", "exact-semantic"))
    assert.is_false(compare.at_least("output-equivalent", "exact-semantic"))
    assert.is_true(compare.at_least("top1-equivalent", "failed"))
    assert.is_false(compare.at_least("failed", "top1-equivalent"))
  end)
end)

describe("compare metrics", function()
  local function rec(values, shape)
    shape = shape or { 1, #values }
    return { shape = shape, tensor = ember.tensor(shape[1], shape[2], values) }
  end

  it("measure |a - b| by max, mean and RMS, and L2 and relative L2 of the difference", function()
    local m = compare.metrics(rec({ 3, 4, 0, 0 }), rec({ 0, 0, 0, 0 }))
    assert.is_false(m.bitwise_equal)
    assert.equal(2, m.differing_elements)
    assert.equal(4, m.max_abs_diff)
    assert.equal(7 / 4, m.mean_abs_diff)
    assert.near(math.sqrt(25 / 4), m.rms_abs_diff, 1e-15)
    assert.equal(5, m.l2)
    assert.equal(1, m.rel_l2)
    assert.is_nil(m.cosine) -- undefined against a zero vector
  end)

  it("compute cosine similarity of the two tensors", function()
    assert.near(0, compare.metrics(rec({ 1, 0 }), rec({ 0, 1 })).cosine, 1e-15)
    assert.near(-1, compare.metrics(rec({ 1, 2 }), rec({ -2, -4 })).cosine, 1e-12)
    local m = compare.metrics(rec({ 1, 2, 3, 4 }), rec({ 1, 2, 3, 5 }))
    assert.near(34 / math.sqrt(30 * 39), m.cosine, 1e-12)
    assert.near(1 / math.sqrt(30), m.rel_l2, 1e-12)
  end)

  it("are bitwise: -0.0 and 0.0 differ although their difference is zero", function()
    local m = compare.metrics(rec({ 0.0, 1.0 }), rec({ -0.0, 1.0 }))
    assert.is_false(m.bitwise_equal)
    assert.equal(1, m.differing_elements)
    assert.equal(0, m.max_abs_diff)
  end)

  it("treat the same NaN bits as identical and report NaN differences", function()
    local nan = 0 / 0
    assert.is_true(compare.metrics(rec({ nan, 1 }), rec({ nan, 1 })).bitwise_equal)
    local m = compare.metrics(rec({ nan, 1 }), rec({ 1, 1 }))
    assert.is_false(m.bitwise_equal)
    assert.is_true(m.max_abs_diff ~= m.max_abs_diff)
  end)

  it("find one differing value among many", function()
    local a, b = {}, {}
    for i = 1, 10000 do a[i] = i % 7; b[i] = i % 7 end
    b[9999] = b[9999] + 2
    local m = compare.metrics(rec(a, { 100, 100 }), rec(b, { 100, 100 }))
    assert.equal(1, m.differing_elements)
    assert.equal(2, m.max_abs_diff)
  end)

  it("take the lowest token id on top-1 ties, as greedy sampling does", function()
    assert.same({ 1, 2 }, ember.tensor(2, 4, { 0, 9, 2, 9, 1, 3, 8, 8 }):top1())
  end)

  it("never let NaN win top-1, and give an all-NaN row no id", function()
    local nan = 0 / 0
    local top = ember.tensor(3, 3, { nan, 1, 2, 5, nan, -1, nan, nan, nan }):top1()
    assert.equal(2, top[1])
    assert.equal(0, top[2])
    assert.is_nil(top[3])
  end)

  it("refuse tensors of different shapes", function()
    local ok, err = pcall(function() return ember.tensor(2, 2):compare(ember.tensor(1, 4)) end)
    assert.is_false(ok)
    assert.matches("compare: shape mismatch: [2, 2] vs [1, 4]", err, 1, true)
  end)

  it("measure as the definitions in docs/artifacts.md, summed in double precision", function()
    -- independent oracle: the definitions written out over the f32 values (H.f32 rounds as the core does)
    local a, b = {}, {}
    for i = 1, 257 do a[i] = math.sin(i) * 3; b[i] = a[i] + ((i % 5 == 0) and 1e-3 * i or 0) end
    local fa = H.unpack_f32(H.f32(a))
    local fb = H.unpack_f32(H.f32(b))
    local max_d, sum_d, sum_d2, dot, na2, nb2 = 0, 0, 0, 0, 0, 0
    for i = 1, #fa do
      local d = math.abs(fa[i] - fb[i])
      max_d = math.max(max_d, d)
      sum_d, sum_d2 = sum_d + d, sum_d2 + d * d
      dot, na2, nb2 = dot + fa[i] * fb[i], na2 + fa[i] * fa[i], nb2 + fb[i] * fb[i]
    end
    local m = compare.metrics(rec(a), rec(b))
    assert.equal(max_d, m.max_abs_diff)
    assert.equal(sum_d / #fa, m.mean_abs_diff)
    assert.equal(math.sqrt(sum_d2 / #fa), m.rms_abs_diff)
    assert.equal(math.sqrt(sum_d2), m.l2)
    assert.equal(math.sqrt(sum_d2) / math.sqrt(na2), m.rel_l2)
    assert.equal(dot / (math.sqrt(na2) * math.sqrt(nb2)), m.cosine)
    assert.equal(51, m.differing_elements)
  end)
end)

describe("compare outcome", function()
  after_each(H.cleanup)

  local function zeroed(s)
    s.experiment = { name = "zero-layer-output+capture", args = "1:mlp", modified = true,
      members = { { name = "zero-layer-output", stats = { interventions = 2 } }, { name = "capture", stats = {} } } }
  end

  it("names an intended intervention's effect as such, whatever the class", function()
    local a = make()
    local b = make(zeroed, { [1] = { 0.5, -1.0, 2.0, 0.25, 0.0, -3.25 } }) -- record 1: after_mlp of layer 1
    for _, pair in ipairs({ { a, b, "B" }, { b, a, "A" } }) do
      local res = compare.compare(pair[1], pair[2])
      assert.equal("output-equivalent", res.class) -- the class is SPEC 6.3's, unchanged
      assert.equal(pair[3] .. " was modified by its intervention (zero-layer-output 1:mlp), and it changed the run "
        .. "as an intervention does: records differ from after_mlp layer 1 (prefill, position 0) on; the generated "
        .. "ids are equal (class output-equivalent measures how far the outputs moved, not an error)", res.outcome)
      assert.matches("\noutcome: " .. pair[3] .. " was modified", compare.format_text(res), 1, true)
      assert.equal(res.outcome, cjson.decode(compare.to_json(res)).outcome)
    end
  end)

  it("says when an intervention restored the run, and when a change had no intervention behind it", function()
    local a = make()
    local res = compare.compare(a, make(zeroed))
    assert.equal("exact-semantic", res.class)
    assert.equal("B was modified by its intervention (zero-layer-output 1:mlp); every captured record is "
      .. "bit-identical to the other run's: the intervention restored (or left unchanged) what was captured",
      res.outcome)
    res = compare.compare(a, make(nil, { [1] = { 0.5, -1.0, 2.0, 0.25, 0.0, -3.25 } }))
    assert.equal("neither run records an intervention, yet records differ from after_mlp layer 1 (prefill, "
      .. "position 0) on; the generated ids are equal: not an intended change (see the provenance differences)",
      res.outcome)
    assert.equal("the same computation: every captured record bit-identical", compare.compare(a, make()).outcome)
  end)
end)

describe("compare output", function()
  after_each(H.cleanup)

  it("prints a table and the class, and JSON that jq-style tools can read", function()
    local a = make()
    local b = make(nil, { [1] = { 0.5, -1.0, 2.0, 0.25, 0.0, -3.25 } })
    local res = compare.compare(a, b)
    local text = compare.format_text(res)
    assert.matches("class: output-equivalent", text, 1, true)
    assert.matches("after_mlp%s+1%s+prefill%s+0%s+2x3%s+differs", text)
    local doc = cjson.decode(compare.to_json(res))
    assert.equal("output-equivalent", doc.class)
    assert.equal(4, doc.summary.aligned)
    assert.equal("differs", doc.records[1].status)
    assert.equal(0.25, doc.records[1].max_abs_diff)
    assert.equal(cjson.null, doc.records[2].layer)
  end)
end)
