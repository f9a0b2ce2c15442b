-- model:run_with_cache (lib/ember/model/cache.lua): the cached activations match boundaries.npz, the
-- all-position logits match exact_logits.npy and their last row is the session's logits bit for
-- bit; only what was asked for is kept; bad stages, layers and options are clear errors.

local ember = require("ember")
local npy = require("helpers.npy")
local fx = require("helpers.fixtures")
local selectors = require("ember.run.selectors")

-- max|got - ref| / max|ref| over rows first_row.. of ref (1-based) against the rows of got.
local function rel_rows(got, ref, first_row)
  local md, mr = 0, 0
  local rows = got:shape()[1]
  for r = 1, rows do
    local g, want = got:row(r):values(), npy.row(ref, first_row + r - 1)
    assert(#g == #want, "row width differs from the reference")
    for j = 1, #want do
      local d = math.abs(g[j] - want[j])
      if d > md or d ~= d then md = d end
      if math.abs(want[j]) > mr then mr = math.abs(want[j]) end
    end
  end
  return md / mr
end

local function keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

local cases, dir = fx.parity_cases()

describe("model:run_with_cache on the parity cases", function()
  if #cases == 0 then
    pending("no parity fixtures: missing " .. dir .. " (set EMBER_FIXTURES)")
    return
  end
  for _, name in ipairs(cases) do
    local cdir = dir .. "/" .. name
    describe(name, function()
      if not fx.exists(cdir .. "/boundaries.npz") then
        pending("missing fixture " .. cdir .. "/boundaries.npz")
        return
      end
      local case = fx.read_json(cdir .. "/case.json")
      local tol = case.tolerance
      local ids = fx.ints(case.prompt_ids)
      local P = #ids
      local ref = ember.load { model = cdir .. "/model.gguf", kernels = "reference" }
      local n_layers = ref.info.n_layers

      it("caches what the hooks see (boundaries.npz) and every position's logits (exact_logits.npy)", function()
        local cache = ref:run_with_cache { ids = ids, stages = { "before_layer", "after_layer", "before_logits" },
          all_logits = true }
        local want = npy.read_npz(cdir .. "/boundaries.npz")
        for l = 0, n_layers - 1 do
          for _, stage in ipairs({ "before_layer", "after_layer" }) do
            local t = cache[stage][l]
            assert.are.same({ P, ref.info.hidden_size }, t:shape(), stage .. "." .. l)
            local r = rel_rows(t, want[stage .. "." .. l], 1)
            assert.is_true(r <= tol.exact_rel, string.format("%s.%d: rel %.3g", stage, l, r))
          end
        end
        assert.is_true(rel_rows(cache.before_logits, want.before_logits, 1) <= tol.exact_rel)
        assert.are.same({ P, case.n_vocab }, cache.logits:shape())
        local r = rel_rows(cache.logits, npy.read(cdir .. "/exact_logits.npy"), 1)
        assert.is_true(r <= tol.exact_rel, string.format("all_logits vs exact_logits rows 0..%d: rel %.3g", P - 1, r))
      end)

      for _, which in ipairs({ "reference", "default" }) do
        it("keeps the session's logits bit for bit, with and without all_logits (" .. which .. " kernels)", function()
          local m = which == "reference" and ref or ember.load { model = cdir .. "/model.gguf" }
          local s <close> = m:session { context = P }
          local plain = s:prefill(ids)
          local all = m:run_with_cache { ids = ids, stages = { "after_logits" }, all_logits = true }
          assert.are.equal(plain:sha256(), all.logits:row(P):sha256())
          assert.are.equal(plain:sha256(), all.after_logits:sha256())
          local last = m:run_with_cache { ids = ids, stages = {} }
          assert.are.same({ 1, case.n_vocab }, last.logits:shape())
          assert.are.equal(plain:sha256(), last.logits:sha256())
        end)
      end
    end)
  end
end)

describe("model:run_with_cache options", function()
  local m, why = fx.api_model_loaded()
  if not m then
    pending(why)
    return
  end
  local n_layers = m.info.n_layers
  local ids = { 1, 5, 9, 2 }

  it("keeps only the stages and layers asked for", function()
    local cache = m:run_with_cache { ids = ids, stages = { "after_mlp" }, layers = { n_layers - 1 } }
    assert.are.same({ n_layers - 1 }, keys(cache.after_mlp))
    for _, stage in ipairs(selectors.STAGES) do
      if stage ~= "after_mlp" then assert.is_nil(cache[stage], stage) end
    end
    assert.are.same({ 1, m.info.n_vocab }, cache.logits:shape())
    assert.are.same({ n_layers - 1 }, cache.layers)
  end)

  it("defaults to every stage at every layer, cached tensors owned (they outlive the pass)", function()
    local cache = m:run_with_cache { ids = ids }
    collectgarbage()
    collectgarbage()
    for _, stage in ipairs(selectors.LAYER_STAGES) do
      if selectors.FAMILY_STAGES[stage] then -- moe_router: MoE models only, and then named
        assert.is_nil(cache[stage], stage)
      else
        assert.are.equal(n_layers, #keys(cache[stage]), stage)
        -- one row per token; the attention pattern has one block of rows per head
        local per_token = stage == "attention_pattern" and m.info.n_heads or 1
        assert.are.equal(per_token * #ids, cache[stage][0]:shape()[1], stage)
        assert.are.equal(getmetatable(cache[stage][0]).__name, "ember.Tensor")
      end
    end
    assert.are.same({ 1, m.info.hidden_size }, cache.before_logits:shape())
    assert.are.same({ 1, m.info.n_vocab }, cache.after_logits:shape())
  end)

  it("gives the same cache for prompt= as for the prompt's ids", function()
    if not ember.has_tokenizer then
      pending("this build has no tokenizer support")
      return
    end
    local ok, toks = pcall(m.tokenize, m, "hello there")
    if not ok then
      pending("the API model has no tokenizer: " .. tostring(toks))
      return
    end
    local a = m:run_with_cache { prompt = "hello there", stages = { "after_layer" }, layers = { 0 } }
    local b = m:run_with_cache { ids = toks, stages = { "after_layer" }, layers = { 0 } }
    assert.are.equal(a.after_layer[0]:sha256(), b.after_layer[0]:sha256())
    assert.are.same(toks, a.ids)
  end)

  it("raises clear errors for unknown stages, layers out of range and bad options", function()
    local function err_of(opts)
      local ok, err = pcall(m.run_with_cache, m, opts)
      assert.is_false(ok)
      return err
    end
    assert.matches("run_with_cache: unknown stage 'after_mpl'", err_of { ids = ids, stages = { "after_mpl" } }, 1, true)
    assert.matches("run_with_cache: layer " .. n_layers .. " out of range 0.." .. (n_layers - 1),
      err_of { ids = ids, layers = { n_layers } }, 1, true)
    assert.matches("run_with_cache: layer -1 out of range", err_of { ids = ids, layers = { -1 } }, 1, true)
    assert.matches("run_with_cache: unknown option 'stage'", err_of { ids = ids, stage = { "after_mlp" } }, 1, true)
    assert.matches("give exactly one of ids= (token ids) or prompt= (text)", err_of { stages = {} }, 1, true)
    assert.matches("give exactly one of", err_of { ids = ids, prompt = "x" }, 1, true)
    assert.matches("ids must be a non-empty table", err_of { ids = {} }, 1, true)
    assert.is_nil(err_of { ids = ids, stages = { "nope" } }:match("%.lua:%d+"), "no library position in the message")
  end)
end)
