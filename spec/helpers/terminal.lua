-- terminal.lua — a program in a real pseudo-terminal (a tmux session) for the specs: keys in,
-- the screen out, and waiting until the screen shows something.
local M = {}

function M.sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local s = p:read("a")
  p:close()
  return s
end

function M.available() return os.execute("command -v tmux >/dev/null 2>&1") end

-- Whether a terminal spec can run: tmux, the built `binary` and the `model` fixture are there;
-- otherwise the calling block is marked pending, naming what is missing.
function M.ready(binary, model)
  local exists = require("helpers.fixtures").exists
  local missing = not M.available() and "tmux is not installed (apt-get install tmux)"
    or not exists(binary) and "missing " .. binary .. " (build the project first)"
    or not exists(model) and "missing fixture " .. model
  if missing then pending(missing) end
  return not missing
end

-- How often `want` stands in `s` (plain text, not a pattern).
function M.count(s, want)
  local n, from = 0, 1
  while true do
    local a, b = s:find(want, from, true)
    if not a then return n end
    n, from = n + 1, b + 1
  end
end

-- Key names are sent as keys, everything else literally (-l): tmux would read the text "end" as
-- the End key.
local KEYS = { Enter = true, Tab = true, Up = true, ["C-c"] = true, ["C-d"] = true, ["C-u"] = true }

-- A session named PREFIX-<time>-<random> (not started: the spec starts it and chooses the
-- program; t.name may be changed to address another pane). opts.join: capture wrapped lines
-- joined (capture-pane -J).
function M.session(prefix, opts)
  local t = { name = prefix .. "-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6)) }
  local capture = "tmux capture-pane -p" .. ((opts and opts.join) and " -J" or "") .. " -t "
  function t.send(...)
    for _, k in ipairs({ ... }) do
      local quoted = "'" .. k:gsub("'", "'\\''") .. "'"
      M.sh("tmux send-keys -t " .. t.name .. (KEYS[k] and " " or " -l ") .. quoted)
    end
  end
  function t.screen() return M.sh(capture .. t.name) end
  -- Waits (up to 30 s, for a loaded machine) until test(screen) holds; returns the screen.
  function t.wait_until(what, test)
    local s
    for _ = 1, 600 do
      s = t.screen()
      if test(s) then return s end
      os.execute("sleep 0.05")
    end
    error("the terminal never showed " .. what .. "; screen:\n" .. s, 3)
  end
  -- Waits until the screen shows `want` at least `n` (default 1) times.
  function t.wait_for(want, n)
    n = n or 1
    return t.wait_until(string.format("%q x%d", want, n), function(s) return M.count(s, want) >= n end)
  end
  return t
end

return M
