-- ember.model.trace — structured traces from Lua: ember.trace(path [, model]) opens one (a header line,
-- then the engine's events), trace:finish() adds the summary line (events, evaluations, the
-- normalized fingerprint) and closes it. generate{trace=} and ember.load{trace=} attach one.
-- Must not write events itself: they come from the engine (src/engine/trace.c), in its field order.

local core = require("ember.core")
local json = require("ember.store.json")
local internal = core.internal

local M = {}

-- The trace ember.load{trace=} made for a model (weak keys: it goes when the model goes).
local by_model = setmetatable({}, { __mode = "k" })

local Trace = core.classes.Trace

-- The ops a forward pass traces, by name (src/engine/family_*.c and attention.c emit them;
-- spec/trace_spec.lua checks that this list and the engine's events agree for every family).
M.OPS = { "embed", "per_layer_inputs", "attn_norm", "attn_qkv", "attn_q", "attn_k", "attn_v", "q_rope", "k_rope",
  "v_norm", "attention", "attn_output", "attn_post_norm", "attn_residual", "ffn_norm", "ffn_gate", "ffn_up",
  "ffn_act", "ffn_down", "ffn_post_norm", "ffn_residual", "ple_gate", "ple_act", "ple_proj", "ple_post_norm",
  "layer_output", "output_norm", "output", "softcap" }

-- check_filter(filter, n_layers) -> filter, or nil and a message. filter: { layers = {0-based} |
-- "all" | nil, ops = { names } | "all" | nil }; n_layers bounds the layers when known.
function M.check_filter(filter, n_layers)
  if filter == nil then return nil end
  if type(filter) ~= "table" then return nil, "trace filter must be a table { layers = ..., ops = ... }" end
  local out = {}
  if filter.layers ~= nil and filter.layers ~= "all" then
    if type(filter.layers) ~= "table" then return nil, "trace layers must be 'all' or a list of layer numbers" end
    for _, l in ipairs(filter.layers) do
      if math.type(l) ~= "integer" or l < 0 or (n_layers and l >= n_layers) then
        return nil, string.format("trace layer %s is not a layer of the model (0..%s)", tostring(l),
          n_layers and tostring(n_layers - 1) or "?")
      end
    end
    out.layers = filter.layers
  end
  if filter.ops ~= nil and filter.ops ~= "all" then
    if type(filter.ops) ~= "table" then return nil, "trace ops must be 'all' or a list of op names" end
    local known = {}
    for _, name in ipairs(M.OPS) do known[name] = true end
    for _, name in ipairs(filter.ops) do
      if not known[name] then
        return nil, string.format("unknown trace op '%s' (ops: %s)", tostring(name), table.concat(M.OPS, ", "))
      end
    end
    out.ops = filter.ops
  end
  return out
end

-- ember.trace(path [, model [, filter]]) -> Trace. The header records what does not belong in the
-- normalized fingerprint: the version, the model's path and its settings, and the filter (which
-- op lines the trace keeps: `layers` and `ops`, see check_filter; the eval lines are always kept).
function M.open(path, model, filter)
  if type(path) ~= "string" or path == "" then
    error("bad argument #1 to 'trace' (file path expected, got " .. type(path) .. ")", 2)
  end
  local f, ferr = M.check_filter(filter, model ~= nil and model.info.n_layers or nil)
  if ferr then error("bad argument #3 to 'trace' (" .. ferr .. ")", 2) end
  local t = internal.trace_open(path)
  if f then internal.trace_filter(t, f.layers, f.ops) end
  local head = { event = "trace_start", ember = core.version }
  local keys = { "event", "ember", "model", "family", "dtype", "kernels", "threads", "kv_cache", "layers", "ops" }
  if model ~= nil then
    local info = model.info
    head.model, head.family, head.dtype = info.path, info.family, info.dtype_summary
    head.kernels, head.threads, head.kv_cache = info.kernels, info.threads, info.kv_cache
  end
  if f and f.layers then head.layers = json.array({ table.unpack(f.layers) }) end
  if f and f.ops then head.ops = json.array({ table.unpack(f.ops) }) end
  internal.trace_write(t, json.encode(json.ordered(keys, head)))
  rawset(M, "last_path", path)
  return t
end

-- trace:finish() -> { events, evaluations, fingerprint }: the summary line, then the file is closed
-- (raises if any write failed). A trace still attached to a running session cannot finish.
function M.finish(t)
  local s = { events = t.events, evaluations = t.evaluations, fingerprint = t:fingerprint() }
  internal.trace_write(t, json.encode(json.ordered({ "event", "events", "evaluations", "fingerprint" },
    { event = "trace_end", events = s.events, evaluations = s.evaluations, fingerprint = s.fingerprint })))
  t:close()
  return s
end
Trace.__methods.finish = M.finish

-- for_model(model [, t]): the trace of ember.load{trace=} (get, or set when t is given).
function M.for_model(model, t)
  if t ~= nil then by_model[model] = t end
  return by_model[model]
end
core.classes.Model.__getters.trace = function(m) return by_model[m] end

return M
