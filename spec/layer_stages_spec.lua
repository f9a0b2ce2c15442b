-- Inside the layer (../shared/fixtures/parity/README.md, "Inside the layer"): for every parity case
-- the attention_pattern, attention_heads and mlp_activation views at every layer, in prefill and in
-- the first decode step, match heads.npz (reference kernels: exact_rel; auto: llamacpp_rel), masked
-- keys are exactly 0, edits made through the views reach the output as the same edit computed from
-- the fixture's values and the stored weights outside the edited run does, and views that are only
-- read leave logits and ids bit-identical on every kernel set and thread count.

local ember = require("ember")
local npy = require("helpers.npy")
local fx = require("helpers.fixtures")

local STAGES = { "attention_pattern", "attention_heads", "mlp_activation" }

-- The cases of parity/, parity-quant/ and the project's parity-new/ (fx.all_parity_cases), as
-- { name, dir, quant }.
local function all_cases()
  local out = {}
  for _, c in ipairs(fx.all_parity_cases()) do
    out[#out + 1] = { name = c.name, dir = c.dir, quant = c.set == "parity-quant" }
  end
  return out
end

-- The README's measure for one tensor: max |got - want| / max |want| over all elements. `got` is a
-- flat Lua array (row-major), `want` an npy array of the same shape.
local function rel_error(got, want)
  local max_diff, max_ref, i = 0, 0, 0
  for r = 1, want.rows do
    local row = npy.row(want, r)
    for j = 1, #row do
      i = i + 1
      local d, a = math.abs(got[i] - row[j]), math.abs(row[j])
      if d > max_diff or d ~= d then max_diff = d end
      if a > max_ref then max_ref = a end
    end
  end
  assert(i == #got, "element count differs from the reference")
  return max_diff / max_ref
end

-- max |a - b| / max |b| of two flat arrays.
local function rel_flat(a, b)
  assert(#a == #b, "lengths differ")
  local max_diff, max_ref = 0, 0
  for i = 1, #b do
    local d, r = math.abs(a[i] - b[i]), math.abs(b[i])
    if d > max_diff or d ~= d then max_diff = d end
    if r > max_ref then max_ref = r end
  end
  return max_diff / max_ref
end

-- All values of an npy array as one flat Lua array.
local function flat(a)
  local out = {}
  for r = 1, a.rows do
    for _, v in ipairs(npy.row(a, r)) do out[#out + 1] = v end
  end
  return out
end

-- Clones of the three views at every layer: prefill of the prompt, then decoding greedy_ids[1]
-- ("decode." keys), as heads.npz names them.
local function capture(model, case)
  local got = {}
  local function exp_for(prefix)
    local exp = { name = "capture-inside" }
    for _, st in ipairs(STAGES) do
      exp[st] = function(_, ctx, v) got[prefix .. st .. "." .. ctx.layer_index] = v:clone() end
    end
    return exp
  end
  local s <close> = model:session { context = #case.prompt_ids + 1 }
  s:prefill(case.prompt_ids, { experiment = exp_for("") })
  s:decode(case.greedy_ids[1], { experiment = exp_for("decode.") })
  return got
end

-- Final prefill logits (a flat array) under an experiment, or without one.
local function prefill_logits(model, case, exp)
  local s <close> = model:session { context = #case.prompt_ids }
  return s:prefill(case.prompt_ids, exp and { experiment = exp } or nil):values()
end

-- Prefill then `steps` greedy decode steps: every step's logits hash and the ids.
local function greedy_run(model, case, exp, steps)
  local s <close> = model:session { context = #case.prompt_ids + steps + 1 }
  local opts = exp and { experiment = exp } or nil
  local logits = s:prefill(case.prompt_ids, opts)
  local hashes, ids = { logits:sha256() }, {}
  for k = 1, steps do
    ids[k] = logits:argmax() - 1
    logits = s:decode(ids[k], opts)
    hashes[#hashes + 1] = logits:sha256()
  end
  return hashes, ids
end

-- An experiment that reads every value of the three views (and touches the pattern's rows through
-- sub-views) without writing anything.
local function reader()
  local exp = { name = "read-only-inside", sum = 0 }
  for _, st in ipairs(STAGES) do
    exp[st] = function(self, _, v)
      self.sum = self.sum + v:l2_norm() + v:abs_max()
      local rows = v:shape()[1]
      self.sum = self.sum + v:row(rows):l2_norm() + v:get(1, 1)
      local c = v:clone()
      self.sum = self.sum + c:l2_norm()
    end
  end
  return exp
end

-- The kernel sets this CPU runs.
local function kernel_sets()
  local cpu = ember.cpu()
  local sets = { "reference" }
  if cpu.avx2 and cpu.fma and cpu.f16c then sets[#sets + 1] = "avx2" end
  if cpu.avx512 then sets[#sets + 1] = "avx512" end
  return sets
end

local cases = all_cases()

describe("inside the layer (heads.npz)", function()
  if #cases == 0 then
    pending("no parity fixtures under " .. fx.root .. " (set EMBER_FIXTURES)")
    return
  end
  if npy.zlib_missing then
    pending("heads.npz is deflated and " .. npy.zlib_missing)
    return
  end

  for _, c in ipairs(cases) do
    describe(c.name, function()
      for _, file in ipairs({ "case.json", "heads.npz" }) do
        if not fx.exists(c.dir .. "/" .. file) then
          pending("missing fixture " .. c.dir .. "/" .. file)
          return
        end
      end
      local case = fx.read_json(c.dir .. "/case.json")
      case.prompt_ids = fx.ints(case.prompt_ids)
      case.greedy_ids = fx.ints(case.greedy_ids)
      local tol = case.tolerance
      local P = #case.prompt_ids

      local model_path, why = fx.case_model(c.dir)
      if not model_path then
        pending(why) -- spec/parity_spec.lua fails a case whose model cannot be made
        return
      end
      local ok, ref_model = pcall(ember.load, { model = model_path, kernels = "reference" })
      if not ok then
        if c.quant then
          pending(c.name .. ": this model does not load yet: " .. tostring(ref_model))
        else
          it("loads", function() error(ref_model, 0) end)
        end
        return
      end
      local n_layers = ref_model.info.n_layers
      local want -- heads.npz, read on first use
      local function fixture()
        want = want or npy.read_npz(c.dir .. "/heads.npz")
        return want
      end

      -- Every stage key of heads.npz compared with the views, and the masks checked.
      local function check_against_fixture(got, bound, label)
        local w = fixture()
        local n = 0
        for key, ref in pairs(w) do
          if not key:match("^logit_lens") then
            local t = got[key]
            assert.is_not_nil(t, label .. ": no hook call gave " .. key)
            assert.are.same({ ref.rows, ref.cols }, t:shape(), label .. ": " .. key)
            local vals = t:values()
            local rel = rel_error(vals, ref)
            assert.is_true(rel <= bound, string.format("%s: %s rel %.3g > %.3g", label, key, rel, bound))
            if key:match("attention_pattern") then
              -- Masked keys are exactly 0: future keys (by position) and whatever the fixture
              -- masks (the gemma4 sliding window).
              local decode = key:match("^decode%.") ~= nil
              local rows_per_head = decode and 1 or P
              local i = 0
              for r = 1, ref.rows do
                local q_pos = decode and P or (r - 1) % rows_per_head
                local row = npy.row(ref, r)
                for j = 1, ref.cols do
                  i = i + 1
                  if j - 1 > q_pos or row[j] == 0 then
                    assert.is_true(vals[i] == 0, string.format("%s: %s row %d key %d is masked but holds %.9g",
                      label, key, r - 1, j - 1, vals[i]))
                  end
                end
              end
            end
            n = n + 1
          end
        end
        assert.are.equal(6 * n_layers, n, label .. ": heads.npz keys compared")
      end

      it("reference kernels: every view in prefill and the first decode step is within exact_rel", function()
        check_against_fixture(capture(ref_model, case), tol.exact_rel, "reference")
      end)

      it("auto kernels: every view is within llamacpp_rel", function()
        local fast <close> = ember.load { model = model_path, kernels = "auto" }
        check_against_fixture(capture(fast, case), tol.llamacpp_rel, "kernels=" .. fast.info.kernels)
      end)

      it("each layer calls the stages in order, with the documented shapes", function()
        local calls = {}
        local exp = { name = "order" }
        for _, st in ipairs({ "before_layer", "attention_pattern", "attention_heads", "after_attention",
          "mlp_activation", "after_mlp", "after_layer" }) do
          exp[st] = function(_, ctx, v)
            calls[#calls + 1] = { st = st, layer = ctx.layer_index, shape = v:shape(), seq = ctx.sequence_length }
          end
        end
        prefill_logits(ref_model, case, exp)
        local w = fixture()
        assert.are.equal(7 * n_layers, #calls)
        for l = 0, n_layers - 1 do
          local base = 7 * l
          local names = {}
          for k = 1, 7 do
            names[k] = calls[base + k].st
            assert.are.equal(l, calls[base + k].layer)
          end
          assert.are.same({ "before_layer", "attention_pattern", "attention_heads", "after_attention",
            "mlp_activation", "after_mlp", "after_layer" }, names)
          local pat, heads, mlp = w["attention_pattern." .. l], w["attention_heads." .. l], w["mlp_activation." .. l]
          assert.are.same({ pat.rows, P }, calls[base + 2].shape)
          assert.are.equal(P, calls[base + 2].seq)
          assert.are.same({ P, heads.cols }, calls[base + 3].shape)
          assert.are.same({ P, mlp.cols }, calls[base + 5].shape)
        end
      end)

      -- Interventions on the reference path: the edit made through the view (run A) and the same
      -- edit applied to the fixture's exact values, written into a later view (run B), give the same
      -- final prefill logits within exact_rel; and the edit does change them.
      -- The edits' expectations are built outside the engine's edited run: from the fixture's
      -- values (heads.npz, boundaries.npz) and the stored weights (model:weight W_O, W_down), the
      -- change of the stage right after the edited one is computed in Lua (these projections are
      -- linear, so the delta is W times the change; a bias cancels). Where a norm follows each
      -- projection (the post-norms of the Gemma block and OLMo 2), the edited values are handed to
      -- the engine at the edited stage.
      local post_norm = pcall(ref_model.weight, ref_model, "blk.0.post_attention_norm")
      local linear = not post_norm and fx.exists(c.dir .. "/boundaries.npz")
      local bounds
      local function boundaries()
        bounds = bounds or npy.read_npz(c.dir .. "/boundaries.npz")
        return bounds
      end
      -- the npy array as an ember.Tensor
      local function tensor_of(a) return ember.tensor(a.rows, a.cols, flat(a)) end
      -- (edited - original) of a stage's values, [P, cols], times W ([n_out, cols]) transposed:
      -- the change it makes to the projection's output
      local function projected_delta(expect, original, weight)
        local d = {}
        for k = 1, #expect do d[k] = expect[k] - original[k] end
        return ember.tensor(P, #expect // P, d):matmul_t(ref_model:weight(weight))
      end

      describe("interventions", function()
        local base_logits
        local function unedited()
          base_logits = base_logits or prefill_logits(ref_model, case)
          return base_logits
        end
        -- The prefill logits an edit of layer l's attention_heads (from `original` to `expect`,
        -- flat [P, cols]) must give, made without the edit: where the O projection is linear, its
        -- output at after_attention moved by W_O times the change; else the heads set to `expect`.
        local function expected_heads_run(l, expect, original, name)
          local exp = { name = name }
          if linear then
            local target = tensor_of(boundaries()["after_attention." .. l])
              + projected_delta(expect, original, "blk." .. l .. ".attn_output")
            exp.after_attention = function(_, ctx, v) if ctx.layer_index == l then v:copy_from(target) end end
          else
            local target = ember.tensor(P, #expect // P, expect)
            exp.attention_heads = function(_, ctx, v) if ctx.layer_index == l then v:copy_from(target) end end
          end
          return prefill_logits(ref_model, case, exp)
        end
        local function assert_same_edit(a, b, what)
          local rel = rel_flat(a, b)
          assert.is_true(rel <= tol.exact_rel, string.format("%s: rel %.3g > exact_rel %.3g", what, rel, tol.exact_rel))
          assert.is_true(rel_flat(a, unedited()) > tol.exact_rel, what .. ": the edit did not change the logits")
        end

        it("zeroing key 0 of layer 0's pattern for every head mixes V without it (no renormalisation)", function()
          local w = fixture()
          local p, z = w["attention_pattern.0"], w["attention_heads.0"]
          local H = p.rows // P
          local D = z.cols // H
          -- Query 0 sees key 0 alone (probability 1), so row 0 of the heads is key 0's value
          -- vector of each head; removing key 0 subtracts p[h*P+i, 0] times it.
          local zf, v0 = flat(z), npy.row(z, 1)
          local expect = {}
          for i = 0, P - 1 do
            for h = 0, H - 1 do
              local p0 = npy.row(p, h * P + i + 1)[1]
              for d = 0, D - 1 do
                local k = i * z.cols + h * D + d + 1
                expect[k] = zf[k] - p0 * v0[h * D + d + 1]
              end
            end
          end
          local seen
          local a = prefill_logits(ref_model, case, {
            name = "knockout",
            attention_pattern = function(_, ctx, v)
              if ctx.layer_index == 0 then
                for r = 1, v:shape()[1] do v:set(r, 1, 0) end
              end
            end,
            attention_heads = function(_, ctx, v) if ctx.layer_index == 0 then seen = v:clone() end end,
          })
          local rel = rel_flat(seen:values(), expect)
          assert.is_true(rel <= tol.exact_rel, string.format("layer 0 heads after the knockout: rel %.3g", rel))
          assert_same_edit(a, expected_heads_run(0, expect, zf, "knockout-expected"), "pattern knockout")
        end)

        it("zeroing head 1 at layer 1 in attention_heads ablates that head", function()
          if n_layers < 2 then return pending("needs two layers") end
          local w = fixture()
          local z = w["attention_heads.1"]
          local H = w["attention_pattern.1"].rows // P
          local D = z.cols // H
          local original = flat(z)
          local expect = flat(z)
          for i = 0, P - 1 do
            for d = D, 2 * D - 1 do expect[i * z.cols + d + 1] = 0 end
          end
          local a = prefill_logits(ref_model, case, {
            name = "head-ablation",
            attention_heads = function(_, ctx, v)
              if ctx.layer_index == 1 then
                for r = 1, P do
                  for col = D + 1, 2 * D do v:set(r, col, 0) end
                end
              end
            end,
          })
          -- without head 1 the O projection loses W_O[:, head 1 columns] times that head's values
          assert_same_edit(a, expected_heads_run(1, expect, original, "head-ablation-expected"), "head 1 ablation")
        end)

        it("zeroing the first half of the last layer's mlp_activation silences those neurons", function()
          local last = n_layers - 1
          local act = fixture()["mlp_activation." .. last]
          local half = act.cols // 2
          local original = flat(act)
          local expect = flat(act)
          for i = 0, P - 1 do
            for j = 0, half - 1 do expect[i * act.cols + j + 1] = 0 end
          end
          local a = prefill_logits(ref_model, case, {
            name = "neuron-ablation",
            mlp_activation = function(_, ctx, v)
              if ctx.layer_index == last then
                for r = 1, P do
                  for col = 1, half do v:set(r, col, 0) end
                end
              end
            end,
          })
          local b
          -- an MoE layer's activation slots reach the output through each row's own experts and
          -- weights, not one W_down: that case sets the stage to the expected values instead
          if linear and not ref_model.info.family:match("moe$") then
            -- no engine run at all: the last layer's output loses W_down times the silenced
            -- neurons, and the logits are the logit lens of that (model:unembed: final norm, LM head)
            local resid = tensor_of(boundaries()["after_layer." .. last])
              + projected_delta(expect, original, "blk." .. last .. ".ffn_down")
            b = ref_model:unembed(resid:slice(P, P)):values()
          else
            local target = ember.tensor(P, act.cols, expect)
            b = prefill_logits(ref_model, case, {
              name = "neuron-ablation-expected",
              mlp_activation = function(_, ctx, v) if ctx.layer_index == last then v:copy_from(target) end end,
            })
          end
          assert_same_edit(a, b, "neuron ablation")
        end)
      end)

      it("read-only hooks on the three stages leave logits and ids bit-identical (every kernel set, 1 and 2 threads)",
        function()
          for _, k in ipairs(kernel_sets()) do
            for _, threads in ipairs({ 1, 2 }) do
              local m <close> = ember.load { model = model_path, kernels = k, threads = threads }
              local h0, ids0 = greedy_run(m, case, nil, 4)
              local exp = reader()
              local h1, ids1 = greedy_run(m, case, exp, 4)
              local label = string.format("kernels=%s threads=%d", k, threads)
              assert.is_true(exp.sum ~= 0, label .. ": the reader saw nothing")
              assert.are.same(ids0, ids1, label .. ": ids")
              assert.are.same(h0, h1, label .. ": logits")
            end
          end
        end)
    end)
  end
end)
