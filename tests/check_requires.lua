-- check_requires.lua LIB_DIR — the require graph of the Lua library (LIB_DIR/ember/**/*.lua): no
-- cycle; no library module requiring the facade (`ember`) or a front-end (`ember.cli`, `ember.cli.*`);
-- nothing requiring a compatibility alias, and every alias only `return require("ember.ROOM.NAME")`.
-- Must not load the modules it checks: it reads their tokens (LPeg), so comments and strings never count.
-- Whether a require names a module that exists at all is tests/check_layers.lua's check, not this one's.
--
-- Roles, by place: lib/ember/init.lua is the facade, lib/ember/cli.lua and lib/ember/cli/ the
-- front-ends, any other file directly in lib/ember an alias kept for a documented old path, and
-- every file in the other rooms (model/, run/, store/, analysis/, sweep/, experiments/) the library.
-- A require whose name is built (`require("ember.experiments." .. name)`) is an arrow to every module
-- under that prefix. Exit status 0 when the graph holds, 1 with one line per problem otherwise.
local lpeg = require("lpeg")
local P, R, S, C, Cb, Cc, Cg, Cmt, Cp, Ct = lpeg.P, lpeg.R, lpeg.S, lpeg.C, lpeg.Cb, lpeg.Cc, lpeg.Cg, lpeg.Cmt,
  lpeg.Cp, lpeg.Ct

local lib = arg[1]
if not lib or lib == "" then
  io.stderr:write("usage: check_requires.lua LIB_DIR (the directory holding ember/)\n")
  os.exit(2)
end

-- ---- tokens: names, strings, and one-character (or `..`) operators; comments and spaces skipped ----
local long_open = "[" * Cg(P("=") ^ 0, "eq") * "["
local long_close = Cmt("]" * C(P("=") ^ 0) * "]" * Cb("eq"), function(_, _, a, b) return a == b end)
local long_string = long_open * C((1 - long_close) ^ 0) * long_close
local function quoted(q) return q * C((P("\\") * 1 + (1 - S(q .. "\\\n"))) ^ 0) * q end
local str = quoted('"') + quoted("'") + long_string
local comment = "--" * (long_string / 0 + (1 - P("\n")) ^ 0)
local name = (R("az", "AZ") + "_") * (R("az", "AZ", "09") + "_") ^ 0
local token = Ct(Cg(Cp(), "pos") * (Cg(Cc("string"), "kind") * Cg(str, "value")
  + Cg(Cc("name"), "kind") * Cg(C(name), "value")
  + Cg(Cc("op"), "kind") * Cg(C(P("..") + 1), "value")))
local tokens = Ct(((S(" \t\r\n\f\v") ^ 1 + comment) + token) ^ 0) * Cp()

local function line_of(text, pos)
  local _, n = text:sub(1, pos):gsub("\n", "")
  return n + 1
end

-- requires(text) -> { { name =, prefix = bool, line = }, ... }, or nil, message
local function requires(text)
  local toks, stop = tokens:match(text)
  if stop <= #text then return nil, "cannot read the text from line " .. line_of(text, stop) end
  local found = {}
  for i, t in ipairs(toks) do
    if t.kind == "name" and t.value == "require" then
      local j = i + 1
      -- require "x", require("x"), pcall(require, "x")
      if toks[j] and toks[j].kind == "op" and (toks[j].value == "(" or toks[j].value == ",") then j = j + 1 end
      local s = toks[j]
      if s and s.kind == "string" then
        local nxt = toks[j + 1]
        found[#found + 1] = { name = s.value, prefix = nxt ~= nil and nxt.value == "..", line = line_of(text, t.pos) }
      end
    end
  end
  return found
end

-- ---- the modules: file, name, role ------------------------------------------------------------------
local function module_name(rel) -- "ember/store/fs.lua" -> "ember.store.fs"; "ember/sweep/init.lua" -> "ember.sweep"
  return (rel:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))
end

local function role(rel)
  if rel == "ember/init.lua" then return "facade" end
  if rel == "ember/cli.lua" or rel:match("^ember/cli/") then return "front-end" end
  if rel:match("^ember/[^/]+%.lua$") then return "alias" end
  return "library"
end

local function read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text = f:read("a")
  f:close()
  return text
end

