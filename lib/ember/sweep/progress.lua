-- ember.sweep.progress — progress of a long run on stderr (a sweep's cells, an extraction's prompts,
-- a probe's iterations): done / total, rate and ETA.
-- Must not slow the sweep or clutter logs: on a terminal one line is rewritten in place (at most a
-- few times a second); elsewhere nothing is printed until the final summary line.

local store = require("ember.sweep.store")

local M = {}

-- Is file descriptor 2 a terminal?
function M.stderr_is_tty()
  return require("ember.store.fs").isatty(2)
end

local function duration(s)
  if s ~= s or s == math.huge then return "?" end
  if s < 60 then return string.format("%.0fs", s) end
  if s < 3600 then return string.format("%dm%02ds", s // 60, math.floor(s % 60)) end
  return string.format("%dh%02dm", s // 3600, math.floor((s % 3600) / 60))
end

-- new{ stream = io.stderr, mode = "auto"|"tty"|"summary"|"none", label = "sweep", unit = "cells",
--      resumable = true (false: the summary has no computed/resumed split) } -> reporter
-- with :start(total, already_done), :step(), :finish(ok). "auto" picks tty or summary.
function M.new(opts)
  opts = opts or {}
  local mode = opts.mode or "auto"
  if mode == "auto" then mode = M.stderr_is_tty() and "tty" or "summary" end
  local r = { stream = opts.stream or io.stderr, mode = mode, label = opts.label or "sweep",
    unit = opts.unit or "cells",
    resumable = opts.resumable ~= false, lines = 0 }
  function r:start(total, done)
    self.total, self.resumed, self.done, self.t0, self.last = total, done or 0, done or 0, store.now(), -1
  end
  function r:line()
    local dt = store.now() - self.t0
    local new = self.done - self.resumed
    local rate = dt > 0 and new / dt or 0
    local eta = rate > 0 and (self.total - self.done) / rate or math.huge
    return string.format("%s: %d/%d %s (%.0f%%), %.1f %s/s, ETA %s", self.label, self.done, self.total, self.unit,
      self.total > 0 and 100 * self.done / self.total or 100, rate, self.unit, duration(eta))
  end
  function r:step()
    self.done = self.done + 1
    if self.mode ~= "tty" then return end
    local t = store.now()
    if t - self.last < 0.2 and self.done < self.total then return end
    self.last = t
    self.stream:write("\r\27[K", self:line())
    self.lines = self.lines + 1
    if self.stream.flush then self.stream:flush() end
  end
  function r:finish(ok)
    if self.mode == "none" then return end
    if self.mode == "tty" then self.stream:write("\r\27[K") end
    local dt = store.now() - self.t0
    local new = self.done - self.resumed
    -- a run that cannot resume (an extraction, a probe's training) has nothing to split the count by
    local split = self.resumable and string.format(" (%d computed, %d resumed)", new, self.resumed) or ""
    self.stream:write(string.format("%s: %s %d/%d %s%s in %.1fs%s\n", self.label,
      ok and "done," or "stopped at", self.done, self.total, self.unit, split, dt,
      dt > 0 and new > 0 and string.format(", %.1f %s/s", new / dt, self.unit) or ""))
  end
  return r
end

return M
