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

-- The project's own parity cases (tests/fixtures/parity-new: llama.cpp's and the exact logits of
-- tiny models the tests make again from case.json's make_tiny_model arguments; the model is not
-- committed).
M.families_dir = "tests/fixtures/parity-new"

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

-- Every parity case, as { name, dir, set } (set: "parity", "parity-quant" or "parity-new"), in that
-- order and sorted by name within a set.
function M.all_parity_cases()
  local out = {}
  for _, set in ipairs({ { "parity", M.root .. "/parity" }, { "parity-quant", M.root .. "/parity-quant" },
    { "parity-new", M.families_dir } }) do
    local p = io.popen("ls -1 " .. shell_quote(set[2]) .. " 2>/dev/null")
    local names = {}
    for line in p:lines() do
      if M.exists(set[2] .. "/" .. line .. "/case.json") then names[#names + 1] = line end
    end
    p:close()
    table.sort(names)
    for _, n in ipairs(names) do out[#out + 1] = { name = n, dir = set[2] .. "/" .. n, set = set[1] } end
  end
  return out
end

-- case_model(dir) -> the path of a parity case's model, or nil and why: its model.gguf, or for a
-- case that records its generator's arguments (make_tiny_model) a model made with them, whose
-- sha256 (by coreutils' sha256sum, not ember's) must be the recorded model_sha256.
function M.case_model(dir)
  if M.exists(dir .. "/model.gguf") then return dir .. "/model.gguf" end
  if not M.exists(dir .. "/case.json") then return nil, "missing fixture " .. dir .. "/model.gguf" end
  local case = M.read_json(dir .. "/case.json")
  if not case.make_tiny_model then return nil, "missing fixture " .. dir .. "/model.gguf" end
  local path, why = M.tiny_model(case.make_tiny_model)
  if not path then return nil, why end
  local p = io.popen("sha256sum " .. shell_quote(path) .. " 2>/dev/null")
  local sum = (p:read("a") or ""):match("^(%x+)")
  p:close()
  if sum ~= case.model_sha256 then
    return nil, string.format("make-tiny-model %s made a file of sha256 %s, not the case's %s: the generator "
      .. "changed, remake the fixtures (tests/reference/make_parity_new.sh)", case.make_tiny_model, tostring(sum),
      case.model_sha256)
  end
  return path
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
