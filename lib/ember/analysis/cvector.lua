-- ember.analysis.cvector — makes control vectors from pairs of prompts, as llama.cpp's
-- cvector-generator does: per pair, the residual stream after each layer of the positive prompt minus
-- the negative one (padded to one length), rows that are zero dropped, then per layer the mean of
-- the rows or their first principal direction, normalized. Must not apply vectors (run/control_vector)
-- nor write files (core.write_control_vector does, in llama.cpp's layout).
--
-- Facts from cvector-generator (llama.cpp examples/cvector-generator) that decide the numbers:
--   * the hidden state is each layer's output (l_out, ember's after_layer); the last layer's is
--     not used; the direction of layer i's output is written as direction.(i+1), which llama.cpp
--     (and --control-vector) adds to the output of layer i+1;
--   * both prompts of a pair are tokenized with the model's BOS rule and the shorter one padded with
--     the token that " " ends in;
--   * mean: the mean of the difference rows, divided by its L2 norm;
--   * pca: the first eigenvector of D^T D (D the difference rows, not centred), by power iteration,
--     of unit norm. llama.cpp's sign is left to a random start; here it is fixed so that the
--     direction points the way the mean difference does (positive minus negative).
--   * dropped rows: llama.cpp drops a row when no value exceeds 1e-6 (so an all-negative row goes
--     too); here a row goes when every |value| <= 1e-6, i.e. when the two prompts agree there.

local core = require("ember.core")
local cache = require("ember.model.cache")

local M = {}

M.METHODS = { "mean-diff", "pca" }
M.ZERO_ROW = 1e-6 -- a difference row with every |value| at most this is dropped
M.PCA_MAX_ITER, M.PCA_TOL = 10000, 1e-12

local function fail(msg, ...) error("control-vector: " .. string.format(msg, ...), 0) end

