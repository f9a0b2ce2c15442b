-- --sae-steer DIR:FEATURE:SCALE: the feature's decoder direction times SCALE added where the SAE
-- writes, in prefill and every decode, through the steer experiment (counted, announced): the run
-- equals one adding scale * sae:direction(feature) by hand at that stage; bad features, a missing
-- hook and combinations are usage errors naming the flag.

local ember = require("ember")
local cases = require("helpers.sae_cases")
local C = require("helpers.cli")
local H = require("helpers.artifacts")

local PROMPT = "The quick brown fox"

describe("--sae-steer", function()
  if cases.missing then return pending(cases.missing) end
  after_each(H.cleanup)
  teardown(cases.cleanup)

  it("adds scale times the feature's decoder row at the SAE's stage, as by hand, and says so", function()
    local path = C.need_model()
    if not path then return end
    local model = ember.load { model = path }
    local e = cases.copy("saelens_standard_v6")
    local notices = {}
    local exps = require("ember.cli").steering_experiments({ ["sae-steer"] = { { sae = e.sae, feature = 5,
      scale = 4 } } }, model, function(msg) notices[#notices + 1] = msg end)
    local out = model:generate { prompt = PROMPT, max_tokens = 3, experiment = exps[1] }
    local sae = ember.sae.load(e.sae)
    local dir = sae:direction(5)
    local hand = { name = "hand" }
    function hand:after_layer(ctx, v) if ctx.layer_index == 1 then v:add(dir:clone():scale(4)) end end
    local want = model:generate { prompt = PROMPT, max_tokens = 3, experiment = hand }
    assert.are.equal(want.logits:sha256(), out.logits:sha256())
    assert.are.same(want.ids, out.ids)
    assert.are.equal(1 + out.stats.decode_count, exps[1].stats.additions)
    assert.matches("MODIFIED by steer .*feature=5.* added to after_layer of layer 1, 4 times", notices[1])
    local plain = model:generate { prompt = PROMPT, max_tokens = 3 }
    assert.are_not.equal(plain.logits:sha256(), out.logits:sha256())
  end)

  it("runs from the command line and refuses what does not fit, naming the flag", function()
    local path = C.need_model()
    if not path then return end
    local e = cases.copy("saelens_standard_v6")
    local code, _, err = C.ember("--model", path, "--prompt", PROMPT, "--max-tokens", "2", "--sae-steer",
      e.sae .. ":5:4")
    assert.are.equal(0, code, err)
    assert.matches("MODIFIED by steer", err)
    code, _, err = C.ember("--model", path, "--prompt", PROMPT, "--sae-steer", e.sae .. ":256:4")
    assert.are.equal(2, code)
    assert.matches("%-%-sae%-steer: sae .*: feature 256 is not one of its 256 %(0%-255%)", err)
    code, _, err = C.ember("--model", path, "--prompt", PROMPT, "--sae-steer", e.sae .. ":5")
    assert.are.equal(2, code)
    assert.matches("expected DIR:FEATURE:SCALE", err)
    local g = cases.copy("gemma_scope")
    code, _, err = C.ember("--model", path, "--prompt", PROMPT, "--sae-steer", g.sae .. ":1:2")
    assert.are.equal(2, code)
    assert.matches("names no hook", err)
    code, _, err = C.ember("--model", path, "--prompt", PROMPT, "--max-tokens", "1", "--sae-steer", g.sae .. ":1:2",
      "--sae-hook", "blocks.2.hook_mlp_out")
    assert.are.equal(0, code, err)
    assert.matches("added to after_mlp of layer 2", err)
    code, _, err = C.ember("--model", path, "--prompt", PROMPT, "--sae-steer", e.sae .. ":5:4", "--zero-layer-output",
      "1:mlp")
    assert.are.equal(2, code)
    assert.matches("cannot be combined", err)
    code, _, err = C.ember("--model", path, "--prompt", PROMPT, "--sae-hook", "blocks.1.hook_resid_post")
    assert.are.equal(2, code)
    assert.matches("%-%-sae%-hook needs %-%-sae%-steer", err)
  end)
end)
