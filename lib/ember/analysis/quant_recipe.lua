-- ember.analysis.quant_recipe — which tensors of a quantized model B to keep at higher precision so
-- that it behaves like its reference A (`ember quant-recipe`, docs/quant-recipe.md): the groups of
-- weight tensors, each group's sensitivity (the share of B's divergence from A recovered by taking
-- that group from A, measured on prompts), the greedy selection under a byte budget re-measured
-- jointly, and the recipe lines for llama-quantize's --tensor-type-file. Must not load models by
-- itself nor write files: the caller gives `load(names)` (B with those tensors from A) and writes.

local distribution = require("ember.analysis.distribution")
local json = require("ember.store.json")

local M = {}

local function fail(msg, ...) error("quant-recipe: " .. string.format(msg, ...), 0) end

-- ---- the models and their tensors --------------------------------------------------------------

-- check_pair(a, b): one network: the same architecture and the same tensors (names and shapes); the
-- error names the first difference and both files.
function M.check_pair(a, b)
  if a.info.architecture ~= b.info.architecture then
    fail("A (%s) is a '%s' model and B (%s) a '%s' one: they must be the same network", a.info.path,
      a.info.architecture, b.info.path, b.info.architecture)
  end
  local ta, tb = a:tensors(), b:tensors()
  local by_name = {}
  for _, t in ipairs(ta) do by_name[t.name] = t end
  for _, t in ipairs(tb) do
    local u = by_name[t.name]
    if not u then fail("tensor '%s' of B (%s) is not in A (%s)", t.name, b.info.path, a.info.path) end
    if table.concat(u.shape, "x") ~= table.concat(t.shape, "x") then
      fail("tensor '%s' is [%s] in A (%s) but [%s] in B (%s)", t.name, table.concat(u.shape, ", "), a.info.path,
        table.concat(t.shape, ", "), b.info.path)
    end
    by_name[t.name] = nil
  end
  local extra = next(by_name)
  if extra then fail("tensor '%s' of A (%s) is not in B (%s)", extra, a.info.path, b.info.path) end
end

-- group_of(name, per_tensor) -> the group a 2-D weight belongs to: "blk.N.attn" (attention),
-- "blk.N.ffn" (the MLP), "output", "token_embd", else the tensor's own name; per_tensor: its name.
function M.group_of(name, per_tensor)
  if per_tensor then return name end
  local layer, kind = name:match("^blk%.(%d+)%.(%a+)_")
  if layer and (kind == "attn" or kind == "ffn") then return "blk." .. layer .. "." .. kind end
  return (name:gsub("%.weight$", ""))
end

-- groups(b_tensors, per_tensor) -> { { name, tensors = { t... } } } in the file's order of their
-- first tensors: every tensor of two or more dimensions (the quantized weights; vectors stay B's).
function M.groups(tensors, per_tensor)
  local out, index = {}, {}
  for _, t in ipairs(tensors) do
    if #t.shape >= 2 then
      local g = M.group_of(t.name, per_tensor)
      if not index[g] then
        out[#out + 1] = { name = g, tensors = {} }
        index[g] = out[#out]
      end
      local list = index[g].tensors
      list[#list + 1] = t
    end
  end
  return out
end

-- ---- types and bytes ----------------------------------------------------------------------------

-- check_types(list, weight_types) -> the list, each a type ember and llama-quantize both know
function M.check_types(list, weight_types)
  local names = {}
  for i, t in ipairs(weight_types) do names[i] = t.name end
  for _, t in ipairs(list) do
    if not weight_types[t] then
      fail("--types: '%s' is not a weight type (one of %s)", t, table.concat(names, ", "))
    end
  end
  return list
end

-- recipe_type(t, types, weight_types) -> the first of types whose blocks divide t's rows (llama-quantize
-- would otherwise fall back to another type), and its bytes; nil when none fits.
function M.recipe_type(t, types, weight_types)
  local n_in, rows = t.shape[#t.shape], 1
  for i = 1, #t.shape - 1 do rows = rows * t.shape[i] end
  for _, name in ipairs(types) do
    local w = weight_types[name]
    if n_in % w.block_size == 0 then return name, rows * (n_in // w.block_size) * w.block_bytes end
  end
  return nil
end

-- costs(groups, types, weight_types): each group gets .types (tensor -> recipe type) and .added_bytes
-- (its tensors' bytes in those types minus B's); a tensor no type fits is an error naming it.
function M.costs(groups, types, weight_types)
  for _, g in ipairs(groups) do
    g.types, g.added_bytes = {}, 0
    for _, t in ipairs(g.tensors) do
      local ty, bytes = M.recipe_type(t, types, weight_types)
      if not ty then
        fail("--types %s: none fits tensor '%s' (rows of %d values)", table.concat(types, ","), t.name,
          t.shape[#t.shape])
      end
      g.types[t.name] = ty
      g.added_bytes = g.added_bytes + bytes - t.bytes
    end
  end
end

-- ---- measuring ----------------------------------------------------------------------------------

-- The next-token logits after each prompt, as lists of doubles.
local function last_logits(model, prompts)
  local out = {}
  for i, p in ipairs(prompts) do
    local s = model:session { context = #p.ids }
    out[i] = s:prefill(p.ids):values()
    s:close()
  end
  return out
end

local function argmax(v)
  local best = 1
  for i = 2, #v do if v[i] > v[best] then best = i end end
  return best
end

-- reference(a, prompts, metric) -> what every measurement compares with: A's next-token
-- distributions (kl) or A's logit differences (logit-diff), and A's top-1s.
function M.reference(a, prompts, metric)
  local r = { metric = metric, top1 = {}, values = {} }
  for i, v in ipairs(last_logits(a, prompts)) do
    r.top1[i] = argmax(v)
    if metric.kind == "kl" then r.values[i] = distribution.softmax(v)
    else r.values[i] = v[metric.tokens[1] + 1] - v[metric.tokens[2] + 1] end
  end
  return r
end

-- measure(model, prompts, ref) -> { divergence, kl, top1 }: the divergence from A is the mean over
-- the prompts of KL(A || model) (kl) or of |A's logit difference - the model's| (logit-diff).
function M.measure(model, prompts, ref)
  local sum_div, sum_kl, agree = 0.0, 0.0, 0
  for i, v in ipairs(last_logits(model, prompts)) do
    local d
    if ref.metric.kind == "kl" then
      d = distribution.kl(ref.values[i], distribution.softmax(v))
      sum_kl = sum_kl + d
    else
      d = math.abs(ref.values[i] - (v[ref.metric.tokens[1] + 1] - v[ref.metric.tokens[2] + 1]))
    end
    sum_div = sum_div + d
    if argmax(v) == ref.top1[i] then agree = agree + 1 end
  end
  local n = #prompts
  return { divergence = sum_div / n, kl = ref.metric.kind == "kl" and sum_kl / n or nil, top1 = agree / n }
end

-- recovered(base, now) -> the share of B's divergence a configuration removes (1 = as A, 0 = as B)
function M.recovered(base, now) return (base - now) / base end

return M
