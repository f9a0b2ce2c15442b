-- Parity with the frozen outside references (../shared/fixtures/parity and, for the 4- to 6-bit
-- weight types, ../shared/fixtures/parity-quant; see the parity README; and the project's own
-- tests/fixtures/parity-new, whose models are made again from their generator's arguments): for each case, ember's
-- reference kernels must reproduce the exact float64 forward pass within exact_rel and llama.cpp
-- within llamacpp_rel, prefill and every teacher-forced decode step; greedy generation must
-- reproduce llama.cpp's ids where the case requires it; runs are bit-identical.

local ember = require("ember")
local npy = require("helpers.npy")
local fx = require("helpers.fixtures")

-- Families ember must run (the engine's family table): a case of one of these that does not load
-- fails; a case of a family outside the table (a fixture added before its family) is pending.
local REQUIRED = require("ember.core").FAMILIES

-- rel = max over rows and columns |ember - ref| / max over the same |ref| (the README's measure).
local function rel_error(rows_ember, ref, first_row)
  local max_diff, max_ref = 0, 0
  for k, got in ipairs(rows_ember) do
    local want = npy.row(ref, first_row + k - 1)
    local g = got:values()
    assert(#g == #want, "row width differs from the reference")
    for j = 1, #want do
      local d, r = math.abs(g[j] - want[j]), math.abs(want[j])
      if d > max_diff or d ~= d then max_diff = d end
      if r > max_ref then max_ref = r end
    end
  end
  return max_diff / max_ref
end

local function argmax(values)
  local best, bi = -math.huge, 1
  for i, v in ipairs(values) do
    if v > best then best, bi = v, i end
  end
  return bi
end

-- Prefill of prompt_ids then teacher-forced decode of every greedy id: one logits row each.
local function teacher_forced(model, case)
  local s <close> = model:session { context = #case.prompt_ids + #case.greedy_ids + 1 }
  local rows = { s:prefill(case.prompt_ids) }
  for _, id in ipairs(case.greedy_ids) do rows[#rows + 1] = s:decode(id) end
  return rows
end

-- The ggml type names of case.json's tensor_types ("q4_K", "f32", ...) that are 2-D weights.
local function quant_types(case)
  local out = {}
  for t in pairs(case.tensor_types or {}) do
    if t ~= "f32" then out[#out + 1] = t end
  end
  table.sort(out)
  return out
end

local by_set = {}
for _, c in ipairs(fx.all_parity_cases()) do
  by_set[c.set] = by_set[c.set] or {}
  table.insert(by_set[c.set], c)
end

for _, folder in ipairs({ "parity", "parity-quant", "parity-new" }) do
  local cases = by_set[folder] or {}

  describe(folder .. " fixtures", function()
    if #cases == 0 then
      pending("no parity fixtures in " .. folder .. " (set EMBER_FIXTURES)")
      return
    end

    for _, c in ipairs(cases) do
      local cdir, name = c.dir, c.name
      describe(name, function()
        local needed = { "case.json", "exact_logits.npy", "llamacpp_logits.npy" }
        for _, file in ipairs(needed) do
          if not fx.exists(cdir .. "/" .. file) then
            pending("missing fixture " .. cdir .. "/" .. file)
            return
          end
        end
        local case = fx.read_json(cdir .. "/case.json")
        case.prompt_ids = fx.ints(case.prompt_ids)
        case.greedy_ids = fx.ints(case.greedy_ids)
        local tol = case.tolerance
        local model_path, why = fx.case_model(cdir)
        if not model_path then
          if case.make_tiny_model then it("makes its model", function() error(why, 0) end) else pending(why) end
          return
        end

        local ok, model = pcall(ember.load, { model = model_path, kernels = "reference" })
        if not ok then
          if REQUIRED[case.family] then
            it("loads", function() error(model, 0) end)
          else
            pending(case.family .. " is not supported yet: " .. tostring(model))
          end
          return
        end

        local P = #case.prompt_ids
        local rows, exact, llamacpp -- computed once, on first use
        local function compute()
          if not rows then
            rows = teacher_forced(model, case)
            exact = npy.read(cdir .. "/exact_logits.npy")
            llamacpp = npy.read(cdir .. "/llamacpp_logits.npy")
          end
        end

        it("loads as family " .. case.family .. " with the case's vocabulary", function()
          assert.are.equal(case.family, model.info.family)
          assert.are.equal(math.tointeger(case.n_vocab), model.info.n_vocab)
        end)

        if case.tensor_types then
          it("loads the file's mix of weight types as it is (" .. table.concat(quant_types(case), ", ") .. ")",
            function()
            local have = {}
            for t in model.info.dtype_summary:gmatch("[^+]+") do have[t] = true end
            for _, t in ipairs(quant_types(case)) do
              assert.is_true(have[t], t .. " missing from dtype_summary " .. model.info.dtype_summary)
            end
          end)
        end

        it("prefill and teacher-forced decode are within exact_rel of the exact reference", function()
          compute()
          assert.are.equal(P + #case.greedy_ids, exact.rows)
          local rel = rel_error(rows, exact, P)
          assert.is_true(rel <= tol.exact_rel,
            string.format("rel %.3g > exact_rel %.3g over rows %d..%d", rel, tol.exact_rel, P - 1, exact.rows - 1))
        end)

        it("prefill and teacher-forced decode are within llamacpp_rel of llama.cpp", function()
          compute()
          local rel = rel_error(rows, llamacpp, P)
          assert.is_true(rel <= tol.llamacpp_rel,
            string.format("rel %.3g > llamacpp_rel %.3g", rel, tol.llamacpp_rel))
        end)

        it("prefill argmax equals the exact reference's", function()
          compute()
          assert.are.equal(argmax(npy.row(exact, P)), rows[1]:argmax())
        end)

        -- Where the exact reference's top two logits are further apart than twice ember's largest
        -- deviation from it, rounding cannot swap them: ember's argmax must be the exact one there.
        it("teacher-forced argmax equals the exact reference's on every row it cannot be a tie", function()
          compute()
          local decided, max_diff = 0, 0
          for k, got in ipairs(rows) do
            local want, g = npy.row(exact, P + k - 1), got:values()
            for j = 1, #want do max_diff = math.max(max_diff, math.abs(g[j] - want[j])) end
          end
          for k, got in ipairs(rows) do
            local want = npy.row(exact, P + k - 1)
            local best, second = -math.huge, -math.huge
            for _, v in ipairs(want) do
              if v > best then best, second = v, best elseif v > second then second = v end
            end
            if best - second > 2 * max_diff then
              decided = decided + 1
              assert.are.equal(argmax(want), got:argmax(), "row " .. (P + k - 1))
            end
          end
          assert.is_true(decided > #rows / 2, decided .. " of " .. #rows .. " rows decided")
        end)

        if tol.greedy_ids_must_match then
          it("greedy generation reproduces llama.cpp's greedy_ids", function()
            local out = model:generate { ids = case.prompt_ids, max_tokens = #case.greedy_ids, eos = false }
            assert.are.same(case.greedy_ids, out.ids)
          end)
        else
          pending("greedy ids: the two references disagree on a near-tie in this case (greedy_ids_must_match=false)")
        end

        it("gives bit-identical logits on a second run", function()
          compute()
          local again = teacher_forced(model, case)
          for k = 1, #rows do assert.are.equal(rows[k]:sha256(), again[k]:sha256()) end
        end)

        it("hook views during prefill match boundaries.npz within exact_rel", function()
          local path = cdir .. "/boundaries.npz"
          if not fx.exists(path) then
            pending("missing fixture " .. path)
            return
          end
          local want = npy.read_npz(path)
          local got, exp = {}, { name = "boundaries" }
          for _, stage in ipairs({ "before_layer", "after_attention", "after_mlp", "after_layer" }) do
            exp[stage] = function(_, ctx, v) got[stage .. "." .. ctx.layer_index] = v:clone() end
          end
          exp.before_logits = function(_, _, v) got.before_logits = v:clone() end
          exp.after_logits = function(_, _, v) got.after_logits = v:clone() end
          local s <close> = model:session { context = P }
          s:prefill(case.prompt_ids, { experiment = exp })
          local n = 0
          for key, ref in pairs(want) do
            local t = got[key]
            assert.is_not_nil(t, "no hook call gave " .. key)
            assert.are.same({ ref.rows, ref.cols }, t:shape(), key)
            local rows = {}
            for r = 1, ref.rows do rows[r] = t:row(r) end
            local rel = rel_error(rows, ref, 1)
            assert.is_true(rel <= tol.exact_rel,
              string.format("%s: rel %.3g > exact_rel %.3g", key, rel, tol.exact_rel))
            n = n + 1
          end
          assert.are.equal(4 * model.info.n_layers + 2, n)
        end)

        it("auto kernels stay within llamacpp_rel of both references", function()
          compute()
          local fast = ember.load { model = model_path, kernels = "auto" }
          local frows = teacher_forced(fast, case)
          local kernels = fast.info.kernels
          fast:close()
          local re, rl = rel_error(frows, exact, P), rel_error(frows, llamacpp, P)
          assert.is_true(re <= tol.llamacpp_rel and rl <= tol.llamacpp_rel,
            string.format("kernels=%s: rel vs exact %.3g, vs llama.cpp %.3g, bound %.3g",
              kernels, re, rl, tol.llamacpp_rel))
        end)
      end)
    end
  end)
end
