-- fuzz/make_text_seeds.lua selectors|flags OUT_DIR — seeds for fuzz_selectors and fuzz_flags:
-- values and command lines as users type them, the pieces NUL-separated as the drivers split them.
local name, out = arg[1], arg[2]
local seeds = {
  selectors = {
    { "4:mlp", "all", "0,2,4-6", "before_layer,after_mlp", "prefill", "layer=3 scale=0.5,v=a.f32", "-1.5e3" },
    { "12:after_attention", " 1 , 3-5 ", "key='a b',k2=c", "exact-semantic", "007", "--top-k=4" },
  },
  flags = {
    { "--model", "m.gguf", "--prompt", "hi", "--max-tokens=4", "--top-k", "40", "--top-p", "0.9",
      "--temperature", "0.7" },
    { "--model", "m.gguf", "--prompt", "x", "--capture-activations", "d", "--capture-layers", "0,2-3",
      "--context", "64", "--capture-phase", "decode" },
    { "--threads", "4", "--seed", "9223372036854775807", "--zero-layer-output=1:mlp", "--help" },
    { "--clean", "a", "--corrupted", "b", "--out", "d", "--jobs", "2", "--checkpoint", "0.5", "--json" },
  },
}
for i, parts in ipairs(assert(seeds[name], "unknown seed set " .. tostring(name))) do
  local f = assert(io.open(string.format("%s/seed-%d", out, i), "wb"))
  f:write(table.concat(parts, "\0"))
  f:close()
end
