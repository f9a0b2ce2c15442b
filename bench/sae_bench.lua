-- bench/sae_bench.lua — what an SAE costs: encode throughput of a d_sae-feature SAE on a d_in-wide
-- activation (features/s, GFLOP/s, the weight bytes read per second) and its share of the machine's
-- limit (the compute peak of the CPU's FMA units at its clock, or the read bandwidth bench-engine
-- measures, whichever the product's FLOP per weight byte makes it meet first), the prefill of a
-- model with the SAE spliced into one layer against the plain prefill, interleaved A/B/A/B with
-- medians, and the peak RSS. Speed goes here and in docs/performance.md, never in a test.
--   build/ember-lua bench/sae_bench.lua [--model M.gguf] [--layer L] [--d-sae 16384] [--dtype f16]
--                                       [--tokens 512] [--repeat 5] [--kernels auto] [--threads N]
--                                       [--membw-mib 1024] [--ghz G] [--flops-per-cycle F]
--                                       [--prefill 1|0]
-- --ghz and --flops-per-cycle replace the clock read from the machine and the FMA peak per core
-- assumed from its features (ember.run.benchmark.cpu_clock_ghz, f32_flops_per_cycle).
-- Without --model it makes the Qwen3-0.6B shape (random q8_0 weights, hidden 1024, 28 layers) with
-- build/make-tiny-model --shape qwen3-0.6b. The SAE is synthetic (weights do not change the cost).

local ember = require("ember")
local bench = require("ember.run.benchmark")

local USAGE = "usage: sae_bench.lua [--model M] [--layer L] [--d-sae N] [--dtype f32|f16|bf16] [--tokens N]"
  .. " [--repeat R] [--kernels K] [--threads N] [--membw-mib M] [--ghz G] [--flops-per-cycle F] [--prefill 1|0]"
local KNOWN = { model = true, layer = true, d_sae = true, dtype = true, tokens = true, ["repeat"] = true,
  kernels = true, threads = true, membw_mib = true, ghz = true, flops_per_cycle = true, prefill = true }
local o = bench.flags("sae_bench.lua", arg, USAGE, KNOWN,
  { d_sae = 16384, dtype = "f16", tokens = 512, ["repeat"] = 5, membw_mib = 1024, prefill = 1 })
o.model = o.model or bench.made_model("bench-qwen3-0.6b-q8_0", "--shape qwen3-0.6b --tokenizer")
local model = ember.load { model = o.model, kernels = o.kernels, threads = o.threads }
local info = model.info
local d_in, d_sae = info.hidden_size, o.d_sae
o.layer = o.layer or info.n_layers // 2

-- A synthetic SAE: a repeated block of pseudo-random values (the products cost the same whatever
-- the values; a block keeps building the weights cheap).
local function block(n, seed)
  local t, x = {}, seed
  for j = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[j] = string.pack("<f", (x / 2147483648 - 0.5) / 16)
  end
  return table.concat(t)
end
local function tensor(rows, cols, seed)
  local b = block(4099, seed) -- a prime length: rows do not repeat one another
  local n = rows * cols * 4
  local data = string.rep(b, n // #b + 1):sub(1, n)
  return { data = data, offset = 0, dtype = "F32", shape = { rows, cols } }
end
local spec = { d_in = d_in, d_sae = d_sae, dtype = o.dtype, architecture = "jumprelu", apply_b_dec_to_input = true,
  denormalize_output = true, threshold_all = 0.05, tensors = { W_enc = tensor(d_in, d_sae, 1),
    W_dec = tensor(d_sae, d_in, 2), b_enc = tensor(1, d_sae, 3), b_dec = tensor(1, d_in, 4) } }
local handle = ember.sae_new(spec, model)
spec = nil
collectgarbage()
-- the SAE object ember.sae.load would make, for generate{ sae = }
local sae = require("ember.sae").wrap(handle, { path = "(synthetic)", format = "synthetic",
  architecture = "jumprelu", d_in = d_in, d_sae = d_sae, d_out = d_in, transcoder = false,
  hook = string.format("blocks.%d.hook_resid_post", o.layer), hook_layer = o.layer })

local function now() return ember.now_ms() end
local function median(t) return bench.median(t) end

-- ---- the machine's limits ----
local cpu = ember.cpu()
local ghz, clock_source = o.ghz, "--ghz"
if not ghz then ghz, clock_source = bench.cpu_clock_ghz() end
local fpc, fpc_how = o.flops_per_cycle, "--flops-per-cycle"
if not fpc then fpc, fpc_how = bench.f32_flops_per_cycle(cpu) end
local cores = math.min(info.threads, cpu.physical_cores)
local limits = { cores = cores, ghz = ghz, clock_source = clock_source, flops_per_cycle = fpc,
  flops_per_cycle_how = fpc_how, peak_gflops = ghz and cores * fpc * ghz or nil, membw_mib = o.membw_mib }

-- ---- encode throughput ----
local x = ember.tensor(o.tokens, d_in)
for r = 1, o.tokens do x:set(r, 1 + (r % d_in), 1.0) end
local wbytes = ({ f32 = 4, f16 = 2, bf16 = 2 })[o.dtype] * d_in * d_sae
local enc = {}
for _, rows in ipairs({ 1, o.tokens }) do
  local xr = x:slice(1, rows)
  sae:encode(xr) -- warm-up (scratch)
  local times = {}
  local reps = rows == 1 and 50 or o["repeat"]
  for k = 1, reps do
    local t0 = now()
    sae:encode(xr)
    times[k] = now() - t0
  end
  local ms = median(times)
  enc[#enc + 1] = { rows = rows, ms = ms, features_per_s = rows * d_sae / (ms / 1e3),
    gflops = 2 * rows * d_in * d_sae / (ms / 1e3) / 1e9, weight_gbs = wbytes / (ms / 1e3) / 1e9,
    flop_per_weight_byte = 2 * rows * d_in * d_sae / wbytes }
end
-- the bandwidth right after the encodes (it changes within seconds: docs/performance.md)
limits.membw_gbs = bench.membw(info.threads, o.membw_mib)
for _, e in ipairs(enc) do
  e.compute_share = limits.peak_gflops and e.gflops / limits.peak_gflops or nil
  e.bandwidth_share = e.weight_gbs / limits.membw_gbs
  -- the roofline: below the machine's FLOP per byte the weights' bandwidth is the limit
  e.limit = limits.peak_gflops and e.flop_per_weight_byte >= limits.peak_gflops / limits.membw_gbs and "compute"
    or "bandwidth"
  e.share = e.limit == "compute" and e.compute_share or e.bandwidth_share
end

-- ---- prefill A/B: plain against the SAE spliced into one layer ----
local ids = bench.prompt_ids(o.tokens, info.n_vocab)
local function prefill(with_sae)
  local t0 = now()
  model:generate { ids = ids, max_tokens = 0, sae = with_sae and sae or nil }
  return now() - t0
end
local a, b = {}, {}
if o.prefill ~= 0 then
  prefill(false); prefill(true) -- warm-up
  for k = 1, o["repeat"] do
    a[k] = prefill(false)
    b[k] = prefill(true)
  end
end
local res = { model = o.model, kernels = info.kernels, threads = info.threads, d_in = d_in, d_sae = d_sae,
  dtype = o.dtype, layer = o.layer, tokens = o.tokens, weight_bytes = wbytes, limits = limits, encode = enc,
  peak_rss_mib = (bench.peak_rss_kib() or 0) / 1024 }
if #a > 0 then
  res.prefill_ms = { plain = median(a), sae = median(b) }
  res.prefill_ratio = res.prefill_ms.sae / res.prefill_ms.plain
end

print(string.format("sae bench: %s (%s, %d threads), SAE %d -> %d features (%s) at layer %d", o.model, info.kernels,
  info.threads, d_in, d_sae, o.dtype, o.layer))
if limits.peak_gflops then
  print(string.format("  compute peak: %d cores x %g FLOP/cycle (%s) x %.3f GHz (%s) = %.1f GFLOP/s", cores, fpc,
    fpc_how, ghz, clock_source, limits.peak_gflops))
else
  print("  compute peak: unknown (" .. tostring(clock_source) .. "; give --ghz)")
end
print(string.format("  read bandwidth: %.1f GB/s (bench-engine --membw, %d threads, %d MiB, best of 10)",
  limits.membw_gbs, info.threads, o.membw_mib))
for _, e in ipairs(enc) do
  print(string.format("  encode %4d rows: %8.3f ms  %10.4g features/s  %7.1f GFLOP/s (%s of peak)  %6.2f GB/s of"
    .. " weights (%s of bandwidth); limit: %s, %s", e.rows, e.ms, e.features_per_s, e.gflops,
    e.compute_share and string.format("%.1f%%", 100 * e.compute_share) or "?", e.weight_gbs,
    string.format("%.1f%%", 100 * e.bandwidth_share), e.limit, e.share and string.format("%.1f%%", 100 * e.share)
    or "?"))
end
if res.prefill_ms then
  print(string.format("  prefill %d tokens: plain %.1f ms, with the SAE %.1f ms (x%.3f)", o.tokens,
    res.prefill_ms.plain, res.prefill_ms.sae, res.prefill_ratio))
end
print(string.format("  peak RSS %.0f MiB (VmHWM, the counter getrusage's ru_maxrss reports)", res.peak_rss_mib))
print(require("ember.store.json").encode(res))
