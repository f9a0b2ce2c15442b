-- ember.cli.repl — the interactive loop of ember-lua: multi-line input, `=expr` and bare-expression
-- printing, readable values, completion of globals and of fields/methods of tables and ember
-- userdata. Terminal I/O comes from the host's `rl` table (readline glue in main.c), so
-- everything here can be tested without a terminal. Must not swallow a user's error silently.

local M = {}

M.prompt, M.prompt2 = "> ", ">> "

local KEYWORDS = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
  "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}

-- ---- compiling ------------------------------------------------------------------------------

-- A chunk is incomplete when the parser stopped at the end of the input.
local function is_incomplete(msg) return msg:sub(-5) == "<eof>" end

-- Returns fn, or nil, message, incomplete. "=expr" and bare expressions are returned values.
function M.compile(src, env)
  env = env or _G
  if src:sub(1, 1) == "=" then src = "return " .. src:sub(2) end
  local fn = load("return " .. src, "=stdin", "t", env)
  if fn then return fn end
  local err
  fn, err = load(src, "=stdin", "t", env)
  if fn then return fn end
  return nil, err, is_incomplete(err)
end

-- ---- printing -------------------------------------------------------------------------------

local function is_identifier(s)
  return type(s) == "string" and s:match("^[%a_][%w_]*$") ~= nil
end

