-- helpers.cli — run the `ember` command in-process with captured stdout/stderr, and find the
-- default tiny model (a missing one makes the calling spec pending, naming why).

local cli = require("ember.cli")
local models = require("helpers.models")

local M = {}

-- An output sink with :write/:flush that keeps everything written.
function M.sink()
  local parts = {}
  return { write = function(self, ...)
      for _, s in ipairs({ ... }) do parts[#parts + 1] = tostring(s) end
      return self
    end,
    flush = function() end, text = function() return table.concat(parts) end }
end

-- ember(args...) -> exit code, stdout, stderr
function M.ember(...)
  local out, err = M.sink(), M.sink()
  local code = cli.main({ ... }, { stdout = out, stderr = err })
  return code, out:text(), err:text()
end

local model_path, why
-- need_model() -> path of the default tiny model, or nil after marking the spec pending
function M.need_model()
  if model_path == nil and why == nil then model_path, why = models.default_model() end
  if not model_path then pending("default tiny model unavailable: " .. tostring(why)) end
  return model_path
end

return M
