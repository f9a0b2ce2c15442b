-- bench/gradients_bench.lua — what gradients and attribution patching cost against one forward
-- pass: the median time of a plain prefill of P tokens, of m:gradients at every stage, and of
-- ember.attribute over every head, neuron and residual position (two forwards and one backward),
-- interleaved A/B/C with medians; the forward-equivalents of each, and the passes exact patching
-- of the same components would need (one prefill per component) with the speed-up. Speed goes
-- here and in docs/performance.md, never in a test; run it only on a quiet machine.
--   build/ember-lua bench/gradients_bench.lua [--model M.gguf] [--dtype q8_0|q4_k] [--tokens 25]
--                                             [--repeat 5] [--kernels auto] [--threads N]
-- Without --model it makes the Qwen3-0.6B shape (random weights of --dtype, hidden 1024, 28
-- layers) with build/make-tiny-model --shape qwen3-0.6b.

local ember = require("ember")
local bench = require("ember.run.benchmark")

local USAGE = "usage: gradients_bench.lua [--model M] [--dtype q8_0|q4_k] [--tokens N] [--repeat R] [--kernels K]"
  .. " [--threads N]"
local KNOWN = { model = true, dtype = true, tokens = true, ["repeat"] = true, kernels = true, threads = true }
local o = bench.flags("gradients_bench.lua", arg, USAGE, KNOWN, { dtype = "q8_0", tokens = 25, ["repeat"] = 5 })
o.model = o.model or bench.made_model("bench-qwen3-0.6b-" .. o.dtype, "--shape qwen3-0.6b --dtype " .. o.dtype)

local m = ember.load { model = o.model, kernels = o.kernels, threads = o.threads }
local info = m.info
local P = o.tokens
local clean, corrupted = {}, {}
for t = 1, P do
  clean[t] = (t * 37) % info.n_vocab
  corrupted[t] = t == P // 2 and (clean[t] + 1) % info.n_vocab or clean[t]
end
local a, b = clean[P], (clean[P] + 1) % info.n_vocab
local metric = string.format("logit-diff:%d,%d", a, b)
local session = m:session { context = P }

local function timed(fn) -- seconds
  local t0 = ember.now_ms()
  fn()
  return (ember.now_ms() - t0) / 1000
end

local runs = {
  { name = "prefill", fn = function() session:reset(); session:prefill(clean) end, t = {} },
  { name = "gradients (every stage)", fn = function() m:gradients { ids = clean, metric = metric } end, t = {} },
  { name = "attribute (heads, neurons, resid)", fn = function()
    ember.attribute { model = m, clean = clean, corrupted = corrupted, metric = metric }
  end, t = {} },
}
runs[1].fn() -- warm the pages
for _ = 1, o["repeat"] do
  for _, r in ipairs(runs) do r.t[#r.t + 1] = timed(r.fn) end
end
local base = bench.median(runs[1].t)
print(string.format("model %s (%s), %d tokens, %d threads, kernels %s, %d repeats (medians)", o.model,
  info.family, P, info.threads, info.kernels, o["repeat"]))
for _, r in ipairs(runs) do
  local med = bench.median(r.t)
  print(string.format("  %-36s %9.3f s  %6.2f forward-equivalents", r.name, med, med / base))
end
local r = ember.attribute { model = m, clean = clean, corrupted = corrupted, metric = metric }
local components = r.total -- every head, neuron and residual row at every position
local atp = bench.median(runs[3].t) / base
print(string.format("  exact patching of the same %d components: %d prefills; AtP's speed-up %.0fx", components,
  components, components / atp))
