-- ember.sweep.jobs — `ember sweep --jobs N`: the N shards of a sweep as local processes (each an
-- `ember sweep --shard I/N`), their progress summed on stderr, then one merge into --out.
-- Must not compute cells itself: every shard is an ordinary, resumable `ember sweep` run.

local fs = require("ember.store.fs")
local json = require("ember.store.json")
local store = require("ember.sweep.store")
local is_interrupt = require("ember.model.generate").is_interrupt

local M = {}

-- The largest shard log quoted when a shard fails.
local MAX_LOG_BYTES = 16 * 1024 * 1024

local function fail(msg, ...) error("sweep --jobs: " .. string.format(msg, ...), 0) end

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

local function cells_in(dir)
  local read, text = pcall(fs.read, fs.join(dir, store.MANIFEST), dir, store.MAX_MANIFEST_BYTES)
  if not read then return 0, nil end
  local ok, doc = pcall(json.decode, text)
  if not ok or type(doc) ~= "table" or type(doc.cells) ~= "table" then return 0, nil end
  local counted, total = pcall(store.grid_cells, type(doc.grid) == "table" and doc.grid or {}, dir)
  return #doc.cells, counted and total or nil
end

-- run{ args = shard flags (no --out/--jobs), out, jobs, progress, stderr } -> merge result
function M.run(o)
  local n = o.jobs
  local base = o.out .. ".shards"
  local ok, err = fs.mkdir_p(base)
  if not ok then fail("%s", err) end
  local cmd = M.command()
  local words = {}
  for i, a in ipairs(o.args) do words[i] = fs.shell_quote(a) end
  local flags = table.concat(words, " ")
  local dirs, script = {}, {}
  for i = 0, n - 1 do
    dirs[i + 1] = fs.join(base, tostring(i))
    local log, st = fs.join(base, i .. ".log"), fs.join(base, i .. ".status")
    os.remove(st)
    script[#script + 1] = string.format(
      "( %s sweep %s --shard %d/%d --out %s --progress none >%s 2>&1; echo $? >%s ) &",
      cmd, flags, i, n, fs.shell_quote(dirs[i + 1]), fs.shell_quote(log), fs.shell_quote(st))
  end
  local before = 0 -- cells earlier runs left in the shard directories (resumed, not computed now)
  for _, d in ipairs(dirs) do before = before + cells_in(d) end
  local done_file = fs.join(base, "done")
  os.remove(done_file)
  script[#script + 1] = "wait; : >" .. fs.shell_quote(done_file)
  os.execute("sh -c " .. fs.shell_quote(table.concat(script, "\n")) .. " </dev/null >/dev/null 2>&1 &")

  -- shard outputs are rewritten atomically, so they can be polled while the shards run
  local progress, started = o.progress, false
  local function saved()
    local done = 0
    for _, d in ipairs(dirs) do done = done + cells_in(d) end
    return done
  end
  local polled, perr = pcall(function()
    while true do
      local finished = fs.exists(done_file)
      local done, total = 0, nil
      for _, d in ipairs(dirs) do
        local c, t = cells_in(d)
        done, total = done + c, total or t
      end
      if progress and total then
        if not started then progress:start(total, before); started = true end
        while progress.done < done do progress:step() end
      end
      if finished then break end
      sleep(0.3)
    end
  end)
  if progress and started then progress:finish(polled) end
  if not polled then
    if not is_interrupt(perr) then error(perr, 0) end
    -- Ctrl-C reaches the shards too (one process group): each saves what it has and exits
    for _ = 1, 100 do
      if fs.exists(done_file) then break end
      sleep(0.1)
    end
    fail("interrupted: %d cells saved in %d shards, rerun the same command to resume", saved(), n)
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
      -- a shard stopped by the same Ctrl-C says so, with its count or (stopped outside its cells) bare
      if text:find("interrupted: %d+ cells saved") or text:find("interrupted%s*$") then
        interrupted = interrupted + 1
      end
    end
  end
  if #failed > 0 and interrupted == #failed then
    fail("interrupted: %d cells saved in %d shards, rerun the same command to resume", saved(), n)
  elseif #failed > 0 then
    local f = failed[1]
    fail("shard %d/%d failed (exit %s); its log %s says: %s", f.i, n, tostring(f.code), f.log, f.text)
  end
  local res = require("ember.sweep.merge").merge(o.out, dirs)
  return { status = res.manifest.status, merged = res, shards = dirs }
end

return M
