-- ember.run.shards — N shards of a resumable command as local processes (`ember sweep --jobs N`,
-- `ember quant-recipe --jobs N`): each an ordinary `ember COMMAND ... --shard I/N --out BASE/I` run
-- with its log and exit status beside it, their saved work polled while they run, Ctrl-C passed
-- on, a failed shard named with its log. Must not know what a shard computes: the caller counts it.

local fs = require("ember.store.fs")
local is_interrupt = require("ember.model.generate").is_interrupt

local M = {}

-- The largest shard log quoted when a shard fails.
local MAX_LOG_BYTES = 16 * 1024 * 1024

-- command() -> the shell words that start `ember`: $EMBER_COMMAND; else this very interpreter as
-- the ember command (`ember-lua -m ember.cli`, or `ember-lua .../cli.lua`); else `ember` on PATH.
function M.command()
  local env = os.getenv("EMBER_COMMAND")
  if env and env ~= "" then return env end
  if type(arg) == "table" and type(arg[0]) == "string" then
    if arg[0] == "ember.cli" and arg[-1] == "-m" and type(arg[-2]) == "string" then
      return fs.shell_quote(arg[-2]) .. " -m ember.cli"
    end
    if arg[0]:match("cli%.lua$") and type(arg[-1]) == "string" then
      return fs.shell_quote(arg[-1]) .. " " .. fs.shell_quote(arg[0])
    end
  end
  return "ember"
end

local function sleep(s) os.execute("sleep " .. s) end

-- run{ command = "sweep" (the subcommand's words), args = its flags (no --out/--jobs/--shard),
--      extra = shell words appended, n, base = the shards' parent directory, label = "sweep --jobs",
--      noun = "cells", count = function(dir) -> saved, total (of the whole job) or nil, on_count =
--      function(saved, total, before) or nil, finish = function(ok) or nil } -> the shard directories
--      BASE/0 .. BASE/N-1, every shard finished with exit 0
function M.run(o)
  local function fail(msg, ...) error(o.label .. ": " .. string.format(msg, ...), 0) end
  local n, base = o.n, o.base
  local ok, err = fs.mkdir_p(base)
  if not ok then fail("%s", err) end
  local words = {}
  for i, a in ipairs(o.args) do words[i] = fs.shell_quote(a) end
  local flags = table.concat(words, " ")
  local dirs, script = {}, {}
  for i = 0, n - 1 do
    dirs[i + 1] = fs.join(base, tostring(i))
    local log, st = fs.join(base, i .. ".log"), fs.join(base, i .. ".status")
    os.remove(st)
    script[#script + 1] = string.format("( %s %s %s --shard %d/%d --out %s%s >%s 2>&1; echo $? >%s ) &",
      M.command(), o.command, flags, i, n, fs.shell_quote(dirs[i + 1]), o.extra and (" " .. o.extra) or "",
      fs.shell_quote(log), fs.shell_quote(st))
  end
  local function saved()
    local done, total = 0, nil
    for _, d in ipairs(dirs) do
      local c, t = o.count(d)
      done, total = done + c, total or t
    end
    return done, total
  end
  local before = saved() -- what earlier runs left in the shard directories (resumed, not computed now)
  local done_file = fs.join(base, "done")
  os.remove(done_file)
  script[#script + 1] = "wait; : >" .. fs.shell_quote(done_file)
  os.execute("sh -c " .. fs.shell_quote(table.concat(script, "\n")) .. " </dev/null >/dev/null 2>&1 &")

  -- shard outputs are rewritten atomically, so they can be polled while the shards run
  local polled, perr = pcall(function()
    while true do
      local finished = fs.exists(done_file)
      if o.on_count then
        local done, total = saved()
        o.on_count(done, total, before)
      end
      if finished then break end
      sleep(0.3)
    end
  end)
  if o.finish then o.finish(polled) end
  local function interrupted_error()
    fail("interrupted: %d %s saved in %d shards, rerun the same command to resume", (saved()), o.noun, n)
  end
  if not polled then
    if not is_interrupt(perr) then error(perr, 0) end
    -- Ctrl-C reaches the shards too (one process group): each saves what it has and exits
    for _ = 1, 100 do
      if fs.exists(done_file) then break end
      sleep(0.1)
    end
    interrupted_error()
  end
  local failed, interrupted = {}, 0
  for i = 0, n - 1 do
    local st = fs.join(base, i .. ".status")
    local read, status = pcall(fs.read, st, st, 64)
    local code = read and math.tointeger(tonumber(status:match("^%s*(%-?%d+)"))) or nil
    if code ~= 0 then
      local log = fs.join(base, i .. ".log")
      local logged, text = pcall(fs.read, log, log, MAX_LOG_BYTES)
      text = logged and text or ("(" .. tostring(text) .. ")")
      failed[#failed + 1] = { i = i, code = code, log = log, text = text:gsub("%s+$", "") }
      -- a shard stopped by the same Ctrl-C says so, with its count or (stopped outside its work) bare
      if text:find("interrupted: %d+ " .. o.noun .. " saved") or text:find("interrupted%s*$") then
        interrupted = interrupted + 1
      end
    end
  end
  if #failed > 0 and interrupted == #failed then
    interrupted_error()
  elseif #failed > 0 then
    local f = failed[1]
    fail("shard %d/%d failed (exit %s); its log %s says: %s", f.i, n, tostring(f.code), f.log, f.text)
  end
  return dirs
end

return M
