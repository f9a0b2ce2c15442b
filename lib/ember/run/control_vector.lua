-- ember.run.control_vector — llama.cpp control vectors (--control-vector FILE.gguf[:SCALE],
-- --control-vector-layers A-B): reads the files (the engine's GGUF reader, core.read_control_vector),
-- sums them as llama.cpp does and hands the sums to ember.experiments.steer at the place llama.cpp
-- adds them. Must not add anything itself: steer is the one owner of additions.
--
-- llama.cpp's semantics (common/common.cpp common_control_vector_load*, src/llama-adapter.cpp
-- llama_adapter_cvec, and each family's graph: `cur = build_cvec(cur, il)` right before the layer's
-- output is named l_out):
--   * direction.N is added to the output of layer N (0-based), after the MLP residual add — and on
--     Gemma 4 after the per-layer-embedding step and the layer output scaling — which is ember's
--     after_layer of layer N. direction.0 is refused; layer 0 is never steered.
--   * within a file, directions are multiplied by the file's scale and summed per layer; the files
--     are then summed; all must have one width, equal to the model's hidden size.
--   * the layer range A-B is inclusive at both ends; by default 1 to n_layers. Directions beyond the
--     model's last layer are not applied (llama.cpp ignores them too); ember says so.

local M = {}

local function core() return require("ember.core") end

-- read(path) -> core.read_control_vector's table plus path and the file's sha256; raises naming
-- the file.
function M.read(path)
  if type(path) ~= "string" or path == "" then error("control vector: a path is required", 0) end
  local ok, cv = pcall(core().read_control_vector, path)
  if not ok then error(tostring(cv), 0) end
  cv.path = path
  cv.sha256 = core().sha256_file(path)
  return cv
end

-- parse_range(s) -> { lo, hi } from "A-B" (inclusive) or "N"; nil and a message otherwise.
function M.parse_range(s)
  local selectors = require("ember.run.selectors")
  if type(s) ~= "string" then return nil, "expected A-B (inclusive layer range)" end
  local a, b = s:match("^(%d+)%-(%d+)$")
  if not a then a = s:match("^(%d+)$"); b = a end
  local lo, hi = a and selectors.parse_uint(a), b and selectors.parse_uint(b)
  if not lo or not hi then return nil, "expected A-B (an inclusive layer range like 1-20), got '" .. s .. "'" end
  if lo > hi then return nil, string.format("empty layer range %d-%d", lo, hi) end
  return { lo, hi }
end

-- sum(file_list, info, lo, hi) -> sums (layer -> the scaled directions added up, f32 as llama.cpp's
-- loader), files (what the manifest records of each), beyond (directions past the last layer)
local function sum(file_list, info, lo, hi)
  local n_layers, hidden = info.n_layers, info.hidden_size
  local sums, files, beyond = {}, {}, {}
  for _, f in ipairs(file_list) do
    local cv = f.cv or M.read(f.path)
    local scale = f.scale == nil and 1.0 or f.scale
    if cv.n_embd ~= hidden then
      error(string.format("control vector %s: its directions have %d values, the model's hidden size is %d", cv.path,
        cv.n_embd, hidden), 0)
    end
    local layers = {}
    for _, d in ipairs(cv.directions) do
      layers[#layers + 1] = d.layer
      if d.layer > n_layers - 1 then
        if not beyond[d.layer] then beyond[d.layer] = true; beyond[#beyond + 1] = d.layer end
      elseif d.layer >= lo and d.layer <= hi then
        local x = d.tensor:clone():scale(scale) -- src * strength in f32, as llama.cpp's loader
        if sums[d.layer] then sums[d.layer]:add(x) else sums[d.layer] = x end
      end
    end
    files[#files + 1] = { path = cv.path, sha256 = cv.sha256, scale = scale + 0.0, n_embd = cv.n_embd,
      model_hint = cv.model_hint, layer_count = cv.layer_count, directions = layers }
  end
  return sums, files, beyond
end

-- announce(exp, what, applied, beyond, n_layers, notice): one line for the whole set instead of
-- one per layer, and the directions that fell beyond the model
local function announce(exp, what, applied, beyond, n_layers, notice)
  local steer = require("ember.experiments.steer")
  local zero, total, prefill, decode = true, 0, 0, 0
  for _, a in ipairs(exp.additions) do
    zero = zero and a.zero
    total, prefill, decode = total + a.prefill + a.decode, prefill + a.prefill, decode + a.decode
  end
  local where = string.format("after_layer of layers %s", steer.layers_text(applied))
  if zero then
    notice(string.format("ember: control-vector %s: every scaled direction is zero; nothing was added (%s)", what,
      where))
  else
    notice(string.format("ember: this run was MODIFIED by control-vector %s: direction.N added to %s (llama.cpp's "
      .. "layers), %d times (prefill %d, decode %d)", what, where, total, prefill, decode))
  end
  if #beyond > 0 then
    table.sort(beyond)
    notice(string.format("ember: control-vector: direction.%s beyond the model's last layer %d: not applied "
      .. "(as in llama.cpp)", steer.layers_text(beyond), n_layers - 1))
  end
end

-- experiment(args) -> a steer experiment named "control-vector".
-- args: files = { { path =, scale = 1 }, ... } (or already read: { cv =, scale = }), layers =
-- { lo, hi } or nil (llama.cpp's default 1..n_layers), model = a model or its info table
-- (n_layers, hidden_size), notice = fn(msg).
function M.experiment(args)
  local info = args.model and (args.model.info or args.model)
  if type(info) ~= "table" or not info.n_layers or not info.hidden_size then
    error("control vector: model (or its info: n_layers, hidden_size) is required", 0)
  end
  if type(args.files) ~= "table" or #args.files == 0 then error("control vector: files must be a non-empty list", 0) end
  local n_layers = info.n_layers
  local range = args.layers or { 1, n_layers }
  local lo, hi = math.max(range[1], 1), math.min(range[2], n_layers - 1)
  local sums, files, beyond = sum(args.files, info, lo, hi)

  local additions, applied = {}, {}
  for l = lo, hi do
    if sums[l] then
      additions[#additions + 1] = { layer = l, stage = "after_layer", vector = sums[l], scale = 1.0,
        source = "control-vector direction." .. l, label = "direction." .. l }
      applied[#applied + 1] = l
    end
  end
  local names = {}
  for i, f in ipairs(files) do names[i] = string.format("%s:%g", f.path, f.scale) end
  local notice = args.notice or function(msg) io.stderr:write(msg, "\n") end
  local what = table.concat(names, " + ")
  if #additions == 0 then
    -- nothing falls in the range: the run is a plain one; say so rather than pretend
    local exp = { name = "control-vector", stats = { additions = 0, layers = 0 },
      details = { files = files, layer_range = { range[1], range[2] },
        applied_layers = require("ember.store.json").array() } }
    function exp:on_generation_complete()
      notice(string.format("ember: control-vector %s: no direction falls in layers %d-%d of this %d-layer model; "
        .. "nothing was added", what, range[1], range[2], n_layers))
    end
    return exp
  end

  local exp = require("ember.experiments.steer").make { name = "control-vector", additions = additions,
    notice = notice }
  exp.details = { files = files, layer_range = { range[1], range[2] }, applied_layers = applied,
    additions = exp.details }
  exp.stats.layers = #applied
  function exp:on_generation_complete() announce(exp, what, applied, beyond, n_layers, notice) end
  return exp
end

return M
