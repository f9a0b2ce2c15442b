-- helpers.sae_cases — the synthetic SAEs of spec/reference/sae_reference.py (an independent
-- writer: json, struct and numpy), written once per spec file into a scratch directory, handed out
-- as fresh copies; and the reason they cannot be, when /usr/bin/python3 lacks numpy.

local ember = require("ember")
local cjson = require("cjson")
local H = require("helpers.artifacts")
local files = require("helpers.files")
local npy = require("helpers.npy")

local M = {}

M.PY = "/usr/bin/python3"
M.SCRIPT = "spec/reference/sae_reference.py"

local ok = os.execute(M.PY .. " -c 'import numpy' >/dev/null 2>&1")
-- why the cases cannot be written, or nil
M.missing = ok ~= true and (M.PY .. " with numpy (Debian python3-numpy) is not installed: the reference cannot run")
  or nil

local shared

local function write_all()
  shared = os.tmpname()
  os.remove(shared)
  local p = io.popen(M.PY .. " " .. H.shell_quote(M.SCRIPT) .. " " .. H.shell_quote(shared) .. " 2>&1")
  local out = p:read("a")
  assert(p:close(), "sae_reference.py failed: " .. out)
end

-- copy(name) -> the case's expectation (expect.json) plus x (the inputs as a Tensor), dir (a fresh
-- copy, removed by helpers.artifacts.cleanup) and sae (the SAE's path in it).
function M.copy(name)
  if not shared then write_all() end
  local dir = H.tmpdir()
  assert(os.execute("cp -r " .. H.shell_quote(shared .. "/" .. name) .. "/. " .. H.shell_quote(dir)))
  local e = cjson.decode(files.read(dir .. "/expect.json"))
  local xa = npy.read(dir .. "/x.npy")
  e.x = ember.tensor_from_bytes(xa.data:sub(xa.offset), xa.rows, xa.cols)
  e.dir = dir
  e.sae = dir .. "/" .. e.sae
  return e
end

-- on_inputs(name, x) -> the expectation of case `name` written afresh for the inputs x (a
-- [rows, 64] Tensor, e.g. a model's activations), as copy() gives it (x read back from the file).
function M.on_inputs(name, x)
  local dir = H.tmpdir()
  local rows, cols = table.unpack(x:shape())
  npy.write(dir .. "/given.npy", x:values(), { rows, cols })
  local p = io.popen(M.PY .. " " .. H.shell_quote(M.SCRIPT) .. " " .. H.shell_quote(dir) .. " --x "
    .. H.shell_quote(dir .. "/given.npy") .. " " .. H.shell_quote(name) .. " 2>&1")
  local out = p:read("a")
  assert(p:close(), "sae_reference.py failed: " .. out)
  local e = cjson.decode(files.read(dir .. "/" .. name .. "/expect.json"))
  local xa = npy.read(dir .. "/" .. name .. "/x.npy")
  e.x = ember.tensor_from_bytes(xa.data:sub(xa.offset), xa.rows, xa.cols)
  e.dir = dir .. "/" .. name
  e.sae = e.dir .. "/" .. e.sae
  return e
end

-- Removes the written cases (a spec file's teardown).
function M.cleanup()
  if shared then os.execute("rm -rf " .. H.shell_quote(shared)) end
  shared = nil
end

-- edit_cfg(e, fn): cfg.json of a copied SAELens case, changed by fn, written back.
function M.edit_cfg(e, fn)
  local path = e.sae .. "/cfg.json"
  local cfg = cjson.decode(files.read(path))
  fn(cfg)
  local f = assert(io.open(path, "w"))
  f:write(cjson.encode(cfg))
  f:close()
end

return M
