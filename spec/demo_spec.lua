-- `ember demo` (lib/ember/cli/demo.lua): the three steps on the tiny model — a generation equal to
-- generate's own, one norm line per layer matching a hook's reading, and the restoration
-- criterion holding; --help lists the flags.

local C = require("helpers.cli")
local demo = require("ember.cli.demo")

describe("ember demo", function()
  it("--help lists every flag", function()
    local code, out = C.ember("demo", "--help")
    assert.equal(0, code)
    for _, f in ipairs(demo.FLAGS) do assert.matches("--" .. f[1], out, 1, true) end
  end)

  it("generates, prints the per-layer norms and restores the output by patching", function()
    local path = C.need_model()
    if not path then return end
    local code, out, err = C.ember("demo", "--model", path, "--max-tokens", "4", "--layer", "2")
    assert.equal(0, code, err)
    local model = require("ember").load { model = path }
    local g = model:generate { prompt = demo.PROMPT, max_tokens = 4 }
    assert.matches("ids: " .. table.concat(g.ids, " ") .. " ", out, 1, true)
    -- the norms, read here by a hook of our own: one line per layer, in order
    local norms = {}
    model:generate { prompt = demo.PROMPT, max_tokens = 0, experiment = { name = "spec_norms",
      after_layer = function(_, ctx, view) if ctx.phase == "prefill" then norms[#norms + 1] = view:l2_norm() end end } }
    assert.equal(model.info.n_layers, #norms)
    for l, n in ipairs(norms) do
      assert.matches(string.format("layer %2d  %10.3f", l - 1, n), out, 1, true)
    end
    model:close()
    assert.matches("zero layer 2's MLP output", out, 1, true)
    assert.matches("[PASS] A/C: every aligned record bit-identical", out, 1, true)
    assert.matches("restoration criterion: HOLDS", out, 1, true)
    assert.not_matches("FAIL", out, 1, true)
  end)

  it("names a layer the model does not have", function()
    local path = C.need_model()
    if not path then return end
    local code, _, err = C.ember("demo", "--model", path, "--layer", "99")
    assert.equal(2, code)
    assert.matches("--layer: layer 99 is out of range", err, 1, true)
  end)
end)