-- pad_id(model) -> the token " " ends in (cvector-generator's padding token)
local function pad_id(model)
  local ids = model:tokenize(" ", { bos = false })
  if #ids == 0 then fail("the tokenizer gives no token for ' ' (needed to pad the shorter prompt of a pair)") end
  return ids[#ids]
end

-- pairs_ids(model, positive, negative) -> { { pos = ids, neg = ids } }, both of one length
function M.pairs_ids(model, positive, negative)
  if #positive ~= #negative then
    fail("%d positive and %d negative prompts: they are taken in pairs, in order (give as many of each)", #positive,
      #negative)
  end
  if #positive == 0 then fail("no prompt pairs") end
  local pad, out = pad_id(model), {}
  for i = 1, #positive do
    local a, b = model:tokenize(positive[i]), model:tokenize(negative[i])
    while #a < #b do a[#a + 1] = pad end
    while #b < #a do b[#b + 1] = pad end
    out[i] = { pos = a, neg = b }
  end
  return out
end

-- The rows of a [T, d] difference tensor that are not all (nearly) zero, as f32 bytes.
local function nonzero_rows(diff, out)
  local shape = diff:shape()
  for r = 1, shape[1] do
    local row = diff:row(r)
    local keep = false
    for _, v in ipairs(row:values()) do
      if v > M.ZERO_ROW or v < -M.ZERO_ROW then keep = true; break end
    end
    if keep then out[#out + 1] = row:bytes() end
  end
end

-- differences(model, pairs, layers) -> { [layer] = Tensor [rows, d] }: every pair's nonzero
-- difference rows after each of `layers` (0-based), in pair order
function M.differences(model, pairs, layers)
  local rows = {}
  for _, l in ipairs(layers) do rows[l] = {} end
  for _, p in ipairs(pairs) do
    local a = cache.run_with_cache(model, { ids = p.pos, stages = { "after_layer" }, layers = layers })
    local b = cache.run_with_cache(model, { ids = p.neg, stages = { "after_layer" }, layers = layers })
    for _, l in ipairs(layers) do nonzero_rows(a.after_layer[l] - b.after_layer[l], rows[l]) end
  end
  local d, out = model.info.hidden_size, {}
  for _, l in ipairs(layers) do
    if #rows[l] == 0 then
      fail("after layer %d every positive prompt equals its negative one (no difference to learn from)", l)
    end
    out[l] = core.tensor_from_bytes(table.concat(rows[l]), #rows[l], d)
  end
  return out
end

local function unit(values, what)
  local n = 0.0
  for _, v in ipairs(values) do n = n + v * v end
  n = math.sqrt(n)
  if not (n > 0) or n == math.huge then fail("%s has norm %s: no direction", what, tostring(n)) end
  local out = {}
  for i, v in ipairs(values) do out[i] = v / n end
  return out
end

-- mean_direction(D) -> unit Lua array: the mean of the rows (summed in double), normalized
function M.mean_direction(D)
  return unit(D:mean():values(), "the mean difference")
end

-- First eigenvector of the symmetric matrix G (a Tensor [n, n]) by power iteration from `start`
-- (products in C with double accumulation), stopping when the direction moves by less than tol.
local function power_iteration(G, start)
  local n = #start
  local v = core.tensor(1, n, unit(start, "the start of the power iteration"))
  for _ = 1, M.PCA_MAX_ITER do
    local w = unit(v:matmul(G):values(), "an iterate of the power iteration")
    local cos = 0.0
    local old = v:values()
    for i = 1, n do cos = cos + w[i] * old[i] end
    v = core.tensor(1, n, w)
    if 1 - math.abs(cos) < M.PCA_TOL then break end
  end
  return v
end

-- pca_direction(D, mean) -> unit Lua array: the first principal direction of the rows of D (the top
-- eigenvector of D^T D, uncentred, as cvector-generator), pointing the way `mean` does. Works on
-- the smaller of D D^T and D^T D.
function M.pca_direction(D, mean)
  local r, d = D:shape()[1], D:shape()[2]
  local m = core.tensor(1, d, mean)
  local v
  if r < d then
    local u = power_iteration(D:matmul_t(D), D:matmul_t(m):transpose():values()) -- in row space
    v = u:matmul(D)
  else
    local Dt = D:transpose()
    v = power_iteration(Dt:matmul_t(Dt), mean)
  end
  local out = unit(v:values(), "the principal direction")
  local dot = 0.0
  for i = 1, d do dot = dot + out[i] * mean[i] end
  if dot < 0 then for i = 1, d do out[i] = -out[i] end end
  return out
end

-- make(opts) -> { model_hint, directions = { { layer = N, tensor = Tensor [1, d], rows = r } } }
-- opts: model, positive = { texts }, negative = { texts }, method = "mean-diff" | "pca", layers =
-- { lo, hi } (the direction.N to write, N >= 1; default 1 .. n_layers - 1)
function M.make(opts)
  local model = opts.model
  local n_layers = model.info.n_layers
  local method = opts.method or "mean-diff"
  if method ~= "mean-diff" and method ~= "pca" then fail("unknown method '%s' (mean-diff | pca)", tostring(method)) end
  local lo, hi = 1, n_layers - 1
  if opts.layers then lo, hi = opts.layers[1], opts.layers[2] end
  if lo < 1 then fail("layers %d-%d: direction.0 does not exist (llama.cpp never steers layer 0)", lo, hi) end
  if hi > n_layers - 1 then
    fail("layers %d-%d: the model has %d layers, so direction.N runs 1-%d (direction.N is made from layer N-1's "
      .. "output and added to layer N's)", lo, hi, n_layers, n_layers - 1)
  end
  local src = {}
  for n = lo, hi do src[#src + 1] = n - 1 end
  local pairs_ = M.pairs_ids(model, opts.positive, opts.negative)
  local diffs = M.differences(model, pairs_, src)
  local dirs = {}
  for _, l in ipairs(src) do
    local D = diffs[l]
    local mean = M.mean_direction(D)
    local v = method == "pca" and M.pca_direction(D, mean) or mean
    dirs[#dirs + 1] = { layer = l + 1, tensor = core.tensor(1, #v, v), rows = D:shape()[1] }
  end
  return { model_hint = model.info.architecture, directions = dirs, pairs = #pairs_ }
end

-- write(path, cv): the file in cvector-generator's layout (core.write_control_vector)
function M.write(path, cv)
  return core.write_control_vector(path, { model_hint = cv.model_hint, directions = cv.directions })
end

return M