local problems = {}
local function problem(fmt, ...) problems[#problems + 1] = string.format(fmt, ...) end

local modules, by_name = {}, {}
local list = io.popen("cd '" .. lib:gsub("'", "'\\''") .. "' && find ember -name '*.lua' | LC_ALL=C sort")
for rel in list:lines() do
  local m = { rel = rel, file = lib .. "/" .. rel, name = module_name(rel), role = role(rel) }
  modules[#modules + 1], by_name[m.name] = m, m
end
list:close()
if #modules == 0 then
  io.stderr:write("check_requires: no Lua modules under " .. lib .. "/ember\n")
  os.exit(1)
end

-- ---- the arrows --------------------------------------------------------------------------------------
local function targets(req) -- the modules a require reaches: one, or every one under a built prefix
  if not req.prefix then return { by_name[req.name] } end
  local out = {}
  for _, m in ipairs(modules) do
    if m.name:sub(1, #req.name) == req.name then out[#out + 1] = m end
  end
  return out
end

local RULE = {
  facade = "a library module needs only ember.core and the library's own modules, never the facade",
  ["front-end"] = "a library module never requires a front-end (ember.cli, ember.cli.*)",
  alias = "an alias is for scripts written against an old path; the library names the room's module",
}

local function check_arrow(m, req, to)
  local where = m.file .. ":" .. req.line
  if to.role == "alias" then
    problem("%s: %s requires %s, an alias of %s: %s", where, m.name, to.name, to.target or "?", RULE.alias)
  elseif m.role == "library" then
    if to.role == "facade" or to.role == "front-end" then
      problem("%s: %s requires %s: %s", where, m.name, to.name, RULE[to.role])
    end
  elseif m.role == "facade" and to.role == "front-end" then
    problem("%s: the facade requires %s: %s", where, to.name, RULE["front-end"])
  end
end

for _, m in ipairs(modules) do
  local text, err = read(m.file)
  local reqs
  if text then reqs, err = requires(text) end
  if not reqs then
    problem("%s: %s", m.file, err)
    reqs = {}
  end
  m.reqs, m.arrows = reqs, {}
  if m.role == "alias" then
    local only = #reqs == 1 and not reqs[1].prefix and by_name[reqs[1].name]
    local body = text and text:gsub("%-%-[^\n]*", ""):gsub("%s+", " "):match("^ ?(.-) ?$")
    local target_ok = only and (only.role == "library" or only.role == "front-end")
    if not target_ok or body ~= string.format('return require("%s")', reqs[1].name) then
      problem("%s: a file directly in lib/ember besides init.lua and cli.lua is an alias: comments and "
        .. "`return require(\"ember.ROOM.NAME\")` of a module in a room, nothing else", m.file)
    else
      m.target = only.name
    end
  end
end

for _, m in ipairs(modules) do
  for _, req in ipairs(m.reqs) do
    if req.name == "ember" or req.name:match("^ember%.") then
      for _, t in ipairs(targets(req)) do
        check_arrow(m, req, t)
        m.arrows[#m.arrows + 1] = t
      end
    end
  end
end

-- ---- cycles: the strongly connected components of the graph (Tarjan); each of more than one module,
-- or a module requiring itself, is a cycle, reported with its members and one path round it ----------
local index, low, on_stack, stack, next_index = {}, {}, {}, {}, 1
local function cycle_path(members) -- one cycle through the component, from its first member
  local inside = {}
  for _, m in ipairs(members) do inside[m] = true end
  local start, path, seen = members[1], { members[1].name }, { [members[1]] = true }
  local function step(m)
    for _, t in ipairs(m.arrows) do
      if t == start then return true end
      if inside[t] and not seen[t] then
        seen[t], path[#path + 1] = true, t.name
        if step(t) then return true end
        seen[t], path[#path] = nil, nil
      end
    end
    return false
  end
  step(start)
  path[#path + 1] = start.name
  return table.concat(path, " -> ")
end
local function strong(m)
  index[m], low[m], next_index = next_index, next_index, next_index + 1
  stack[#stack + 1], on_stack[m] = m, true
  for _, t in ipairs(m.arrows) do
    if not index[t] then
      strong(t)
      low[m] = math.min(low[m], low[t])
    elseif on_stack[t] then
      low[m] = math.min(low[m], index[t])
    end
  end
  if low[m] ~= index[m] then return end
  local members = {}
  repeat
    local t = table.remove(stack)
    on_stack[t] = nil
    table.insert(members, 1, t)
  until t == m
  local self_loop = false
  for _, t in ipairs(m.arrows) do self_loop = self_loop or t == m end
  if #members > 1 or self_loop then
    table.sort(members, function(x, y) return x.name < y.name end)
    local names = {}
    for i, x in ipairs(members) do names[i] = x.name end
    problem("require cycle of %d module(s): %s (%s)", #members, table.concat(names, ", "), cycle_path(members))
  end
end
for _, m in ipairs(modules) do
  if not index[m] then strong(m) end
end

if #problems > 0 then
  for _, p in ipairs(problems) do print("requires: " .. p) end
  print(#problems .. " require problem(s)")
  os.exit(1)
end
print(string.format("requires hold: %d modules, no cycle, no library -> facade or front-end arrow", #modules))
