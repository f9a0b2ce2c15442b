-- Tensor operations computed in C (src/lua_bindings/l_tensor_ops.c), each against the same
-- computation written as a plain Lua loop here (double precision), or against hand-computed
-- values; plus broadcasting, shape errors, views (read-only operands, sub-views that expire) and
-- the token-space helpers (0-based ids).

local ember = require("ember")
local fx = require("helpers.fixtures")

-- Deterministic values in about [-3, 3].
local function values(n, seed)
  local out, s = {}, seed or 1
  for i = 1, n do
    s = (s * 1103515245 + 12345) % 2147483648
    out[i] = (s / 2147483648) * 6 - 3
  end
  return out
end

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

-- A tensor and the same values as a Lua matrix (rows of f32-rounded numbers).
local function make(rows, cols, seed)
  local v = values(rows * cols, seed)
  local t = ember.tensor(rows, cols, v)
  local m = {}
  for r = 1, rows do
    m[r] = {}
    for c = 1, cols do m[r][c] = f32(v[(r - 1) * cols + c]) end
  end
  return t, m
end

local function assert_close(t, want, tol, what)
  local shape = t:shape()
  assert.are.equal(#want, shape[1], (what or "") .. ": rows")
  for r = 1, #want do
    assert.are.equal(#want[r], shape[2], (what or "") .. ": cols")
    for c = 1, #want[r] do
      local g, w = t:get(r, c), want[r][c]
      local bound = (tol or 1e-6) * math.max(1, math.abs(w))
      if not (math.abs(g - w) <= bound) then
        error(string.format("%s: [%d, %d] = %.9g, expected %.9g", what or "value", r, c, g, w), 2)
      end
    end
  end
end

local function raises(pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_truthy(tostring(err):find(pattern, 1, true), "error was: " .. tostring(err))
end

describe("tensor operations", function()
  it("softmax and log_softmax per row", function()
    local t, m = make(3, 7, 3)
    local sm, lsm = {}, {}
    for r = 1, 3 do
      local mx, s = -math.huge, 0
      for c = 1, 7 do mx = math.max(mx, m[r][c]) end
      for c = 1, 7 do s = s + math.exp(m[r][c] - mx) end
      sm[r], lsm[r] = {}, {}
      for c = 1, 7 do
        sm[r][c] = math.exp(m[r][c] - mx) / s
        lsm[r][c] = m[r][c] - mx - math.log(s)
      end
    end
    assert_close(t:softmax(), sm, 1e-6, "softmax")
    assert_close(t:log_softmax(), lsm, 1e-6, "log_softmax")
    -- hand-computed: softmax{0, ln 3} = {1/4, 3/4}; huge inputs do not overflow
    assert_close(ember.tensor(1, 2, { 0, math.log(3) }):softmax(), { { 0.25, 0.75 } }, 1e-6, "softmax")
    assert_close(ember.tensor(1, 2, { 1000, 1000 }):softmax(), { { 0.5, 0.5 } }, 1e-7, "softmax of large values")
  end)

  it("matmul, matmul_t and transpose", function()
    local a, ma = make(3, 5, 11)
    local b, mb = make(5, 4, 12)
    local want = {}
    for i = 1, 3 do
      want[i] = {}
      for j = 1, 4 do
        local s = 0
        for k = 1, 5 do s = s + ma[i][k] * mb[k][j] end
        want[i][j] = s
      end
    end
    assert_close(a:matmul(b), want, 1e-6, "matmul")
    assert_close(ember.matmul(a, b), want, 1e-6, "ember.matmul")
    local bt = b:transpose()
    assert.are.same({ 4, 5 }, bt:shape())
    for k = 1, 5 do
      for j = 1, 4 do assert.are.equal(b:get(k, j), bt:get(j, k)) end
    end
    assert_close(a:matmul_t(bt), want, 1e-6, "matmul_t")
    -- hand-computed
    local x = ember.tensor(2, 2, { 1, 2, 3, 4 })
    assert.are.same({ 7, 10, 15, 22 }, x:matmul(x):values())
  end)

  it("names the op and both shapes when a product does not fit", function()
    local a, b = ember.tensor(2, 3), ember.tensor(4, 5)
    raises("matmul: shapes [2, 3] and [4, 5] do not fit", a.matmul, a, b)
    raises("matmul_t: shapes [2, 3] and [4, 5] do not fit", a.matmul_t, a, b)
    raises("dot: shapes [2, 3] and [4, 5] differ", a.dot, a, b)
    raises("cosine: shapes [2, 3] and [4, 5] differ", a.cosine, a, b)
  end)

  it("dot and cosine over every element", function()
    local a, ma = make(2, 6, 21)
    local b, mb = make(2, 6, 22)
    local d, na, nb = 0, 0, 0
    for r = 1, 2 do
      for c = 1, 6 do
        d = d + ma[r][c] * mb[r][c]
        na = na + ma[r][c] ^ 2
        nb = nb + mb[r][c] ^ 2
      end
    end
    assert.is_true(math.abs(a:dot(b) - d) <= 1e-9 * math.abs(d) + 1e-12)
    assert.is_true(math.abs(a:cosine(b) - d / math.sqrt(na * nb)) <= 1e-12)
    assert.are.equal(1, ember.tensor(1, 2, { 3, 4 }):cosine(ember.tensor(1, 2, { 6, 8 })))
    assert.are.equal(0, ember.tensor(1, 2, { 1, 0 }):cosine(ember.tensor(1, 2, { 0, 5 })))
    local z = ember.tensor(1, 2):cosine(ember.tensor(1, 2, { 1, 1 }))
    assert.is_true(z ~= z, "cosine with a zero vector is NaN")
  end)

  it("add, sub, mul, div: equal shapes, a broadcast row either side, a number either side", function()
    local a, ma = make(3, 4, 31)
    local b, mb = make(3, 4, 32)
    local row, mrow = make(1, 4, 33)
    local ops = {
      add = function(x, y) return x + y end, sub = function(x, y) return x - y end,
      mul = function(x, y) return x * y end, div = function(x, y) return x / y end,
    }
    local function expect(f, x, y)
      local out = {}
      for r = 1, 3 do
        out[r] = {}
        for c = 1, 4 do
          local xv = type(x) == "number" and x or x[#x == 1 and 1 or r][c]
          local yv = type(y) == "number" and y or y[#y == 1 and 1 or r][c]
          out[r][c] = f32(f(xv, yv))
        end
      end
      return out
    end
    for name, f in pairs(ops) do
      assert_close(ember[name](a, b), expect(f, ma, mb), 0, name .. " equal shapes")
      assert_close(ember[name](a, row), expect(f, ma, mrow), 0, name .. " row on the right")
      assert_close(ember[name](row, a), expect(f, mrow, ma), 0, name .. " row on the left")
      assert_close(ember[name](a, 2.5), expect(f, ma, 2.5), 0, name .. " number on the right")
      assert_close(ember[name](2.5, a), expect(f, 2.5, ma), 0, name .. " number on the left")
    end
    -- the operators are the same functions
    assert.are.equal(ember.add(a, row):sha256(), (a + row):sha256())
    assert.are.equal(ember.sub(a, b):sha256(), (a - b):sha256())
    assert.are.equal(ember.mul(a, 3):sha256(), (a * 3):sha256())
    assert.are.equal(ember.div(1, a):sha256(), (1 / a):sha256())
    assert.are.equal(ember.mul(a, -1):sha256(), (-a):sha256())
    -- hand-computed, and the operands are untouched
    local x = ember.tensor(2, 2, { 1, 2, 3, 4 })
    assert.are.same({ 11, 22, 13, 24 }, (x + ember.tensor(1, 2, { 10, 20 })):values())
    assert.are.same({ 1, 2, 3, 4 }, x:values())
  end)

  it("names the op and both shapes when operands do not broadcast", function()
    local a = ember.tensor(2, 3)
    raises("sub: shapes [2, 3] and [3, 3] do not broadcast", ember.sub, a, ember.tensor(3, 3))
    raises("mul: shapes [2, 3] and [1, 4] do not broadcast", ember.mul, a, ember.tensor(1, 4))
    raises("add: shapes [2, 3] and [2, 2] do not broadcast", function() return a + ember.tensor(2, 2) end)
    raises("add: at least one operand must be", ember.add, 1, 2)
    raises("bad argument #2 to 'mul'", ember.mul, a, "x")
  end)

  it("the in-place t:add(x) of views and tensors is unchanged", function()
    local x = ember.tensor(1, 2, { 1, 2 })
    assert.are.equal(x, x:add(1))
    assert.are.same({ 2, 3 }, x:values())
  end)

  it("sum and mean over rows give [1, cols]", function()
    local t, m = make(4, 3, 41)
    local s, mean = { {} }, { {} }
    for c = 1, 3 do
      local acc = 0
      for r = 1, 4 do acc = acc + m[r][c] end
      s[1][c], mean[1][c] = acc, acc / 4
    end
    assert_close(t:sum(), s, 1e-6, "sum")
    assert_close(t:mean(), mean, 1e-6, "mean")
    assert.are.same({ 4, 6 }, ember.tensor(2, 2, { 1, 2, 3, 4 }):sum():values())
  end)

  it("slice(r0, r1): 1-based, inclusive rows; r1 defaults to the last", function()
    local t = ember.tensor(4, 2, { 1, 2, 3, 4, 5, 6, 7, 8 })
    assert.are.same({ 3, 4, 5, 6 }, t:slice(2, 3):values())
    assert.are.same({ 5, 6, 7, 8 }, t:slice(3):values())
    assert.are.same({ 1, 2 }, t:slice(1, 1):values())
    t:slice(1, 1):zero() -- a copy: the tensor is untouched
    assert.are.same(1, t:get(1, 1))
    raises("slice: rows 0..2 out of range for shape [4, 2]", t.slice, t, 0, 2)
    raises("slice: rows 3..5 out of range", t.slice, t, 3, 5)
    raises("slice: rows 3..2 out of range", t.slice, t, 3, 2)
  end)

  it("head(h, n_heads): columns (attention_heads layout) or rows (attention_pattern layout), 0-based", function()
    -- [2, 3 heads * 2]: head h is columns 2h+1 .. 2h+2 (1-based)
    local z = ember.tensor(2, 6, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 })
    assert.are.same({ 1, 2, 7, 8 }, z:head(0, 3):values())
    assert.are.same({ 5, 6, 11, 12 }, z:head(2, 3, "columns"):values())
    -- [2 heads * 2 queries, 3 keys]: head h is rows 2h+1 .. 2h+2
    local p = ember.tensor(4, 3, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 })
    assert.are.same({ 7, 8, 9, 10, 11, 12 }, p:head(1, 2, "rows"):values())
    raises("head: head 3 out of range 0..2 (heads are 0-based", z.head, z, 3, 3)
    raises("head: head -1 out of range", z.head, z, -1, 3)
    raises("head: 6 columns do not split into 4 heads", z.head, z, 0, 4)
    raises("head: 4 rows do not split into 3 heads", p.head, p, 0, 3, "rows")
    raises("head: this tensor carries no head count", z.head, z, 0)
  end)

  it("token_argmax and topk speak 0-based token ids", function()
    local t = ember.tensor(2, 5, { 0.5, 3, -1, 3, 2, 9, 1, 8, 7, 9 })
    assert.are.equal(1, t:token_argmax(1)) -- ties: the lowest id
    assert.are.equal(2, t:argmax(1))       -- argmax stays a 1-based column
    assert.are.equal(0, t:token_argmax(2))
    raises("token_argmax: the tensor has 2 rows; pass the row", t.token_argmax, t)
    assert.are.equal(3, ember.tensor(1, 4, { 1, 2, 3, 4 }):token_argmax())
    local ids, vals = t:topk(3, 2)
    assert.are.same({ 0, 4, 2 }, ids)
    assert.are.same({ 9, 9, 8 }, vals)
    raises("topk: k = 6 out of range 1..5", t.topk, t, 6, 1)
    raises("topk: row 3 out of range 1..2", t.topk, t, 2, 3)
  end)

  it("topk agrees with a full sort of a long row", function()
    local n = 1000
    local v = values(n, 51)
    for i = 1, n, 10 do v[i] = 1.5 end -- many ties
    local t = ember.tensor(1, n, v)
    local order = {}
    for i = 1, n do order[i] = i end
    local fv = {}
    for i = 1, n do fv[i] = f32(v[i]) end
    table.sort(order, function(a, b) return fv[a] > fv[b] or (fv[a] == fv[b] and a < b) end)
    for _, k in ipairs({ 1, 7, 100, n }) do
      local ids, vals = t:topk(k)
      assert.are.equal(k, #ids)
      for i = 1, k do
        assert.are.equal(order[i] - 1, ids[i])
        assert.are.equal(fv[order[i]], vals[i])
      end
    end
  end)
end)

describe("tensor operations on hook views", function()
  local m, why = fx.api_model_loaded()
  if not m then
    pending(why)
    return
  end
  local ids = { 1, 2, 3, 4 }

  it("read the view, write nothing, and leave logits bit-identical", function()
    local plain = m:generate { ids = ids, max_tokens = 3, eos = false }
    local seen = {}
    local exp = { name = "ops-reader" }
    function exp.after_layer(_, ctx, v)
      seen[#seen + 1] = v:softmax():sum():matmul_t(v):mean()
      local x = v + v:mean()
      x = x - v:slice(1, 1)
      seen[#seen + 1] = x:transpose():matmul(v):dot(v:transpose():matmul(v))
      seen[#seen + 1] = v:row(1):cosine(v:row(v:shape()[1]))
      seen[#seen + 1] = (v * 2):log_softmax()
    end
    function exp.after_logits(_, _, v) seen[#seen + 1] = v:topk(5) end
    local out = m:generate { ids = ids, max_tokens = 3, eos = false, experiment = exp }
    assert.is_false(out.modified)
    assert.are.same(plain.ids, out.ids)
    assert.is_true(#seen > 0)
  end)

  it("slice of a view is a sub-view: writes reach the engine, and it expires with the hook", function()
    local kept, exp = nil, { name = "slice-writer" }
    local d = m.info.hidden_size
    function exp.after_layer(_, ctx, v)
      if ctx.layer_index == 0 and ctx.phase == "prefill" then
        local sub = v:slice(2, 3)
        assert.are.same({ 2, d }, sub:shape())
        assert.are.equal(v:get(2, 1), sub:get(1, 1))
        sub:zero()
        assert.are.equal(0, v:get(3, d))
        kept = sub
      end
    end
    local out = m:generate { ids = ids, max_tokens = 1, eos = false, experiment = exp }
    assert.is_true(out.modified)
    raises("expired view", kept.values, kept)
    raises("expired view", kept.softmax, kept)
  end)

  it("head() of a view without head metadata needs n_heads; with it, rows give a sub-view", function()
    local exp = { name = "heads" }
    local got
    function exp.before_layer(_, ctx, v)
      if ctx.layer_index ~= 0 or ctx.phase ~= "prefill" then return end
      raises("head: this view carries no head count", v.head, v, 0)
      local rows = v:shape()[1]
      local h = v:head(1, rows, "rows") -- one row per "head": row 2
      assert.are.same(v:row(2):values(), h:values())
      got = h
    end
    m:generate { ids = ids, max_tokens = 1, eos = false, experiment = exp }
    raises("expired view", got.values, got)
  end)
end)
