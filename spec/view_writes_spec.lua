-- Anything that looks like a view of hook data writes through (or refuses writes): every method
-- of ember.TensorView is classified here, and each accessor that hands out part of a view (row,
-- slice, head, ...) is checked by the forward pass itself: an edit made through the accessor must
-- give bit-identical logits to the same edit made by hand on the hook's own view with get/set,
-- and must change them. A method nobody classified fails the spec, so a new accessor cannot slip
-- in as a silent copy.

local ember = require("ember")
local models = require("helpers.models")

local need_model = models.lazy_default()
local IDS = { 3, 17, 42, 5, 99, 7 }

-- The TensorView methods, by what they give back.
local WRITES = { set = true, zero = true, scale = true, add = true, copy_from = true } -- in place
local SUB_VIEWS = { row = true, slice = true, head = true, sequence = true } -- parts of the view: write through
-- results computed from the values (owned Tensors, numbers, strings, Lua tables): never views
local RESULTS = {
  shape = true, dtype = true, get = true, values = true, bytes = true, write_bytes = true, l2_norm = true,
  abs_max = true, fingerprint = true, sha256 = true, argmax = true, compare = true, top1 = true, clone = true,
  expired = true, softmax = true, log_softmax = true, matmul = true, matmul_t = true, transpose = true,
  dot = true, cosine = true, sum = true, mean = true, token_argmax = true, topk = true,
}

