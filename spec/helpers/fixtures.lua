-- helpers.fixtures — where the specs find their inputs: the shared fixtures (EMBER_FIXTURES,
-- default ../shared/fixtures from the repository root), the build directory (EMBER_BUILD,
-- default build/) and tiny models made by build/make-tiny-model. A missing input makes a spec
-- pending with a message naming the file, never a silent pass.

local cjson = require("cjson")
local files = require("helpers.files")

local M = {}

M.root = os.getenv("EMBER_FIXTURES") or "../shared/fixtures"
M.build = os.getenv("EMBER_BUILD") or "build"

function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

function M.read_json(path)
  return cjson.decode(files.read(path))
end

-- Integers from JSON arrays (cjson decodes every number as a float).
function M.ints(list)
  local out = {}
  for i, v in ipairs(list) do out[i] = math.tointeger(v) or error("not an integer: " .. tostring(v)) end
  return out
end

local shell_quote = require("ember.store.fs").shell_quote

-- Names of the parity cases (sub-folders of <root>/<folder>, default "parity"), sorted; empty if
-- the folder is missing.
function M.parity_cases(folder)
  local dir = M.root .. "/" .. (folder or "parity")
  local p = io.popen("ls -1 " .. shell_quote(dir) .. " 2>/dev/null")
  local names = {}
  for line in p:lines() do
    if M.exists(dir .. "/" .. line .. "/case.json") or line:match("^%w+%-") then names[#names + 1] = line end
  end
  p:close()
  table.sort(names)
  return names, dir
end

local made = {}

-- Path of a tiny model made by build/make-tiny-model with the given flags (cached per flag set),
-- or nil and the reason.
function M.tiny_model(args)
  args = args or "--family llama --dtype f32 --layers 2"
  if made[args] then return made[args] end
  local tool = M.build .. "/make-tiny-model"
  if not M.exists(tool) then return nil, "missing " .. tool .. " (build the project first)" end
  local out = os.tmpname()
  os.remove(out)
  out = out .. ".gguf"
  local ok = os.execute(shell_quote(tool) .. " " .. args .. " --out " .. shell_quote(out) .. " >/dev/null 2>&1")
  if not ok then return nil, tool .. " " .. args .. " failed" end
  made[args] = out
  return out
end

-- Removes the tiny models this run made.
function M.cleanup()
  for k, path in pairs(made) do
    os.remove(path)
    made[k] = nil
  end
end

-- A model file for API specs: a fresh tiny model if the tool exists, else the llama parity
-- fixture. Returns path, description or nil, reason.
function M.api_model()
  local path = M.tiny_model("--family llama --dtype f32 --layers 2 --seed 7")
  if path then return path, "tiny llama (make-tiny-model)" end
  local fixture = M.root .. "/parity/llama-tiny-f32/model.gguf"
  if M.exists(fixture) then return fixture, "llama-tiny-f32 parity fixture" end
  return nil, "no model for the API specs: neither build/make-tiny-model nor " .. fixture
end

-- need_api_model() -> the api_model's path, or nil after marking the calling block pending (why)
function M.need_api_model()
  local path, why = M.api_model()
  if not path then pending(why) end
  return path
end

-- The api_model loaded on the reference kernels, or nil and the reason it is missing (for pending).
function M.api_model_loaded()
  local path, why = M.api_model()
  if not path then return nil, why end
  return require("ember").load { model = path, kernels = "reference" }
end

return M
