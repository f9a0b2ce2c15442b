-- The logit lens and the model's weights, against the outside references: model:unembed of each
-- layer's after_layer (boundaries.npz) matches logit_lens.N (heads.npz) on the reference path and on
-- the default kernels; the last layer's live view gives the run's own logits bit for bit;
-- model:weight returns the file's values (read here with an independent GGUF reader; f32 and q8_0)
-- and, times a normed hidden vector, reproduces the unembedding (every f32 and quantized case).

local ember = require("ember")
local npy = require("helpers.npy")
local fx = require("helpers.fixtures")
local gguf = require("helpers.gguf")

-- max|got - want| / max|want| over one row (the parity README's measure).
local function rel(got, want)
  local g = got:values()
  assert(#g == #want, "width " .. #g .. " differs from the reference's " .. #want)
  local md, mr = 0, 0
  for j = 1, #want do
    local d = math.abs(g[j] - want[j])
    if d > md or d ~= d then md = d end
    if math.abs(want[j]) > mr then mr = math.abs(want[j]) end
  end
  return md / mr
end

-- Row i (1-based) of an npy array as a [1, cols] Tensor.
local function row_tensor(a, i) return ember.tensor_from_bytes(npy.row_bytes(a, i), 1, a.cols) end

-- Every case folder of the visible parity sets; the quantized set only where its types load.
local function all_cases()
  local out = {}
  for _, set in ipairs({ "parity", "parity-quant" }) do
    local dir = fx.root .. "/" .. set
    local p = io.popen("ls -1 " .. require("ember.store.fs").shell_quote(dir) .. " 2>/dev/null")
    for name in p:lines() do
      if fx.exists(dir .. "/" .. name .. "/case.json") then
        out[#out + 1] = { set = set, name = name, dir = dir .. "/" .. name }
      end
    end
    p:close()
  end
  table.sort(out, function(a, b) return a.dir < b.dir end)
  return out
end

local cases = all_cases()

describe("model:unembed (logit lens)", function()
  if #cases == 0 then
    pending("no parity fixtures under " .. fx.root .. " (set EMBER_FIXTURES)")
    return
  end
  if npy.zlib_missing then
    pending("heads.npz is deflate-compressed and " .. npy.zlib_missing .. "; ./run.sh test installs it")
    return
  end

  for _, c in ipairs(cases) do
    describe(c.set .. "/" .. c.name, function()
      for _, f in ipairs({ "model.gguf", "boundaries.npz", "heads.npz" }) do
        if not fx.exists(c.dir .. "/" .. f) then
          pending("missing fixture " .. c.dir .. "/" .. f)
          return
        end
      end
      local case = fx.read_json(c.dir .. "/case.json")
      local tol = case.tolerance
      local ids = fx.ints(case.prompt_ids)
      local P = #ids
      local ok, ref = pcall(ember.load, { model = c.dir .. "/model.gguf", kernels = "reference" })
      if not ok then
        if c.set == "parity-quant" then
          pending("this case's weight types do not load yet: " .. tostring(ref))
        else
          it("loads", function() error(ref, 0) end)
        end
        return
      end
      local fast = ember.load { model = c.dir .. "/model.gguf" }
      local bounds, heads
      local function fixtures()
        if not bounds then
          bounds = npy.read_npz(c.dir .. "/boundaries.npz")
          heads = npy.read_npz(c.dir .. "/heads.npz")
        end
      end

      local function check_lens(model, bound, what)
        fixtures()
        local worst, at = 0, -1
        for l = 0, model.info.n_layers - 1 do
          local x = bounds["after_layer." .. l]
          local lens = heads["logit_lens." .. l]
          assert.is_not_nil(x, "boundaries.npz has no after_layer." .. l)
          assert.is_not_nil(lens, "heads.npz has no logit_lens." .. l)
          local got = model:unembed(row_tensor(x, P))
          assert.are.same({ 1, case.n_vocab }, got:shape())
          local r = rel(got, npy.row(lens, 1))
          if r > worst or r ~= r then worst, at = r, l end
        end
        assert.is_true(worst <= bound,
          string.format("%s: rel %.3g at layer %d > %.3g", what, worst, at, bound))
      end

      it("matches logit_lens.N at every layer within exact_rel (reference kernels)", function()
        check_lens(ref, tol.exact_rel, "reference")
      end)

      it("matches logit_lens.N at every layer within llamacpp_rel (default kernels)", function()
        check_lens(fast, tol.llamacpp_rel, "kernels=" .. fast.info.kernels)
      end)

      -- Inside the last layer's after_layer hook, on the live view: every row is unembedded, and
      -- the last row must be the logits the same pass then produces, on both kernel sets.
      for _, which in ipairs({ "reference", "default" }) do
        it("of the last layer's live view gives the run's logits bit for bit (" .. which .. " kernels)", function()
          local model = which == "reference" and ref or fast
          local last, lens = model.info.n_layers - 1, nil
          local exp = { name = "live-lens" }
          function exp.after_layer(_, ctx, v)
            if ctx.layer_index == last then lens = model:unembed(v) end
          end
          local s <close> = model:session { context = P }
          local logits = s:prefill(ids, { experiment = exp })
          assert.are.same({ P, case.n_vocab }, lens:shape())
          assert.are.equal(logits:sha256(), lens:row(P):sha256())
          -- one row alone and in a batch give the same values
          local s2 <close> = model:session { context = P }
          local alone
          s2:prefill(ids, { experiment = { name = "one-row", after_layer = function(_, ctx, v)
            if ctx.layer_index == last then alone = model:unembed(v:row(P)) end
          end } })
          assert.are.equal(logits:sha256(), alone:sha256())
        end)
      end
    end)
  end
end)

describe("model:unembed arguments", function()
  local m, why = fx.api_model_loaded()
  if not m then
    pending(why)
    return
  end

  it("refuses a residual of the wrong width, naming both widths", function()
    local d = m.info.hidden_size
    local ok, err = pcall(m.unembed, m, ember.tensor(2, d + 1))
    assert.is_false(ok)
    assert.matches("unembed: expected a %[rows, " .. d .. "%] residual", err)
    assert.matches("got %[2, " .. (d + 1) .. "%]", err)
  end)

  it("refuses what is not a tensor and an expired view", function()
    assert.has_error(function() m:unembed({ 1, 2, 3 }) end)
    local kept
    local s <close> = m:session {}
    s:prefill({ 1, 2 }, { experiment = { name = "keep", before_logits = function(_, _, v) kept = v end } })
    local ok, err = pcall(m.unembed, m, kept)
    assert.is_false(ok)
    assert.matches("expired view", err)
  end)

  it("calls no hook and leaves a session's logits alone", function()
    local s <close> = m:session {}
    local before = s:prefill({ 1, 2, 3 }):sha256()
    m:unembed(ember.tensor(3, m.info.hidden_size))
    assert.are.equal(before, s:logits():sha256())
  end)
end)

-- The weights of the f32 cases are stored as they are used, so the file's bytes are the expectation;
-- the quantized cases (whose blocks this spec does not decode) check the product with the unembedding.
local weight_cases = {}
for _, c in ipairs(cases) do
  c.f32 = c.set == "parity" and c.name:match("%-f32$") ~= nil
  if c.f32 or c.set == "parity-quant" then weight_cases[#weight_cases + 1] = c end
end

describe("model:weight", function()
  if #weight_cases == 0 then
    pending("no f32 or quantized parity fixtures under " .. fx.root)
    return
  end
  for _, c in ipairs(weight_cases) do
    describe(c.set .. "/" .. c.name, function()
      local ok, m = pcall(ember.load, { model = c.dir .. "/model.gguf", kernels = "reference" })
      if not ok then
        pending("this case's weight types do not load yet: " .. tostring(m))
        return
      end
      local file = gguf.open(c.dir .. "/model.gguf")
      local arch = file.meta["general.architecture"]

      it("returns a stored matrix with or without '.weight', in the file's shape", function()
        local w = m:weight("blk.0.attn_output")
        local t = file.tensors["blk.0.attn_output.weight"]
        assert.are.same({ t.dims[2], t.dims[1] }, w:shape())
        assert.are.equal(w:sha256(), m:weight("blk.0.attn_output.weight"):sha256())
      end)

      if c.f32 then
        it("returns a stored f32 matrix row for row as the file holds it", function()
          local w = m:weight("blk.0.attn_output")
          local t = file.tensors["blk.0.attn_output.weight"]
          for _, r in ipairs({ 0, t.dims[2] // 2, t.dims[2] - 1 }) do
            assert.are.same(file:row("blk.0.attn_output.weight", r), w:row(r + 1):values())
          end
        end)
      end

      it("returns a vector as one row", function()
        local v = m:weight("output_norm")
        assert.are.same({ 1, m.info.hidden_size }, v:shape())
        assert.are.same(file:row("output_norm.weight", 0), v:values())
      end)

      it("names an unknown tensor and the file", function()
        local ok, err = pcall(m.weight, m, "blk.99.attn_output")
        assert.is_false(ok)
        assert.matches("no tensor 'blk.99.attn_output'", err, 1, true)
        assert.matches("model.gguf", err, 1, true)
      end)

      -- W_U times the final-normed hidden vector (norm computed here in plain Lua), plus the
      -- family's softcap, is the unembedding of that vector.
      it("W_U times the normed hidden vector equals model:unembed of the vector", function()
        local d = m.info.hidden_size
        local x = {}
        for i = 1, d do x[i] = math.sin(i * 0.37) * 2 + 0.1 end
        local nw = m:weight("output_norm"):values()
        local xn = {}
        if arch == "gpt2" then
          local nb = m:weight("output_norm.bias"):values()
          local eps = file.meta["gpt2.attention.layer_norm_epsilon"] or 1e-5
          local mean, var = 0, 0
          for i = 1, d do mean = mean + x[i] / d end
          for i = 1, d do var = var + (x[i] - mean) ^ 2 / d end
          for i = 1, d do xn[i] = (x[i] - mean) / math.sqrt(var + eps) * nw[i] + nb[i] end
        else
          local eps = file.meta[arch .. ".attention.layer_norm_rms_epsilon"] or 1e-5
          local ss = 0
          for i = 1, d do ss = ss + x[i] * x[i] / d end
          for i = 1, d do xn[i] = x[i] / math.sqrt(ss + eps) * nw[i] end
        end
        local ok, wu = pcall(m.weight, m, "output")
        if not ok then wu = m:weight("token_embd") end -- tied head
        local want = ember.tensor(1, d, xn):matmul_t(wu):values()
        local cap = file.meta[arch .. ".final_logit_softcapping"]
        if cap and cap > 0 then
          for i = 1, #want do want[i] = cap * math.tanh(want[i] / cap) end
        end
        local got = m:unembed(ember.tensor(1, d, x))
        assert.is_true(rel(got, want) <= 1e-5, "rel " .. rel(got, want))
      end)
    end)
  end

  it("is not reachable from hook contexts", function()
    local path, why = fx.api_model()
    if not path then
      pending(why)
      return
    end
    local m = ember.load { model = path, kernels = "reference" }
    local seen = {}
    local exp = { name = "no-weights" }
    function exp.after_layer(_, ctx)
      seen[#seen + 1] = { ctx.weight, ctx.model.weight, ctx.model.unembed }
    end
    local s <close> = m:session {}
    s:prefill({ 1, 2 }, { experiment = exp })
    assert.are.equal(m.info.n_layers, #seen)
    for _, v in ipairs(seen) do assert.are.same({}, v) end
  end)

  it("dequantizes q8_0 weights to the file's block values", function()
    local dir = fx.root .. "/parity/llama-tiny-q8_0"
    if not fx.exists(dir .. "/model.gguf") then
      pending("missing fixture " .. dir .. "/model.gguf")
      return
    end
    local m = ember.load { model = dir .. "/model.gguf", kernels = "reference" }
    local file = gguf.open(dir .. "/model.gguf")
    local name = "blk.1.ffn_down.weight"
    assert.are.equal(8, file.tensors[name].type)
    local w = m:weight(name)
    for _, r in ipairs({ 0, file:rows(name) - 1 }) do assert.are.same(file:row(name, r), w:row(r + 1):values()) end
    -- the default kernels may repack the weights at load; weight() still gives the stored values
    local fast = ember.load { model = dir .. "/model.gguf" }
    assert.are.equal(w:sha256(), fast:weight(name):sha256())
  end)
end)
