-- fuzz/drivers/artifact.lua — any bytes as an activation artifact through the reader
-- (lib/ember/store/artifact.lua: manifest.json on lua-cjson, tensors.safetensors, every check). The
-- input is a 4-byte little-endian length, then that many bytes of manifest.json, then the
-- tensors.safetensors bytes; the safetensors decoder also gets the whole input on its own. A read
-- must succeed or raise a message naming the artifact; anything else is a finding.
local artifact = require("ember.store.artifact")
local safetensors = require("ember.store.safetensors")

local dir = require("ember.store.fs").make_temp_dir("ember-fuzz-artifact") -- private (0700), no shell

local function put(name, bytes)
  local f = assert(io.open(dir .. "/" .. name, "wb"))
  f:write(bytes)
  f:close()
end

local where = "artifact '" .. dir .. "'"

return function(data)
  pcall(safetensors.decode, data, "fuzz")
  local n = #data >= 4 and string.unpack("<I4", data) or 0
  local manifest = data:sub(5, 4 + n)
  put("manifest.json", manifest)
  put("tensors.safetensors", data:sub(5 + n))
  local ok, err = pcall(artifact.read, dir)
  if not ok and (type(err) ~= "string" or err:sub(1, #where) ~= where) then
    error("artifact.read raised an error that does not name the artifact: " .. tostring(err), 0)
  end
end
