-- model:generate{session=}: a generation that continues an open session (the conversation loop of
-- `ember interactive`) gives what one generation over the whole text gives, leaves the session
-- open at the right position, does not evaluate a stopping EOS, and refuses what cannot fit.


local function join(...)
  local out = {}
  for _, t in ipairs({ ... }) do table.move(t, 1, #t, #out + 1, out) end
  return out
end

describe("generate{session=}", function()
  -- loaded on the first test that runs; a missing model makes each test pending, not passed
  local need_model = require("helpers.models").lazy_default()

  it("continues the session: the same ids and logits as one generation over everything", function()
    local model = need_model()
    if not model then return end
    local a, b = { 1, 17, 42, 9 }, { 5, 300, 7 }
    local s <close> = model:session { context = 64 }
    local o1 = model:generate { session = s, ids = a, max_tokens = 5, eos = false, temperature = 0.8, seed = 4 }
    assert.equal(#a + 5, s.position) -- every generated token evaluated, the last one too
    local o2 = model:generate { session = s, ids = b, max_tokens = 6, eos = false, temperature = 0.8, seed = 9 }
    assert.is_false(s.closed)
    assert.equal(#a + 5 + #b + 6, s.position)
    assert.equal(#b, o2.stats.prompt_tokens) -- only the new ids were prefilled
    local r1 = model:generate { ids = a, max_tokens = 5, eos = false, temperature = 0.8, seed = 4 }
    assert.same(r1.ids, o1.ids)
    local r2 = model:generate { ids = join(a, r1.ids, b), max_tokens = 6, eos = false, temperature = 0.8, seed = 9 }
    assert.same(r2.ids, o2.ids)
    assert.same(r2.logits:values(), o2.logits:values())
  end)

  it("does not evaluate a stopping EOS (without session= it still does)", function()
    local model = need_model()
    if not model then return end
    local a = { 3, 14, 15, 92 }
    local free = model:generate { ids = a, max_tokens = 4, eos = false }
    local eos = free.ids[2]
    local plain = model:generate { ids = a, max_tokens = 4, eos = eos }
    assert.equal("eos", plain.stop)
    assert.equal(2, plain.stats.decode_count)
    local s <close> = model:session { context = 16 }
    local out = model:generate { session = s, ids = a, max_tokens = 4, eos = eos }
    assert.equal("eos", out.stop)
    assert.same(plain.ids, out.ids)
    assert.equal(1, out.stats.decode_count)
    assert.equal(#a + 1, s.position) -- the first token, not the EOS
  end)

  it("gives an experiment's before_prefill the session's position", function()
    local model = need_model()
    if not model then return end
    local starts = {}
    local exp = { name = "starts" }
    function exp:before_prefill(ctx) starts[#starts + 1] = { ctx.start_position, ctx.input_token_count } end
    local s <close> = model:session { context = 32 }
    model:generate { session = s, ids = { 1, 2, 3 }, max_tokens = 2, eos = false, experiment = exp }
    model:generate { session = s, ids = { 4, 5 }, max_tokens = 2, eos = false, experiment = exp }
    assert.same({ { 0, 3 }, { 5, 2 } }, starts)
  end)

  it("refuses a session that cannot serve the run, naming the option", function()
    local model = need_model()
    if not model then return end
    local function err(opts)
      local ok, e = pcall(model.generate, model, opts)
      assert.is_false(ok)
      return e
    end
    local s <close> = model:session { context = 8 }
    assert.matches("bad argument to 'generate' (session must be an ember.Session, got table)",
      err { session = {}, ids = { 1 } }, 1, true)
    assert.matches("(context cannot be given with session=", err { session = s, ids = { 1 }, context = 8 }, 1, true)
    assert.matches("(the prompt (3 tokens) + max_tokens (6) needs 9 positions, more than the 8 the session has "
      .. "left (at position 0 of 8))", err { session = s, ids = { 1, 2, 3 }, max_tokens = 6 }, 1, true)
    assert.equal(0, s.position) -- refused before any evaluation
    local other <close> = require("ember").load { model = model.info.path }
    local t <close> = other:session { context = 8 }
    assert.matches("(session: the session belongs to another model)", err { session = t, ids = { 1 } }, 1, true)
    local closed = model:session { context = 8 }
    closed:close()
    assert.matches("(session: the session is closed)", err { session = closed, ids = { 1 } }, 1, true)
  end)
end)
