-- check_layers.lua — the layers' arrows (docs/architecture.md) checked on what the build does: includes
-- resolved and realpath'd, the layer libraries' symbols (nm), the Lua side's requires. Reads only.
--
-- lua5.4 tests/check_layers.lua SOURCE_DIR BUILD_DIR [kernels=LIB.a ...]
--   Includes: every C file's "..." and <...> includes are looked up as the compiler does (the file's
--   own directory for "...", then the -iquote/-I/-isystem directories of its compile command in
--   BUILD_DIR/compile_commands.json, then the compiler's own list; a header is looked up with the
--   directories of the files that include it); the hit is `realpath`ed and the room it lands in
--   must be one the includer may use (INCLUDES). SOURCE_DIR may be a copy of the tree the build was
--   made from: the build's source paths are read under SOURCE_DIR.
--   Symbols: the undefined symbols of each layer library (BUILD_DIR/libember_*.a, or NAME=FILE) may
--   be defined by the libraries below it (USES) or outside ember, never by a layer above or beside
--   it; Lua's (CMakeCache.txt's LUA_LIBRARY) only under the bindings.
--   Lua: lib/ and scripts/ require modules of lib/ and the C modules the library loads (C_MODULES)
--   only, never a spec helper; nothing in lib/ loads C through package.loadlib.
-- Exit 0 when the arrows hold, 1 naming every wrong one, 77 (skip) without a compile database.
local cjson = require("cjson")

-- The rooms of the tree. `tests` (tests/, fuzz/) sits on top and may reach inside every layer.
local ROOMS = {
  { dir = "src/kernels", room = "kernels" },
  { dir = "src/tokenizer", room = "tokenizer" },
  { dir = "src/engine", room = "engine" },
  { dir = "include", room = "public" },
  { dir = "tools", room = "tools" },
  { dir = "src/lua_bindings", room = "bindings" },
  { dir = "tests", room = "tests" },
  { dir = "fuzz", room = "tests" },
}
local WHERE = { -- how a message names a room
  kernels = "the kernels", tokenizer = "the tokenizer", engine = "the engine", public = "include/",
  tools = "the tools", bindings = "the bindings", tests = "the tests", lua = "Lua",
}

-- What a room's files may include: INCLUDES[from][to] is "all", or the set of `to`'s headers that
-- are its interface (docs/architecture.md's table). Headers outside the tree (the system's) are
-- allowed everywhere, Lua's only where listed; a room missing under `from` is out of its reach.
local KERNELS_API = { ["types.h"] = true, ["cpu.h"] = true } -- what include/ember.h shows
local KERNELS_INTERFACE = { ["types.h"] = true, ["cpu.h"] = true, ["kernels.h"] = true, ["threads.h"] = true }
local TOKENIZER_API = { ["tokenizer.h"] = true } -- tokenizer_internal.h and unicode.h are its own
local INCLUDES = {
  kernels = {},
  tokenizer = { kernels = { ["types.h"] = true } },
  engine = { public = "all", tokenizer = TOKENIZER_API, kernels = KERNELS_INTERFACE },
  public = { tokenizer = TOKENIZER_API, kernels = KERNELS_API },
  tools = { public = "all", engine = "all", tokenizer = TOKENIZER_API, kernels = "all" },
  bindings = { public = "all", lua = "all" },
  tests = { bindings = "all", tools = "all", public = "all", engine = "all", tokenizer = TOKENIZER_API,
    kernels = "all", lua = "all" },
}

-- The layer libraries, each with the libraries whose symbols it may use. The tools sit beside the
-- engine: they use it, the engine never uses them; the bindings use both, and Lua.
local LIBRARIES = { "kernels", "tokenizer", "engine", "tools", "bindings" }
local ARCHIVES = { kernels = "libember_kernels.a", tokenizer = "libember_tokenizer.a", engine = "libember_engine.a",
  tools = "libember_tools.a", bindings = "libember_lua_core.a" }
local USES = {
  kernels = {},
  tokenizer = { kernels = true },
  engine = { tokenizer = true, kernels = true },
  tools = { engine = true, tokenizer = true, kernels = true },
  bindings = { tools = true, engine = true, tokenizer = true, kernels = true, lua = true },
}

