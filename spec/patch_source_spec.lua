-- Patching records where its source came from: the run manifest's experiment details name the
-- source artifact, the sha256 of its manifest.json, the sha256 of the model it was captured from
-- and of this model. A source from another model of the same family and width is refused unless
-- --allow-foreign-source (allow_foreign_source = true), and then announced on stderr and recorded.
-- The digests are checked against sha256sum's, not ember's.

local cjson = require("cjson")
local fs = require("ember.store.fs")
local H = require("helpers.artifacts")
local C = require("helpers.cli")
local fx = require("helpers.fixtures")

local read = require("helpers.files").read

describe("--activation-patch provenance", function()
  local a, b, cap
  setup(function()
    a = fx.tiny_model("--family llama --dtype f32 --layers 2 --seed 7")
    b = fx.tiny_model("--family llama --dtype f32 --layers 2 --seed 8") -- same family and width
  end)
  after_each(H.cleanup)

  local function capture()
    local dir = H.tmpdir()
    cap = dir .. "/cap"
    local code, _, err = C.ember("--model", a, "--prompt", "hi", "--max-tokens", "2", "--capture-activations", cap,
      "--capture-stages", "after_mlp")
    assert.equal(0, code, err)
    return dir
  end
  local function patch(model, dir, ...)
    return C.ember("--model", model, "--prompt", "hi", "--max-tokens", "2", "--activation-patch", cap,
      "--patch-target", "1:after_mlp", "--run-manifest", dir .. "/run.json", ...)
  end

  it("records the source artifact's manifest digest and both models' sha256", function()
    if not a then return pending("make-tiny-model is not built") end
    local dir = capture()
    local code, _, err = patch(a, dir)
    assert.equal(0, code, err)
    local d = cjson.decode(read(dir .. "/run.json")).experiment.members[1].details
    assert.equal(cap, d.source)
    assert.equal(H.sha256sum(read(cap .. "/manifest.json")), d.source_manifest_sha256)
    assert.equal(H.sha256sum(read(a)), d.source_model_sha256)
    assert.equal(H.sha256sum(read(a)), d.model_sha256)
    assert.is_false(d.foreign_source)
  end)

  it("refuses a source from another model without --allow-foreign-source, naming both digests", function()
    if not a then return pending("make-tiny-model is not built") end
    local dir = capture()
    local code, _, err = patch(b, dir)
    assert.are_not.equal(0, code)
    assert.matches("captured from another model", err, 1, true)
    assert.matches(H.sha256sum(read(a)), err, 1, true)
    assert.matches(H.sha256sum(read(b)), err, 1, true)
    assert.matches("--allow-foreign-source", err, 1, true)
    assert.is_false(fs.exists(dir .. "/run.json"))
  end)

  it("with --allow-foreign-source runs, says so on stderr and records it", function()
    if not a then return pending("make-tiny-model is not built") end
    local dir = capture()
    local code, _, err = patch(b, dir, "--allow-foreign-source")
    assert.equal(0, code, err)
    assert.matches("comes from another model", err, 1, true)
    local d = cjson.decode(read(dir .. "/run.json")).experiment.members[1].details
    assert.is_true(d.foreign_source)
    assert.equal(H.sha256sum(read(a)), d.source_model_sha256)
    assert.equal(H.sha256sum(read(b)), d.model_sha256)
    -- the flag alone is a usage error
    code, _, err = C.ember("--model", b, "--prompt", "hi", "--allow-foreign-source")
    assert.equal(2, code)
    assert.matches("--allow-foreign-source needs --activation-patch DIR", err, 1, true)
  end)
end)
