-- bench/batch_bench.lua — what batching buys: (1) prefill throughput of 32 prompts x 20 tokens as
-- one batch against one 640-token prompt on a session (the same rows through the same products;
-- the batch's attention is per sequence, so shorter), (2) decode tokens/s of 8 sequences stepped
-- together against one sequence, median of --repeat runs, interleaved. Speed goes here and in
-- docs/performance.md, never in a test; run it only on a quiet machine.
--   build/ember-lua bench/batch_bench.lua [--model M.gguf] [--dtype q8_0] [--repeat 5] [--kernels auto]
--                                         [--threads N] [--steps 16]
-- Without --model it makes the Qwen3-0.6B shape (random weights, 28 layers, hidden 1024) with
-- build/make-tiny-model --shape qwen3-0.6b.

local ember = require("ember")
local core = require("ember.core")
local bench = require("ember.run.benchmark")

local USAGE = "usage: batch_bench.lua [--model M] [--dtype q8_0] [--repeat R] [--kernels K] [--threads N] [--steps S]"
local KNOWN = { model = true, dtype = true, ["repeat"] = true, kernels = true, threads = true, steps = true }
local o = bench.flags("batch_bench.lua", arg, USAGE, KNOWN, { dtype = "q8_0", ["repeat"] = 5, steps = 16 })
o.model = o.model or bench.made_model("bench-qwen3-0.6b-" .. o.dtype, "--shape qwen3-0.6b --dtype " .. o.dtype)

local m = ember.load { model = o.model, kernels = o.kernels, threads = o.threads }
local V = m.info.n_vocab
local seed = 1
local function rand_ids(n)
  local ids = {}
  for t = 1, n do
    seed = (seed * 1103515245 + 12345) % 2147483648
    ids[t] = seed % V
  end
  return ids
end
local now = core.now_ms

local function median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

local prompts, long = {}, rand_ids(640)
for k = 1, 32 do prompts[k] = rand_ids(20) end
local t_batch, t_single = {}, {}
for _ = 1, o["repeat"] do
  local b <close> = m:batch { size = 32, context = 32 }
  local t0 = now()
  b:prefill(prompts)
  t_batch[#t_batch + 1] = now() - t0
  local s <close> = m:session { context = 640 }
  t0 = now()
  s:prefill(long)
  t_single[#t_single + 1] = now() - t0
end
local bm, sm = median(t_batch), median(t_single)
print(string.format("prefill: 32 x 20 tokens batched %.1f ms (%.0f tok/s); one 640-token prompt %.1f ms (%.0f tok/s);"
  .. " ratio %.2f", bm, 640e3 / bm, sm, 640e3 / sm, sm / bm))

local d_batch, d_single = {}, {}
for _ = 1, o["repeat"] do
  local b <close> = m:batch { size = 8, context = 8 + o.steps + 1 }
  local starts = {}
  for k = 1, 8 do starts[k] = rand_ids(8) end
  b:prefill(starts)
  local t0 = now()
  for _ = 1, o.steps do b:decode({ 1, 2, 3, 4, 5, 6, 7, 8 }) end
  d_batch[#d_batch + 1] = now() - t0
  local s <close> = m:session { context = 8 + o.steps + 1 }
  s:prefill(starts[1])
  t0 = now()
  for _ = 1, o.steps do s:decode(1) end
  d_single[#d_single + 1] = now() - t0
end
local db, ds = median(d_batch), median(d_single)
local tb, ts = 8 * o.steps * 1e3 / db, o.steps * 1e3 / ds
print(string.format("decode: 8 sequences %.1f tok/s; one sequence %.1f tok/s; ratio %.2f", tb, ts, tb / ts))
