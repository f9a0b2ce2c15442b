-- ember.trace — structured traces from Lua: ember.trace(path [, model]) opens one (a header line,
-- then the engine's events), trace:finish() adds the summary line (events, evaluations, the
-- normalized fingerprint) and closes it. generate{trace=} and ember.load{trace=} attach one.
-- Must not write events itself: they come from the engine (src/engine/trace.c), in its field order.

local core = require("ember.core")
local json = require("ember.json")
local internal = core.internal

local M = {}

-- The trace ember.load{trace=} made for a model (weak keys: it goes when the model goes).
local by_model = setmetatable({}, { __mode = "k" })

local Trace = core.classes.Trace

-- ember.trace(path [, model]) -> Trace. The header records what does not belong in the normalized
-- fingerprint: the version, the model's path and its settings.
function M.open(path, model)
  if type(path) ~= "string" or path == "" then
    error("bad argument #1 to 'trace' (file path expected, got " .. type(path) .. ")", 2)
  end
  local t = internal.trace_open(path)
  local head = { event = "trace_start", ember = core.version }
  local keys = { "event", "ember", "model", "family", "dtype", "kernels", "threads", "kv_cache" }
  if model ~= nil then
    local info = model.info
    head.model, head.family, head.dtype = info.path, info.family, info.dtype_summary
    head.kernels, head.threads, head.kv_cache = info.kernels, info.threads, info.kv_cache
  end
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