local function view_methods()
  local mt = debug.getregistry()["ember.TensorView"]
  local names = {}
  for k in pairs(mt.__methods) do names[#names + 1] = k end
  table.sort(names)
  return names
end

-- The last position's prefill logits of IDS with `edit(ctx, v)` called at `stage` of `layer`.
local function logits(model, stage, layer, edit)
  local exp = { name = "edit" }
  if edit then
    exp[stage] = function(_, ctx, v) if ctx.layer_index == layer then edit(ctx, v) end end
  end
  local s <close> = model:session { context = 16 }
  return s:prefill(IDS, { experiment = edit and exp or nil })
end

-- Applies f(r, c) (1-based, over the view's own rows and columns) to a block of v by hand.
local function by_hand(v, r0, r1, c0, c1, f)
  for r = r0, r1 do
    for c = c0, c1 do v:set(r, c, f(v:get(r, c), r, c)) end
  end
end

describe("TensorView methods", function()
  it("are each classified: an in-place write, a sub-view that writes through, or a computed result", function()
    local unknown = {}
    for _, k in ipairs(view_methods()) do
      local n = (WRITES[k] and 1 or 0) + (SUB_VIEWS[k] and 1 or 0) + (RESULTS[k] and 1 or 0)
      if n ~= 1 then unknown[#unknown + 1] = k end
    end
    assert.are.same({}, unknown)
  end)

  it("that compute a result never hand out a view", function()
    local model = need_model()
    if not model then return end
    local got = {}
    logits(model, "attention_heads", 0, function(_, z)
      local one = ember.tensor(z:shape()[2], 2)
      local calls = {
        softmax = { z:softmax() }, log_softmax = { z:log_softmax() }, clone = { z:clone() },
        transpose = { z:transpose() }, sum = { z:sum() }, mean = { z:mean() }, matmul = { z:matmul(one) },
        matmul_t = { z:matmul_t(z) }, values = { z:values() }, topk = { z:topk(2, 1) },
      }
      for k, res in pairs(calls) do
        got[k] = getmetatable(res[1]) and getmetatable(res[1]).__name or type(res[1])
      end
    end)
    for k, name in pairs(got) do assert.are_not.equal("ember.TensorView", name, k) end
    assert.are.equal("ember.Tensor", got.clone)
  end)
end)

describe("a part of a view writes through to the forward pass", function()
  local model, base, n_heads, hd, rows
  local function setup()
    model = need_model()
    if not model then return false end
    base = base or logits(model)
    n_heads = model.info.n_heads
    hd = model.info.head_dim
    rows = #IDS
    return true
  end

  -- Run A edits through the accessor, run B by hand: the logits must be bit-identical, and differ
  -- from the unedited run's.
  local function same_as_by_hand(stage, layer, through, hand)
    local a = logits(model, stage, layer, through)
    local b = logits(model, stage, layer, hand)
    assert.is_true(a:compare(b).bitwise_equal, stage .. ": the edit through the accessor differs from the one by hand")
    assert.is_false(a:compare(base).bitwise_equal, stage .. ": the edit did not change the logits")
  end

  it("z:head(h):zero() of attention_heads ablates head h (the TransformerLens-style ablation)", function()
    if not setup() then return end
    same_as_by_hand("attention_heads", 1, function(_, z) z:head(2):zero() end,
      function(_, z) by_hand(z, 1, rows, 2 * hd + 1, 3 * hd, function() return 0 end) end)
  end)

  it("every write through z:head(h) reaches head h's columns and no others", function()
    if not setup() then return end
    local c0 = hd + 1 -- head 1
    same_as_by_hand("attention_heads", 2, function(_, z) z:head(1):scale(0.5) end,
      function(_, z) by_hand(z, 1, rows, c0, c0 + hd - 1, function(x) return x * 0.5 end) end)
    same_as_by_hand("attention_heads", 2, function(_, z) z:head(1):add(1) end,
      function(_, z) by_hand(z, 1, rows, c0, c0 + hd - 1, function(x) return x + 1 end) end)
    local row = ember.tensor(1, hd)
    for c = 1, hd do row:set(1, c, c / 4) end
    same_as_by_hand("attention_heads", 2, function(_, z) z:head(1):add(row) end,
      function(_, z) by_hand(z, 1, rows, c0, c0 + hd - 1, function(x, _, c) return x + (c - c0 + 1) / 4 end) end)
    local src = ember.tensor(rows, hd)
    for r = 1, rows do
      for c = 1, hd do src:set(r, c, r - c / 8) end
    end
    same_as_by_hand("attention_heads", 2, function(_, z) z:head(1):copy_from(src) end,
      function(_, z) by_hand(z, 1, rows, c0, c0 + hd - 1, function(_, r, c) return r - (c - c0 + 1) / 8 end) end)
    same_as_by_hand("attention_heads", 2, function(_, z) z:head(1):set(3, 4, 7.5) end,
      function(_, z) z:set(3, c0 + 3, 7.5) end)
  end)

  it("v:sequence(1) of a session's evaluation is its whole view, and writes through", function()
    if not setup() then return end
    local d = model.info.hidden_size
    same_as_by_hand("after_layer", 1, function(_, v) v:sequence(1):row(2):scale(0.5) end,
      function(_, v) by_hand(v, 2, 2, 1, d, function(x) return x * 0.5 end) end)
  end)

  it("sub-views of a head (row, slice, head with explicit counts) write through too", function()
    if not setup() then return end
    local c0 = 3 * hd + 1 -- head 3
    same_as_by_hand("attention_heads", 0, function(_, z) z:head(3):row(2):zero() end,
      function(_, z) by_hand(z, 2, 2, c0, c0 + hd - 1, function() return 0 end) end)
    same_as_by_hand("attention_heads", 0, function(_, z) z:head(3):slice(2, 4):scale(-1) end,
      function(_, z) by_hand(z, 2, 4, c0, c0 + hd - 1, function(x) return -x end) end)
    -- the second half of head 3's columns, as a head of a two-head split of the sub-view
    same_as_by_hand("attention_heads", 0, function(_, z) z:head(3):head(1, 2):zero() end,
      function(_, z) by_hand(z, 1, rows, c0 + hd // 2, c0 + hd - 1, function() return 0 end) end)
    same_as_by_hand("attention_heads", 0, function(_, z) z:slice(2, 3):head(0, n_heads):zero() end,
      function(_, z) by_hand(z, 2, 3, 1, hd, function() return 0 end) end)
  end)

  it("p:head(h) of attention_pattern, and rows and slices of the residual stages, write through", function()
    if not setup() then return end
    same_as_by_hand("attention_pattern", 1, function(_, p) p:head(1):scale(0.25) end,
      function(_, p) by_hand(p, rows + 1, 2 * rows, 1, rows, function(x) return x * 0.25 end) end)
    local width = model.info.hidden_size
    same_as_by_hand("after_mlp", 2, function(_, v) v:row(3):zero() end,
      function(_, v) by_hand(v, 3, 3, 1, width, function() return 0 end) end)
    same_as_by_hand("before_layer", 3, function(_, v) v:slice(2, 5):scale(2) end,
      function(_, v) by_hand(v, 2, 5, 1, width, function(x) return x * 2 end) end)
    same_as_by_hand("mlp_activation", 1, function(_, a) a:slice(4):row(1):add(0.5) end,
      function(_, a) by_hand(a, 4, 4, 1, a:shape()[2], function(x) return x + 0.5 end) end)
  end)

  it("a write through a part marks the run modified, and the part expires with its hook call", function()
    if not setup() then return end
    local kept
    local exp = { name = "head-writer" }
    function exp:attention_heads(ctx, z)
      if ctx.layer_index == 0 and ctx.phase == "prefill" then
        kept = z:head(1)
        kept:zero()
      end
    end
    local out = model:generate { ids = IDS, max_tokens = 1, eos = false, experiment = exp }
    assert.is_true(out.modified)
    local ok, err = pcall(kept.values, kept)
    assert.is_false(ok)
    assert.matches("expired view", err)
    assert.is_true(kept:expired())
  end)
end)

describe("reads of one head's columns (a strided view)", function()
  it("equal the same columns copied by hand, for every read", function()
    local model = need_model()
    if not model then return end
    local hd = model.info.head_dim
    local got
    logits(model, "attention_heads", 1, function(_, z)
      local h = z:head(2)
      local rows = z:shape()[1]
      local hand = ember.tensor(rows, hd)
      for r = 1, rows do
        for c = 1, hd do hand:set(r, c, z:get(r, 2 * hd + c)) end
      end
      got = {
        shape = h:shape(), values = h:values(), want = hand:values(), bytes = h:bytes() == hand:bytes(),
        sha = h:sha256() == hand:sha256(), fp = h:fingerprint() == hand:fingerprint(),
        l2 = h:l2_norm() == hand:l2_norm(), max = h:abs_max() == hand:abs_max(),
        cmp = h:compare(hand).bitwise_equal, clone = h:clone():sha256() == hand:sha256(),
        soft = h:softmax():sha256() == hand:softmax():sha256(), top = h:top1()[2] == hand:top1()[2],
        arg = h:argmax(3) == hand:argmax(3), get = h:get(rows, hd) == z:get(rows, 3 * hd),
        str = tostring(h):gsub("^ember.TensorView", "") == tostring(hand):gsub("^ember.Tensor", ""),
        unembed_refused = not pcall(model.unembed, model, h),
      }
    end)
    assert.are.same({ #IDS, hd }, got.shape)
    assert.are.same(got.want, got.values)
    for _, k in ipairs({ "bytes", "sha", "fp", "l2", "max", "cmp", "clone", "soft", "top", "arg", "get", "str" }) do
      assert.is_true(got[k], k)
    end
    assert.is_true(got.unembed_refused) -- a [rows, head_dim] is not a residual
  end)
end)