-- The C modules lib/ and scripts/ may require: the bindings' core and the chosen libraries.
local C_MODULES = { ["ember.core"] = true, lpeg = true, cjson = true }
local LUA_PATH = { "lib/?.lua", "lib/?/init.lua", "spec/?.lua" } -- as .busted sets it

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function lines_of(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

local function dirname(p) return (p:match("^(.*)/[^/]*$")) or "." end
local function basename(p) return (p:match("([^/]*)$")) end
local function possessive(s) return s:match("s$") and s .. "'" or s .. "'s" end
local function under(p, dir) return p:sub(1, #dir + 1) == dir .. "/" end
local function rel(root, p) return under(p, root) and p:sub(#root + 2) or p end

-- realpath of many existing paths, a bounded command line at a time: path -> real path
local function realpaths(paths)
  local list, seen, real = {}, {}, {}
  for _, p in ipairs(paths) do
    if not seen[p] then seen[p] = true; list[#list + 1] = p end
  end
  for i = 1, #list, 200 do
    local args = {}
    for j = i, math.min(i + 199, #list) do args[#args + 1] = shell_quote(list[j]) end
    local out = lines_of("realpath -e -- " .. table.concat(args, " "))
    assert(#out == #args, "realpath did not resolve every path")
    for j = 1, #out do real[list[i + j - 1]] = out[j] end
  end
  return real
end
local function realpath(p) return realpaths({ p })[p] end

-- the files of the tree under DIRS whose names end in one of EXTS, as absolute paths
local function tree_files(root, dirs, exts)
  local names = {}
  for _, e in ipairs(exts) do names[#names + 1] = "-name '*." .. e .. "'" end
  local out = lines_of("cd " .. shell_quote(root) .. " && find " .. table.concat(dirs, " ") .. " -type f \\( "
    .. table.concat(names, " -o ") .. " \\) 2>/dev/null | sort")
  for i, f in ipairs(out) do out[i] = root .. "/" .. f end
  return out
end

-- a compile command split into arguments (the shell's quoting, as CMake writes it)
local function split_command(cmd)
  local args, cur, quote = {}, nil, nil
  local i = 1
  while i <= #cmd do
    local c = cmd:sub(i, i)
    if c == "\\" and quote ~= "'" then
      i = i + 1
      cur = (cur or "") .. cmd:sub(i, i)
    elseif quote then
      if c == quote then quote = nil else cur = cur .. c end
    elseif c == '"' or c == "'" then
      quote, cur = c, cur or ""
    elseif c:match("%s") then
      if cur then args[#args + 1], cur = cur, nil end
    else
      cur = (cur or "") .. c
    end
    i = i + 1
  end
  if cur then args[#args + 1] = cur end
  return args
end

-- one compile command's include directories: { quote = {...}, dirs = {...} } (absolute)
local function include_dirs(args, directory, relocate)
  local flags = { quote = {}, dirs = {} }
  local function abs(p) return relocate(p:sub(1, 1) == "/" and p or directory .. "/" .. p) end
  local k = 1
  while k <= #args do
    local a = args[k]
    local opt, val = a:match("^(%-I)(.+)$")
    if not opt then opt, val = a:match("^(%-iquote)(.+)$") end
    if not opt and (a == "-I" or a == "-iquote" or a == "-isystem" or a == "-idirafter") then
      opt, val, k = a, args[k + 1], k + 1
    end
    if opt == "-iquote" then
      flags.quote[#flags.quote + 1] = abs(val)
    elseif opt then
      flags.dirs[#flags.dirs + 1] = abs(val)
    end
    k = k + 1
  end
  return flags
end

local function add_all(into, dirs)
  local grew = false
  into.seen = into.seen or {}
  for _, d in ipairs(dirs) do
    if not into.seen[d] then into.seen[d], into[#into + 1], grew = true, d, true end
  end
  return grew
end

-- BUILD_DIR/compile_commands.json: file -> include directories, and the compiler's command words
local function read_compile_commands(path, relocate)
  local f = io.open(path, "r")
  if not f then return nil end
  local entries = cjson.decode(f:read("a"))
  f:close()
  local by_file, compiler = {}, nil
  for _, e in ipairs(entries) do
    local args = e.arguments or split_command(e.command)
    local file = e.file:sub(1, 1) == "/" and e.file or e.directory .. "/" .. e.file
    local fl, into = include_dirs(args, e.directory, relocate), by_file[relocate(file)]
    if not into then
      into = { quote = {}, dirs = {} }
      by_file[relocate(file)] = into
    end
    add_all(into.quote, fl.quote) -- a file compiled by several targets: the union of their directories
    add_all(into.dirs, fl.dirs)
    if not compiler then
      compiler = {}
      for _, a in ipairs(args) do
        if a:sub(1, 1) == "-" then break end
        compiler[#compiler + 1] = shell_quote(a)
      end
    end
  end
  return by_file, compiler
end

-- the compiler's own search list for <...>, after the -I directories
local function system_dirs(compiler)
  local out = lines_of(table.concat(compiler, " ") .. " -E -x c -v /dev/null 2>&1 >/dev/null")
  local dirs, on = {}, false
  for _, l in ipairs(out) do
    if l:match("^#include <%.%.%.> search starts here") then
      on = true
    elseif l:match("^End of search list") then
      on = false
    elseif on then
      dirs[#dirs + 1] = l:match("^%s*(.-)%s*$")
    end
  end
  return dirs
end

-- the room of a real path: a room of the tree, "lua" (Lua's headers), "system", or nil (in the
-- tree but in no room)
local function room_of(real, root, lua_dir)
  for _, r in ipairs(ROOMS) do
    if under(real, root .. "/" .. r.dir) then return r.room end
  end
  if lua_dir and dirname(real) == lua_dir then return "lua" end
  if under(real, root) then return nil end
  return "system"
end

local function parse_includes(path)
  local incs, n = {}, 0
  for line in io.lines(path) do
    n = n + 1
    local open, name = line:match('^%s*#%s*include%s*([<"])([^>"]+)[>"]')
    if open then incs[#incs + 1] = { line = n, quoted = open == '"', name = name } end
  end
  return incs
end


-- the first hit of an include in the directories the compiler would search
local function lookup(file, inc, flags, sysdirs)
  local search = {}
  if inc.quoted then
    search[1] = dirname(file)
    for _, d in ipairs(flags.quote) do search[#search + 1] = d end
  end
  for _, d in ipairs(flags.dirs) do search[#search + 1] = d end
  for _, d in ipairs(sysdirs) do search[#search + 1] = d end
  for _, d in ipairs(search) do
    if exists(d .. "/" .. inc.name) then return d .. "/" .. inc.name end
  end
  return nil
end

-- Looks every include up; a header found takes the directories of the file that includes it (and is
-- "reached" when that file is compiled or reached), until nothing grows. Sets inc.real.
local function resolve_all(files, real, incs, flags, sysdirs)
  local function flags_of(r)
    flags[r] = flags[r] or { quote = {}, dirs = {} }
    return flags[r]
  end
  local real_hit, grew = {}, true
  while grew do
    grew = false
    local new = {}
    for _, f in ipairs(files) do
      for _, inc in ipairs(incs[f]) do
        inc.hit = lookup(f, inc, flags_of(real[f]), sysdirs)
        if inc.hit and not real_hit[inc.hit] then new[#new + 1] = inc.hit end
      end
    end
    for p, r in pairs(realpaths(new)) do real_hit[p] = r end
    for _, f in ipairs(files) do
      local fl = flags_of(real[f])
      for _, inc in ipairs(incs[f]) do
        inc.real = inc.hit and real_hit[inc.hit]
        if inc.real then
          local hf = flags_of(inc.real)
          grew = add_all(hf.quote, fl.quote) or grew
          grew = add_all(hf.dirs, fl.dirs) or grew
          if fl.reached and not hf.reached then hf.reached, grew = true, true end
        end
      end
    end
  end
end

-- whether a file of room `from` may include the header at real path `to_real` (in room `to`)
local function may_include(from, to, to_real)
  if to == "system" or to == from then return true end
  local allowed = to and INCLUDES[from][to]
  if type(allowed) == "table" then return allowed[basename(to_real)] == true end
  return allowed == "all"
end

-- the include arrows of every C file of the tree: report(msg) for each wrong one; the count checked
local function check_includes(ctx, report)
  local root = ctx.root
  local by_file, compiler = read_compile_commands(ctx.build .. "/compile_commands.json", ctx.relocate)
  if not by_file then return nil, "no " .. ctx.build .. "/compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS)" end
  local sysdirs = system_dirs(compiler or { "cc" })
  local files = tree_files(root, { "src", "include", "tools", "tests", "fuzz" }, { "c", "h" })
  local real, flags, incs = realpaths(files), {}, {}
  for f, fl in pairs(by_file) do
    local r = exists(f) and realpath(f)
    if r then flags[r] = { quote = fl.quote, dirs = fl.dirs, reached = true } end -- compiled by this build
  end
  for _, f in ipairs(files) do incs[f] = parse_includes(f) end
  resolve_all(files, real, incs, flags, sysdirs)
  local n = 0
  for _, f in ipairs(files) do
    local from, name = room_of(real[f], root, ctx.lua_dir), rel(root, real[f])
    if not from then report(name .. " belongs to no layer (tests/check_layers.lua's ROOMS)") end
    for _, inc in ipairs(from and incs[f] or {}) do
      n = n + 1
      local spelled = inc.quoted and '"' .. inc.name .. '"' or "<" .. inc.name .. ">"
      local to = inc.real and room_of(inc.real, root, ctx.lua_dir)
      if not inc.real then
        if flags[real[f]].reached then -- a file this build compiles, or a header one of them includes
          report(string.format("%s:%d: #include %s is found nowhere in the include path %s is compiled with",
            name, inc.line, spelled, name))
        end
      elseif not may_include(from, to, inc.real) then
        report(string.format("%s:%d: #include %s is %s: %s may not include %s", name, inc.line, spelled,
          rel(root, inc.real), WHERE[from], to and possessive(WHERE[to]) .. " " .. basename(inc.real) or "it"))
      end
    end
  end
  return n
end

-- nm of a library: defined[symbol] = member, undefined = { {symbol, member}, ... }
local function symbols(lib, dynamic)
  local out = lines_of("nm -A -P -g " .. (dynamic and "-D " or "") .. shell_quote(lib) .. " 2>/dev/null")
  local defined, undefined = {}, {}
  for _, l in ipairs(out) do
    local where, sym, kind = l:match("^(.-):%s+(%S+)%s+(%a)")
    if where then
      sym = sym:gsub("@.*$", "") -- a shared library's version (lua_gettop@@LUA_5.4)
      local member = where:match("%[(.-)%]$") or basename(where)
      if kind == "U" or kind == "w" or kind == "v" then
        undefined[#undefined + 1] = { sym, member }
      else
        defined[sym] = defined[sym] or member
      end
    end
  end
  return defined, undefined
end

-- every layer library's undefined symbols against who defines them: report(msg) for each wrong one
local function check_symbols(ctx, report)
  local defs, undefs = {}, {}
  for _, name in ipairs(LIBRARIES) do
    if not exists(ctx.libs[name]) then return nil, ctx.libs[name] .. " (" .. name .. ") does not exist" end
    defs[name], undefs[name] = symbols(ctx.libs[name])
  end
  if ctx.lua_library then defs.lua = symbols(ctx.lua_library, ctx.lua_library:match("%.so[.%d]*$") ~= nil) end
  local n = 0
  for _, name in ipairs(LIBRARIES) do
    for _, u in ipairs(undefs[name]) do
      local sym, member = u[1], u[2]
      if not defs[name][sym] then
        n = n + 1
        for other, d in pairs(defs) do
          if other ~= name and d[sym] and not USES[name][other] then
            local by = other == "lua" and basename(ctx.lua_library) or d[sym] .. " in " .. basename(ctx.libs[other])
            report(string.format("%s (%s): %s uses %s, defined by %s (%s)", basename(ctx.libs[name]), WHERE[name],
              member, sym, WHERE[other], by))
            break
          end
        end
      end
    end
  end
  return n
end

-- the module a require names, as a file of the tree (LUA_PATH), or nil
local function find_module(root, name)
  for _, t in ipairs(LUA_PATH) do
    local p = root .. "/" .. t:gsub("%?", (name:gsub("%.", "/")))
    if exists(p) then return p end
  end
  return nil
end

-- lib/ and scripts/: what their requires reach, and no package.loadlib in lib/
local function check_requires(ctx, report)
  local root, n = ctx.root, 0
  for _, f in ipairs(tree_files(root, { "lib", "scripts" }, { "lua" })) do
    local name, in_lib, ln = rel(root, f), under(f, root .. "/lib"), 0
    for line in io.lines(f) do
      ln = ln + 1
      local code = line:match("^%s*%-%-") and "" or line
      for mod, after in code:gmatch("require%s*%(?%s*[\"']([%w_.]+)[\"']%s*()") do
        local p = find_module(root, mod)
        if code:sub(after, after + 1) == ".." then -- a name completed at run time: not checked
        elseif p and not under(p, root .. "/lib") then
          report(string.format("%s:%d: require(\"%s\") is %s, a spec helper", name, ln, mod, rel(root, p)))
        elseif not p and not C_MODULES[mod] then
          report(string.format("%s:%d: require(\"%s\") is no module of lib/ nor a C module the library loads (%s)",
            name, ln, mod, "ember.core, lpeg, cjson"))
        end
        n = n + 1
      end
      if in_lib and code:find("package%.loadlib") then
        report(string.format("%s:%d: package.loadlib: the library reaches C through ember.core only", name, ln))
      end
    end
  end
  return n
end

-- CMakeCache.txt's value of KEY, or nil
local function cache_value(build, key)
  local f = io.open(build .. "/CMakeCache.txt", "r")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text:match("\n" .. key .. ":[%w_]+=([^\n]*)")
end

local function context(argv)
  local root, build = argv[1], argv[2]
  if not root or not build then
    io.stderr:write("usage: lua5.4 check_layers.lua SOURCE_DIR BUILD_DIR [kernels=LIB.a ...]\n")
    os.exit(2)
  end
  local ctx = { root = realpath(root), build = build, libs = {} }
  for _, name in ipairs(LIBRARIES) do ctx.libs[name] = build .. "/" .. ARCHIVES[name] end
  for i = 3, #argv do
    local k, v = argv[i]:match("^(%w+)=(.*)$")
    if not (k and ctx.libs[k]) then
      io.stderr:write("check_layers.lua: unknown argument '", argv[i], "'\n")
      os.exit(2)
    end
    ctx.libs[k] = v
  end
  local built_from = cache_value(build, "CMAKE_HOME_DIRECTORY")
  built_from = built_from and exists(built_from) and realpath(built_from) or ctx.root
  ctx.relocate = function(p) return under(p, built_from) and ctx.root .. p:sub(#built_from + 1) or p end
  local lua_dir = cache_value(build, "LUA_INCLUDE_DIR")
  ctx.lua_dir = lua_dir and exists(lua_dir .. "/lua.h") and realpath(lua_dir) or nil
  ctx.lua_library = cache_value(build, "LUA_LIBRARY")
  return ctx
end

local function main(argv)
  local ctx = context(argv)
  local bad = 0
  local function report(msg) bad = bad + 1; print("layer violation: " .. msg) end
  local n_inc, err = check_includes(ctx, report)
  if not n_inc then print("skipped: " .. err); os.exit(77) end
  local n_sym, serr = check_symbols(ctx, report)
  if not n_sym then print("check_layers: " .. serr); os.exit(1) end
  local n_req = check_requires(ctx, report)
  if bad > 0 then
    print(bad .. " layer violation(s)")
    os.exit(1)
  end
  print(string.format("layers hold: %d includes, %d undefined symbols of the layer libraries, %d requires of lib/ "
    .. "and scripts/; kernels <- tokenizer <- engine <- tools, bindings <- lib <- scripts", n_inc, n_sym, n_req))
end

main(arg)
