-- all_logits = true: s:prefill returns [P, n_vocab] (every position's logits; the last row is the
-- default result bit for bit, row t the logits of a prefill of the first t tokens), decode stays
-- [1, n_vocab], generate adds out.prompt_logits, and the logits hooks still see one row.

local ember = require("ember")
local models = require("helpers.models")
local fx = require("helpers.fixtures")

describe("all_logits", function()
  local path = fx.need_api_model()
  if not path then return end
  local model = ember.load { model = path, kernels = "reference", threads = 1 }
  local ids = model:tokenize(models.PROMPT)
  local P, V = #ids, model.info.n_vocab

  it("s:prefill gives every position's logits, each a prefix prefill's, the last the default result", function()
    local all = model:session { context = 64 }:prefill(ids, { all_logits = true })
    assert.are.same({ P, V }, all:shape())
    for t = 1, P do
      local prefix = model:session { context = 64 }:prefill({ table.unpack(ids, 1, t) })
      assert.is_true(prefix:compare(all:row(t)).bitwise_equal, "row " .. t)
    end
    local default = model:session { context = 64 }:prefill(ids, { all_logits = false })
    assert.are.same({ 1, V }, default:shape())
    assert.is_true(default:compare(all:row(P)).bitwise_equal)
  end)

  it("keeps the hook contract: logits hooks see the last row only, and their writes land in it", function()
    local seen = {}
    local exp = { name = "bump" }
    function exp:before_logits(_, hidden) seen[#seen + 1] = hidden:shape()[1] end
    function exp:after_logits(_, logits)
      seen[#seen + 1] = logits:shape()[1]
      logits:set(1, 1, logits:get(1, 1) + 1)
    end
    local all = model:session { context = 64 }:prefill(ids, { all_logits = true, experiment = exp })
    local hooked = model:session { context = 64 }:prefill(ids, { experiment = exp })
    assert.are.same({ 1, 1, 1, 1 }, seen)
    assert.is_true(hooked:compare(all:row(P)).bitwise_equal)
    local plain = model:session { context = 64 }:prefill(ids, { all_logits = true })
    assert.are.equal(plain:get(P, 1) + 1, all:get(P, 1))
    assert.is_true(plain:row(1):compare(all:row(1)).bitwise_equal) -- earlier rows: no hook
  end)

  it("s:decode with all_logits is its one row; the option is checked by name", function()
    local s = model:session { context = 64 }
    s:prefill(ids)
    local d = s:decode(ids[1], { all_logits = true })
    local s2 = model:session { context = 64 }
    s2:prefill(ids)
    assert.is_true(d:compare(s2:decode(ids[1])).bitwise_equal)
    local ok, err = pcall(s.prefill, s, ids, { all_logit = true })
    assert.is_false(ok)
    assert.is_truthy(err:find("unknown option 'all_logit', did you mean 'all_logits'?", 1, true), err)
  end)

  it("generate{all_logits = true} adds prompt_logits [P, n_vocab]; its last row is all_logits[1]", function()
    local out = model:generate { ids = ids, max_tokens = 3, all_logits = true }
    assert.are.same({ P, V }, out.prompt_logits:shape())
    assert.is_true(out.prompt_logits:row(P):compare(out.all_logits[1]).bitwise_equal)
    local ref = model:session { context = 64 }:prefill(ids, { all_logits = true })
    assert.is_true(ref:compare(out.prompt_logits).bitwise_equal)
    assert.is_nil(model:generate { ids = ids, max_tokens = 1 }.prompt_logits)
  end)

  teardown(function()
    model:close()
    fx.cleanup()
  end)
end)
