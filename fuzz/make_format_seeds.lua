-- fuzz/make_format_seeds.lua OUT_DIR — seeds for fuzz_formats: for each format of
-- fuzz/drivers/formats.lua (the first byte picks it), decision streams of a few lengths, the
-- all-zero one (the base document, unmutated where the stream says "no") included. Deterministic.
local out = assert(arg[1], "usage: make_format_seeds.lua OUT_DIR")
local FORMATS = { "artifact", "npy", "safetensors", "sweep", "probe", "control_vector", "sae" }
local state = 0x9e3779b9
local function byte()
  state = (state * 1103515245 + 12345) % 2147483648
  return state >> 16 & 0xff
end
for mode = 0, #FORMATS - 1 do
  for k, len in ipairs({ 0, 16, 64, 256 }) do
    local bytes = { string.char(mode) }
    for i = 1, len do bytes[i + 1] = string.char(k == 1 and 0 or byte()) end
    local f = assert(io.open(string.format("%s/seed-%s-%d", out, FORMATS[mode + 1], len), "wb"))
    f:write(table.concat(bytes))
    f:close()
  end
end