local function format_value(v, depth, seen)
  local t = type(v)
  if t == "string" then return depth == 0 and v or string.format("%q", v) end
  if t ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] then return "<cycle>" end
  if depth >= 2 then return tostring(v) end
  seen[v] = true
  local parts, n, limit = {}, 0, 24
  local len = #v
  for i = 1, len do
    n = n + 1
    if n > limit then break end
    parts[#parts + 1] = format_value(v[i], depth + 1, seen)
  end
  local keys = {}
  for k in pairs(v) do
    if not (math.type(k) == "integer" and k >= 1 and k <= len) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    n = n + 1
    if n > limit then break end
    local key = is_identifier(k) and k or ("[" .. format_value(k, depth + 1, seen) .. "]")
    parts[#parts + 1] = key .. " = " .. format_value(v[k], depth + 1, seen)
  end
  if n > limit then parts[#parts + 1] = "..." end
  seen[v] = nil
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- The REPL's rendering of the values a line returned, tab-separated like lua.c.
function M.format(...)
  local out = {}
  for i = 1, select("#", ...) do out[i] = format_value((select(i, ...)), 0, {}) end
  return table.concat(out, "\t")
end

-- ---- completion -----------------------------------------------------------------------------

local function safe_index(obj, key)
  local ok, v = pcall(function() return obj[key] end)
  if ok then return v end
end

-- Names an object offers: table keys (following __index tables), and for userdata what its
-- metatable lists (__methods, __getters, __fields of ember classes, or an __index table).
local function members(obj, methods_only)
  local names, seen = {}, {}
  local function add(name, value_is_fn)
    if is_identifier(name) and not seen[name] and (not methods_only or value_is_fn) then
      seen[name] = true
      names[#names + 1] = name
    end
  end
  local function add_table(t, depth)
    if type(t) ~= "table" or depth > 8 then return end
    for k, v in next, t do add(k, type(v) == "function") end
    local mt = getmetatable(t)
    if type(mt) == "table" and type(rawget(mt, "__index")) == "table" then
      add_table(rawget(mt, "__index"), depth + 1)
    end
  end
  if type(obj) == "table" then
    add_table(obj, 0)
    local mt = getmetatable(obj)
    local methods = type(mt) == "table" and rawget(mt, "__methods")
    if type(methods) == "table" then -- a class written in Lua (an ActivationCache)
      for k, v in pairs(methods) do add(k, type(v) == "function") end
    end
  else
    local mt = getmetatable(obj)
    if type(mt) == "table" then
      for _, list in ipairs({ "__methods", "__getters" }) do
        local t = rawget(mt, list)
        if type(t) == "table" then
          for k in pairs(t) do add(k, list == "__methods") end
        end
      end
      local fields = rawget(mt, "__fields")
      if type(fields) == "table" then
        for _, k in ipairs(fields) do add(k, false) end
      end
      if type(rawget(mt, "__index")) == "table" then add_table(rawget(mt, "__index"), 0) end
    end
  end
  return names
end

-- The object a path names in env: identifiers joined by '.', and [N] integer indexes
-- ("c.after_layer[3]"); nil when the path is not one or names nothing.
local function resolve(path, env)
  local first, rest = path:match("^([%a_][%w_]*)(.*)$")
  if not first then return nil end
  local obj = safe_index(env, first)
  while obj ~= nil and rest ~= "" do
    local name, after = rest:match("^%.([%a_][%w_]*)(.*)$")
    local index
    if not name then index, after = rest:match("^%[%s*(%-?%d+)%s*%](.*)$") end
    if not (name or index) then return nil end
    obj = safe_index(obj, name or math.tointeger(tonumber(index)))
    rest = after
  end
  return obj
end

-- Completions of `text` (the word before the cursor, e.g. "ember.ten", "m:gen" or
-- "c.after_layer[3]:l2"): full replacement strings, sorted. After a '[' not closed yet
-- ("t[i"), the word after it is completed as a word of its own.
function M.complete(text, env)
  env = env or _G
  local open = text:match("^.*()%[[^%]]*$")
  if open then
    local out = {}
    for _, c in ipairs(M.complete(text:sub(open + 1), env)) do out[#out + 1] = text:sub(1, open) .. c end
    return out
  end
  local path, sep, partial = text:match("^(.-)([%.:]?)([%w_]*)$")
  if not path then return {} end
  local out = {}
  if sep == "" then
    if path ~= "" then return {} end
    for _, name in ipairs(members(env, false)) do
      if name:sub(1, #partial) == partial then out[#out + 1] = name end
    end
    for _, kw in ipairs(KEYWORDS) do
      if kw:sub(1, #partial) == partial then out[#out + 1] = kw end
    end
  else
    local obj = resolve(path, env)
    if obj == nil then return {} end
    for _, name in ipairs(members(obj, sep == ":")) do
      if name:sub(1, #partial) == partial then out[#out + 1] = path .. sep .. name end
    end
  end
  table.sort(out)
  return out
end

-- ---- the loop -------------------------------------------------------------------------------

local function history_path()
  local p = os.getenv("EMBER_HISTORY")
  if p and p ~= "" then return p end
  local home = os.getenv("HOME")
  if home and home ~= "" then return home .. "/.ember_history" end
end

-- Error handler for evaluated lines: the traceback without the REPL's own frames.
local function traceback(msg)
  if type(msg) ~= "string" then
    local mt = getmetatable(msg)
    msg = (mt and mt.__tostring) and tostring(msg) or ("(error object is a " .. type(msg) .. " value)")
  end
  local tb = debug.traceback(msg, 2)
  local cut = tb:find("\n%s*%[C%]: in function 'xpcall'")
  return cut and tb:sub(1, cut - 1) or tb
end

-- Evaluates one complete chunk; prints its values or its error. Returns true on success.
function M.eval(fn, out, err)
  out, err = out or io.stdout, err or io.stderr
  local res = table.pack(xpcall(fn, traceback))
  if not res[1] then
    err:write(tostring(res[2]), "\n")
    return false
  end
  if res.n > 1 then out:write(M.format(table.unpack(res, 2, res.n)), "\n") end
  return true
end

-- help([obj]): the REPL's global `help` — the ember module's functions with one line each, or
-- the methods and properties of an ember object (lib/ember/cli/help.lua holds the lines).
function M.help(obj)
  io.write(require("ember.cli.help").text(obj))
end

-- rl: { readline(prompt) -> line | nil (end) | false (Ctrl-C), add_history(line),
--       load_history(path)?, set_completer(fn)? }
function M.run(rl)
  local hist = history_path()
  if hist and rl.load_history then pcall(rl.load_history, hist) end
  if rl.set_completer then rl.set_completer(function(text) return M.complete(text) end) end
  if rawget(_G, "ember") == nil then
    local ok, ember = pcall(require, "ember")
    if ok then rawset(_G, "ember", ember) end
  end
  if rawget(_G, "help") == nil then rawset(_G, "help", M.help) end
  local core_ok, core = pcall(require, "ember.core")
  io.write(string.format("ember-lua %s (%s); the ember module is the global `ember`; help() lists it. Ctrl-D exits.\n",
    core_ok and core.version or "?", _VERSION))
  local buffer, done = nil, false
  local function step()
    local line = rl.readline(buffer and M.prompt2 or M.prompt)
    if line == nil then
      done = true
      return
    end
    if line == false then -- Ctrl-C: abandon the chunk being typed
      buffer = nil
      return
    end
    if not buffer and line:match("^%s*$") then return end
    buffer = buffer and (buffer .. "\n" .. line) or line
    local fn, msg, incomplete = M.compile(buffer)
    if not fn and incomplete then return end
    rl.add_history(buffer)
    buffer = nil
    if not fn then
      io.stderr:write(msg, "\n")
      return
    end
    M.eval(fn)
  end
  while not done do
    -- Ctrl-C between lines lands here instead of ending the REPL
    local ok, err = pcall(step)
    if not ok then
      io.stderr:write(tostring(err), "\n")
      buffer = nil
    end
  end
  io.write("\n")
end

return M
