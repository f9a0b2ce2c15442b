-- The LPeg grammars behind every flag value: what they accept, what they refuse, and that a
-- refusal says what was expected (so the CLI can name the flag and the problem).

local sel = require("ember.run.selectors")

describe("selectors.parse_layer_stage", function()
  it("reads zero-layer-output's LAYER:STAGE with the three short stages", function()
    assert.same({ layer = 4, stage = "after_mlp", short = "mlp" }, sel.parse_layer_stage("4:mlp", "zero"))
    assert.same({ layer = 0, stage = "after_attention", short = "attention" },
      sel.parse_layer_stage("0:attention", "zero"))
    assert.same({ layer = 12, stage = "after_layer", short = "layer" }, sel.parse_layer_stage("12:layer", "zero"))
  end)

  it("refuses full stage names, unknown stages, trailing junk and missing parts for zero", function()
    local bads = { "4:after_mlp", "4:mlpx", "4:", ":mlp", "x:mlp", "4mlp", "4:mlp ", "-1:mlp", "4:mlp:5", "" }
    for _, bad in ipairs(bads) do
      local v, err = sel.parse_layer_stage(bad, "zero")
      assert.is_nil(v, bad)
      assert.is_string(err)
    end
    local _, err = sel.parse_layer_stage("4:mlpx", "zero")
    assert.matches("unknown stage 'mlpx'", err, 1, true)
    assert.matches("attention|mlp|layer", err, 1, true)
  end)

  it("reads patch targets with full per-layer stage names or the short names", function()
    assert.equal("after_mlp", sel.parse_layer_stage("4:after_mlp", "patch").stage)
    assert.equal("before_layer", sel.parse_layer_stage("2:before_layer", "patch").stage)
    assert.equal("after_attention", sel.parse_layer_stage("2:attention", "patch").stage)
    local v, err = sel.parse_layer_stage("2:after_logits", "patch")
    assert.is_nil(v)
    assert.matches("unknown stage 'after_logits'", err, 1, true)
  end)

  it("refuses layer numbers that do not fit an integer instead of wrapping", function()
    assert.is_nil(sel.parse_layer_stage("99999999999999999999:mlp", "zero"))
  end)
end)

describe("selectors.parse_index_list", function()
  it("reads single numbers, inclusive ranges and blanks, sorted and without repeats", function()
    assert.same({ 0, 2, 3, 4, 5, 6 }, sel.parse_index_list(" 0, 2,4-6 ,3"))
    assert.same({ 7 }, sel.parse_index_list("7"))
    assert.same({ 1, 2, 3 }, sel.parse_index_list("3,1-3,2"))
    assert.equal("all", sel.parse_index_list("all"))
  end)

  it("refuses empty ranges, dangling commas, signs and words", function()
    for _, bad in ipairs({ "3-1", "3,", ",3", "-1", "1--2", "a", "1 2", "", "all,1" }) do
      local v, err = sel.parse_index_list(bad, "layer")
      assert.is_nil(v, bad)
      assert.is_string(err)
    end
    local _, err = sel.parse_index_list("3-1", "layer")
    assert.matches("empty range 3-1", err, 1, true)
  end)
end)

describe("selectors.parse_stage_list", function()
  it("returns stages in execution order whatever order they were given in", function()
    assert.same({ "before_layer", "after_mlp", "after_logits" },
      sel.parse_stage_list("after_logits, after_mlp,before_layer"))
    assert.equal("all", sel.parse_stage_list("all"))
  end)

  it("names an unknown stage", function()
    local v, err = sel.parse_stage_list("after_mlp,after_mpl")
    assert.is_nil(v)
    assert.matches("unknown stage 'after_mpl'", err, 1, true)
  end)
end)

describe("selectors numbers", function()
  it("parse non-negative integers strictly", function()
    assert.equal(7, sel.parse_uint("007"))
    assert.equal(0, sel.parse_uint("0"))
    for _, bad in ipairs({ "-1", "+1", "1.0", "1e3", " 1", "", "0x10", "99999999999999999999" }) do
      assert.is_nil(sel.parse_uint(bad), bad)
    end
    assert.equal(-3, sel.parse_int("-3"))
  end)

  it("parse finite floats in plain and exponent notation", function()
    assert.equal(0.5, sel.parse_float("0.5"))
    assert.equal(0.001, sel.parse_float("1e-3"))
    assert.equal(-2.0, sel.parse_float("-2"))
    assert.equal(0.25, sel.parse_float(".25"))
    assert.equal("float", math.type(sel.parse_float("3")))
    for _, bad in ipairs({ "nan", "inf", "1e999", "abc", "1.2.3", "", "0.5x" }) do
      assert.is_nil(sel.parse_float(bad), bad)
    end
  end)

  it("parse phases and classes by their exact names", function()
    assert.equal("decode", sel.parse_phase("decode"))
    assert.is_nil(sel.parse_phase("Decode"))
    assert.equal("exact-semantic", sel.parse_class("exact-semantic"))
    local v, err = sel.parse_class("exact_semantic")
    assert.is_nil(v)
    assert.matches("exact|exact-semantic|output-equivalent|top1-equivalent|failed", err, 1, true)
  end)
end)

describe("selectors.parse_flag", function()
  it("splits --name and --name=value, keeping '=' inside the value", function()
    assert.same({ "max-tokens", "4" }, { sel.parse_flag("--max-tokens=4") })
    assert.same({ "prompt", "a=b" }, { sel.parse_flag("--prompt=a=b") })
    assert.same({ "prompt", "" }, { sel.parse_flag("--prompt=") })
    local name, value = sel.parse_flag("--json")
    assert.equal("json", name)
    assert.is_nil(value)
  end)

  it("tells positional words from malformed flags", function()
    assert.is_nil(sel.parse_flag("model.gguf"))
    assert.is_nil(sel.parse_flag("-3.5")) -- a negative number is a value, not a flag
    for _, bad in ipairs({ "-x", "--Max", "--max_tokens", "---x", "--", "--x-" }) do
      local ok, err = sel.parse_flag(bad)
      assert.is_false(ok, bad)
      assert.matches("malformed flag", err, 1, true)
    end
  end)
end)

describe("selectors.parse_kv", function()
  it("reads key=value pairs separated by blanks or commas, with quoted values", function()
    assert.same({ layer = "3", scale = "0.5", vector = "/tmp/a b.f32" },
      sel.parse_kv("layer=3 scale=0.5,vector='/tmp/a b.f32'"))
    assert.same({}, sel.parse_kv(""))
  end)

  it("takes a list after '=' as one value, and still splits pairs at ',key='", function()
    assert.same({ layer = "1", heads = "0,3" }, sel.parse_kv("layer=1 heads=0,3"))
    assert.same({ layers = "0,2-3", keys = "1", scale = "2" }, sel.parse_kv("layers=0,2-3,keys=1 scale=2"))
    assert.same({ heads = "0,3" }, sel.parse_kv("heads='0,3'"))
    -- a comma that ends the text or stands before a blank is a separator with nothing after it
    local kv, err = sel.parse_kv("heads=0,3,")
    assert.is_nil(kv)
    assert.matches("(a list is one value: heads=0,3; quote a value holding blanks: name='a b')", err, 1, true)
    assert.is_nil(sel.parse_kv("heads=0, 3"))
  end)

  it("refuses repeated keys and bare words", function()
    assert.is_nil(sel.parse_kv("layer=3 layer=4"))
    assert.is_nil(sel.parse_kv("layer"))
    assert.is_nil(sel.parse_kv("=3"))
  end)
end)
