-- Batches change no prompt's bits: random compositions (1 to 32 prompts, short ones with one long
-- one, duplicates) through model:run_with_cache{ ids = {{...}, ...} } give, for every prompt, the
-- captured tensors and logits of the prompt alone, bit for bit, on every kernel set this CPU runs
-- and at 1, 2 and 3 threads, for every family (its tiny model). view:sequence(i) writes reach
-- only sequence i; model:batch and generate{ prompts = } keep each sequence's own results; bad
-- input is refused naming what was wrong.

local core = require("ember.core")
local ember = require("ember")
local H = require("helpers.artifacts")

local STAGES = { "after_layer", "mlp_activation", "after_logits" }

local function runnable_sets()
  local cpu, out = core.cpu(), {}
  for _, row in ipairs(core.KERNEL_SETS) do
    local runs = row.name ~= "auto"
    for _, f in ipairs(row.requires) do runs = runs and cpu[f] end
    if runs then out[#out + 1] = row.name end
  end
  return out
end

-- A composition of n prompts: lengths 1..24, one of 150, every fifth a duplicate of an earlier one.
local function compose(rng, n, n_vocab)
  local out, long = {}, rng(n)
  for i = 1, n do
    if i > 1 and rng(5) == 1 then
      out[i] = out[rng(i - 1)]
    else
      local ids = {}
      for t = 1, (i == long and 150 or rng(24)) do ids[t] = rng(n_vocab) - 1 end
      out[i] = ids
    end
  end
  return out
end

local function same(a, b) return a:compare(b).bitwise_equal end

local function assert_same_cache(solo, batched, what)
  assert.is_true(same(solo.logits, batched.logits), what .. ": logits")
  for _, st in ipairs({ "after_layer", "mlp_activation" }) do
    for _, l in ipairs(solo.layers) do
      assert.is_true(same(solo:get(st, l), batched:get(st, l)), what .. ": " .. st .. " of layer " .. l)
    end
  end
  assert.is_true(same(solo:get("after_logits"), batched:get("after_logits")), what .. ": after_logits")
end

describe("batch invariance", function()
  local sets = runnable_sets()
  local seed = 7
  local function rng(n)
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % n + 1
  end
  for _, row in ipairs(core.FAMILIES) do
    it(row.name .. ": every prompt of a batch is bit for bit the prompt alone", function()
      local path = H.tmpdir() .. "/batch-" .. row.name .. ".gguf"
      assert.is_true(ember.make_tiny_model(path, { family = row.name, dtype = "q8_0" }))
      for k, set in ipairs(sets) do
        local solo_model = ember.load { model = path, kernels = set, threads = 1 }
        local layers = { 0, solo_model.info.n_layers - 1 }
        local prompts = compose(rng, ({ 1, 6, 32 })[(k - 1) % 3 + 1], solo_model.info.n_vocab)
        local solo = {}
        for i, ids in ipairs(prompts) do
          solo[i] = solo_model:run_with_cache { ids = ids, stages = STAGES, layers = layers }
        end
        solo_model:close()
        for threads = 1, 3 do
          local m = ember.load { model = path, kernels = set, threads = threads }
          local caches, logits = m:run_with_cache { ids = prompts, stages = STAGES, layers = layers }
          assert.equal(#prompts, #caches)
          for i = 1, #prompts do
            local what = string.format("%s %s %d threads, prompt %d of %d (%d tokens)", row.name, set, threads, i,
              #prompts, #prompts[i])
            assert_same_cache(solo[i], caches[i], what)
            assert.is_true(same(logits[i], caches[i].logits), what)
          end
          m:close()
        end
      end
    end)
  end
end)

describe("model:batch", function()
  local path = H.tmpdir() .. "/batch-llama.gguf"
  local model
  setup(function()
    assert.is_true(ember.make_tiny_model(path, { family = "llama", dtype = "q8_0" }))
    model = ember.load { model = path, kernels = "reference", threads = 1 }
  end)

  it("hooks see ctx.sequences; a write through view:sequence(i) reaches sequence i only", function()
    local a, b = { 1, 2, 3, 4, 5 }, { 9, 8, 7 }
    local shift = function(v)
      local cols = v:shape()[2]
      for r = 1, v:shape()[1] do for c = 1, cols, 3 do v:set(r, c, v:get(r, c) + 0.5) end end
    end
    local seen
    local exp = { name = "one-sequence" }
    function exp:after_layer(ctx, view)
      if ctx.layer_index ~= 1 then return end
      seen = ctx.sequences
      shift(view:sequence(2))
    end
    local alone = { name = "alone" }
    function alone:after_layer(ctx, view) if ctx.layer_index == 1 then shift(view) end end
    local batch <close> = model:batch { size = 2, context = 16 }
    local out = batch:prefill({ a, b }, { experiment = exp })
    assert.are.same({ { index = 1, first_row = 1, length = 5, start_position = 0 },
      { index = 2, first_row = 6, length = 3, start_position = 0 } }, seen)
    local plain_a = model:session { context = 16 }:prefill(a)
    local plain_b = model:session { context = 16 }:prefill(b)
    local written_b = model:session { context = 16 }:prefill(b, { experiment = alone })
    assert.is_true(same(plain_a, out[1]))
    assert.is_true(same(written_b, out[2]))
    assert.is_false(same(plain_b, out[2]))
  end)

  it("decodes a subset of its sequences, each as its session alone", function()
    local batch <close> = model:batch { size = 3, context = 16 }
    batch:prefill({ { 1, 2 }, { 3 }, { 4, 5, 6 } })
    local step = batch:decode({ 7, 8 }, { sequences = { 3, 1 } })
    assert.are.same({ 3, 1, 4 }, { batch:position(1), batch:position(2), batch:position(3) })
    local s = model:session { context = 16 }
    s:prefill({ 4, 5, 6 })
    assert.is_true(same(s:decode(7), step[1]))
    assert.is_true(same(step[2], batch:logits(1)))
  end)

  it("rewinds one sequence, keeping its cache before the position: the rest evaluated again gives the same bits",
    function()
      local batch <close> = model:batch { size = 2, context = 16 }
      local first = batch:prefill({ { 1, 2, 3, 4, 5, 6 }, { 7, 8, 9 } })
      batch:rewind(1, 2)
      assert.are.same({ 2, 3 }, { batch:position(1), batch:position(2) })
      local again = batch:prefill({ { 3, 4, 5, 6 } }, { sequences = { 1 } })
      assert.is_true(same(first[1], again[1]))
      local ok, err = pcall(batch.rewind, batch, 2, 4)
      assert.is_false(ok)
      assert.matches("rewind: sequence 2: ", tostring(err), 1, true)
      ok, err = pcall(batch.rewind, batch, 3, 0)
      assert.is_false(ok)
      assert.matches("rewind: sequence 3 is outside 1..2", tostring(err), 1, true)
    end)

  it("locates a non-finite value of one sequence: its stage, layer and row within it", function()
    local batch <close> = model:batch { size = 2, context = 16 }
    local exp = { name = "nan-in-two" }
    function exp:after_attention(ctx, view)
      if ctx.layer_index == 2 then
        local two = view:sequence(2)
        two:set(two:shape()[1], 5, 0 / 0) -- its last row, so that it reaches its logits
      end
    end
    local ok, err = pcall(batch.prefill, batch, { { 1, 2, 3, 4, 5 }, { 9, 8, 7 } }, { experiment = exp })
    assert.is_false(ok)
    assert.matches("batch: sequence 2: evaluation at position 0 produced non-finite logits", tostring(err), 1, true)
    assert.matches("first non-finite value at after_attention of layer 2 (0-based token row 2, column 4 = ",
      tostring(err), 1, true)
  end)

  it("run_with_cache over several prompts with attention_pattern gives each prompt's own pattern", function()
    local prompts = { { 1, 2, 3, 4 }, { 5, 6 } }
    local caches, logits = model:run_with_cache { ids = prompts, stages = { "attention_pattern", "after_layer" } }
    for i, ids in ipairs(prompts) do
      local solo = model:run_with_cache { ids = ids, stages = { "attention_pattern", "after_layer" } }
      for l = 0, model.info.n_layers - 1 do
        assert.is_true(same(solo:get("attention_pattern", l), caches[i]:get("attention_pattern", l)))
        assert.is_true(same(solo:get("after_layer", l), caches[i]:get("after_layer", l)))
      end
      assert.are.same({ model.info.n_heads * #ids, #ids }, caches[i]:get("attention_pattern", 0):shape())
      assert.is_true(same(solo.logits, logits[i]))
    end
  end)

  it("generate{ prompts = } gives each prompt's own generation", function()
    local prompts = { { 1, 2, 3 }, { 4 }, { 5, 6, 7, 8, 9 } }
    local outs = model:generate { ids = prompts, max_tokens = 5, eos = false }
    for i, ids in ipairs(prompts) do
      local solo = model:generate { ids = ids, max_tokens = 5, eos = false }
      assert.are.same(solo.ids, outs[i].ids)
      assert.is_true(same(solo.logits, outs[i].logits))
    end
  end)

  it("refuses bad input, naming what was wrong", function()
    local batch <close> = model:batch { size = 2, context = 8 }
    local ok, err = pcall(batch.prefill, batch, { { 1 }, {} })
    assert.is_false(ok)
    assert.matches("sequence 2 is empty", err)
    ok, err = pcall(batch.prefill, batch, { { 1 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9 } })
    assert.matches("sequence 2: context is full", err)
    ok, err = pcall(batch.decode, batch, { 1 }, { sequences = { 3 } })
    assert.matches("sequence 3 is outside 1..2", err)
    ok, err = pcall(model.run_with_cache, model, { ids = { { 1 }, {} } })
    assert.matches("run_with_cache: prompt 2", err)
    local bad = { name = "bad" }
    function bad:after_layer(_, view) view:sequence(5) end
    ok, err = pcall(batch.prefill, batch, { { 1 }, { 2 } }, { experiment = bad })
    assert.matches("failed in after_layer.*sequence 5 is not in this evaluation", err)
    ok, err = pcall(model.batch, model, { size = 4096, context = 16777216 })
    assert.matches("4096 sequences of 16777216 positions need %d+ bytes", err)
    assert.equal(0, batch:position(1))
  end)
end)
