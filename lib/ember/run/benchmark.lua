-- ember.run.benchmark — prefill and decode speed of a loaded model through model:generate (the same
-- path `ember` runs), peak RSS, the memory-bandwidth ceiling, and the hooks A/B (no experiment vs
-- an experiment that defines only `name`, or empty methods on chosen stages). Measures; never asserts a speed. Used by
-- `ember benchmark` (lib/ember/cli.lua) and bench/hooks_ab.lua.
--
-- Each run generates gen_tokens tokens greedily (end-of-sequence ignored) after a prompt of
-- prompt_tokens pseudo-random ids (a fixed seed, so every run and every machine sees the same
-- prompt). Speeds are generate's own timings of the engine calls (out.stats).

local fs = require("ember.store.fs")
local core = require("ember.core")

local M = {}
local shell_quote = fs.shell_quote

-- median(list) -> the median (mean of the middle two for an even count); the list is not changed.
function M.median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

-- prompt_ids(n, n_vocab) -> n ids from a fixed xorshift sequence.
function M.prompt_ids(n, n_vocab)
  local ids, x = {}, 0x2545F4914F6CDD1D
  for i = 1, n do
    x = x ~ (x << 13); x = x ~ (x >> 7); x = x ~ (x << 17)
    ids[i] = (x >> 1) % n_vocab
  end
  return ids
end

-- peak_rss_kib() -> the process's peak resident size (VmHWM of /proc/self/status) in KiB, or nil.
function M.peak_rss_kib()
  local text = fs.read_system("/proc/self/status", 1 << 16)
  local ok = text ~= nil
  local kib = ok and text:match("VmHWM:%s*(%d+)%s*kB")
  return kib and tonumber(kib) or nil
end

-- One generate run -> prefill tok/s, decode tok/s.
local function run_once(model, ids, gen_tokens, exp, trace)
  local out = model:generate { ids = ids, max_tokens = gen_tokens, eos = false, experiment = exp, trace = trace }
  return out.stats.prefill_tok_s, out.stats.decode_tok_s
end

local function check_counts(o)
  for _, k in ipairs({ "prompt_tokens", "gen_tokens", "repeat" }) do
    local v = o[k]
    if math.type(v) ~= "integer" or v < 1 then
      error(string.format("benchmark: %s must be a positive integer (got %s)", k, tostring(v)), 3)
    end
  end
  if math.type(o.warmup) ~= "integer" or o.warmup < 0 then
    error(string.format("benchmark: warmup must be a non-negative integer (got %s)", tostring(o.warmup)), 3)
  end
end

local function defaults(o)
  return { prompt_tokens = o.prompt_tokens or 52, gen_tokens = o.gen_tokens or 32, ["repeat"] = o["repeat"] or 5,
    warmup = o.warmup or 1 }
end

local function model_fields(model)
  local info = model.info
  return {
    path = info.path, family = info.family, name = info.name, dtype = info.dtype_summary,
    n_layers = info.n_layers, hidden_size = info.hidden_size, n_vocab = info.n_vocab,
    weight_bytes_per_token = info.weight_bytes_per_token,
  }
end

-- What run and hooks_ab share: the checked options, the prompt, the unreported warm-up runs, and
-- the fields every result carries (filled into `res`).
local function prologue(model, opts)
  local o = defaults(opts or {})
  check_counts(o)
  local ids = M.prompt_ids(o.prompt_tokens, model.info.n_vocab)
  for _ = 1, o.warmup do run_once(model, ids, o.gen_tokens) end
  local function result(res)
    res.kernels, res.threads, res.model = model.info.kernels, model.info.threads, model_fields(model)
    res.kv_cache = model.info.kv_cache
    res.prompt_tokens, res.gen_tokens, res["repeat"], res.warmup = o.prompt_tokens, o.gen_tokens, o["repeat"],
      o.warmup
    return res
  end
  return o, ids, result
end

-- run(model, { prompt_tokens = 52, gen_tokens = 32, repeat = 5, warmup = 1 }) -> result
-- result = { prefill_tok_s, decode_tok_s (medians), prefill = {...}, decode = {...} (every repeat),
--            kernels, threads, prompt_tokens, gen_tokens, repeat, warmup, model = {...} }
function M.run(model, opts)
  local o, ids, result = prologue(model, opts)
  local pre, dec = {}, {}
  for r = 1, o["repeat"] do pre[r], dec[r] = run_once(model, ids, o.gen_tokens) end
  return result { prefill_tok_s = M.median(pre), decode_tok_s = M.median(dec), prefill = pre, decode = dec }
end

-- hooks_ab(model, opts) -> result: A = no experiment, B = an experiment with only `name`, run
-- A, B, A, B, ... (repeat pairs, after `warmup` unreported A runs) so that machine noise hits both
-- alike. result = { a = { prefill_tok_s, decode_tok_s, prefill, decode }, b = { ... },
--                   prefill_ratio = B/A, decode_ratio = B/A, kernels, threads, ... , model }
local function interleaved_ab(model, opts, exp_b, trace_b)
  local o, ids, result = prologue(model, opts)
  local a, b = { prefill = {}, decode = {} }, { prefill = {}, decode = {} }
  for r = 1, o["repeat"] do
    a.prefill[r], a.decode[r] = run_once(model, ids, o.gen_tokens, nil)
    b.prefill[r], b.decode[r] = run_once(model, ids, o.gen_tokens, exp_b, trace_b)
  end
  for _, side in ipairs({ a, b }) do
    side.prefill_tok_s, side.decode_tok_s = M.median(side.prefill), M.median(side.decode)
  end
  return result { a = a, b = b, prefill_ratio = b.prefill_tok_s / a.prefill_tok_s,
    decode_ratio = b.decode_tok_s / a.decode_tok_s }
end

function M.hooks_ab(model, opts) return interleaved_ab(model, opts, { name = "name-only" }) end

-- trace_ab(model, opts) -> the same result with B = a run traced (generate{trace=}) into a temporary
-- file, removed afterwards: what tracing costs when it is on (docs/inspection.md).
function M.trace_ab(model, opts)
  local path = os.tmpname()
  local ok, res = pcall(interleaved_ab, model, opts, nil, path)
  os.remove(path)
  if not ok then error(res, 0) end
  return res
end

-- stages_ab(model, opts, stages) -> the same result with B = an experiment whose methods on the
-- given stages (every layer) do nothing: what observing those stages costs (for attention_pattern,
-- the pattern is then computed into memory and mixed from it, layer by layer).
function M.stages_ab(model, opts, stages)
  local exp = { name = "read-only:" .. table.concat(stages, ",") }
  for _, st in ipairs(stages) do exp[st] = function() end end
  return interleaved_ab(model, opts, exp)
end

-- provenance_ab(load_opts, opts) -> result: does recording provenance delay the first token?
-- Each round loads the model afresh (load_opts: model, threads, kernels) and runs one generation
-- through ember.run, the path of the `ember` command: A = a plain run; B = a run with an experiment
-- (only a name) and a run manifest, so the model is loaded with provenance = true and the manifest
-- waits for the model's digest. Rounds alternate AB, BA, ... after `warmup` unreported B runs (the
-- first of which may hash the file: its figures are reported as `first_b`). Times are from just
-- before ember.load: to the first generated token (ttft_ms), and to the end of the run with its
-- manifest written (total_ms). result = { a = { ttft_ms, total_ms, ttft, total }, b = { ...,
-- sources = { "cached"|"fresh"... } }, ttft_delta_ms (median over rounds of B - A), first_b, ... }
function M.provenance_ab(load_opts, opts)
  local o = defaults(opts or {})
  check_counts(o)
  local run = require("ember.run")
  local manifest_path = os.tmpname()
  local function once(with_provenance)
    local t0, t_first = core.now_ms(), nil
    local model = require("ember.model").load { model = load_opts.model, threads = load_opts.threads,
      kernels = load_opts.kernels,
      provenance = with_provenance }
    local ids = M.prompt_ids(o.prompt_tokens, model.info.n_vocab)
    local res = run.execute {
      model = model, ids = ids, gen = { max_tokens = o.gen_tokens },
      experiments = with_provenance and { { name = "name-only" } } or nil,
      run_manifest = with_provenance and manifest_path or nil,
      on_token = function() t_first = t_first or core.now_ms() end,
    }
    local total = core.now_ms() - t0
    local source = res.sections and res.sections.model.sha256_source
    local info = model.info
    model:close()
    return t_first - t0, total, source, info
  end
  local first_b, info
  for w = 1, o.warmup do
    local ttft, total, source
    ttft, total, source, info = once(true)
    if w == 1 then first_b = { ttft_ms = ttft, total_ms = total, source = source } end
  end
  local a, b = { ttft = {}, total = {} }, { ttft = {}, total = {}, sources = {} }
  local delta = {}
  for r = 1, o["repeat"] do
    local order = r % 2 == 1 and { false, true } or { true, false }
    for _, with in ipairs(order) do
      local side = with and b or a
      local ttft, total, source
      ttft, total, source, info = once(with)
      side.ttft[r], side.total[r] = ttft, total
      if with then side.sources[r] = source end
    end
    delta[r] = b.ttft[r] - a.ttft[r]
  end
  os.remove(manifest_path)
  for _, side in ipairs({ a, b }) do side.ttft_ms, side.total_ms = M.median(side.ttft), M.median(side.total) end
  return {
    a = a, b = b, ttft_delta_ms = M.median(delta), ttft_deltas = delta, first_b = first_b,
    kernels = info.kernels, threads = info.threads, prompt_tokens = o.prompt_tokens, gen_tokens = o.gen_tokens,
    ["repeat"] = o["repeat"], warmup = o.warmup, path = load_opts.model,
  }
end

-- format_provenance_ab(res) -> the text `ember benchmark --provenance-ab` prints.
function M.format_provenance_ab(res)
  local counts = {}
  for _, s in ipairs(res.b.sources) do counts[s] = (counts[s] or 0) + 1 end
  local src = {}
  for k, v in pairs(counts) do src[#src + 1] = string.format("%s %d", k, v) end
  table.sort(src)
  local lines = {
    string.format("model      %s (%s, %d threads)", res.path, res.kernels, res.threads),
    string.format("provenance %d rounds (AB, BA, ...): A a plain run, B an experiment run writing a run manifest;",
      res["repeat"]),
    "           each loads the model, prefills and generates; times from just before ember.load",
    string.format("first tok  A %.1f ms, B %.1f ms (medians); B - A %.1f ms (median over rounds), %d-token prompt",
      res.a.ttft_ms, res.b.ttft_ms, res.ttft_delta_ms, res.prompt_tokens),
    string.format("whole run  A %.1f ms, B %.1f ms (medians, B with its manifest written), %d tokens", res.a.total_ms,
      res.b.total_ms, res.gen_tokens),
    string.format("digest     B rounds: %s", table.concat(src, ", ")),
  }
  if res.first_b then
    lines[#lines + 1] = string.format("first B    (warm-up) first token %.1f ms, whole run %.1f ms, digest %s",
      res.first_b.ttft_ms, res.first_b.total_ms, tostring(res.first_b.source))
  end
  return table.concat(lines, "\n") .. "\n"
end

-- flags(script, argv, usage, known, defaults) -> the bench scripts' options: `--name value` pairs
-- (dashes in a name read as underscores; numbers as numbers) over `defaults`; an unknown name or a
-- missing value raises with the usage.
function M.flags(script, argv, usage, known, defaults)
  local o, i = defaults or {}, 1
  while i <= #argv do
    local k, v = argv[i]:match("^%-%-([%w-]+)$"), argv[i + 1]
    if not k or v == nil then error(usage, 0) end
    k = k:gsub("-", "_")
    if not known[k] then error(script .. ": unknown flag '" .. argv[i] .. "'\n" .. usage, 0) end
    o[k] = math.tointeger(tonumber(v)) or tonumber(v) or v
    i = i + 2
  end
  return o
end

-- made_model(name, make_args) -> build/models/NAME.gguf, made once with build/make-tiny-model
-- MAKE_ARGS (random weights: the speed does not depend on them).
function M.made_model(name, make_args)
  local path = "build/models/" .. name .. ".gguf"
  if fs.exists(path) then return path end
  fs.mkdir_p("build/models")
  assert(os.execute("build/make-tiny-model " .. make_args .. " --out " .. shell_quote(path) .. " >/dev/null"),
    "could not make the benchmark model " .. path)
  return path
end

-- bench_engine_path() -> the bench-engine beside the running interpreter (the build directory of
-- ember-lua), or nil and the path that was looked for. EMBER_BENCH_ENGINE overrides.
function M.bench_engine_path()
  local env = os.getenv("EMBER_BENCH_ENGINE")
  local path = env and env ~= "" and env
  if not path then
    -- the interpreter is arg's lowest index (options such as `-m ember.cli` sit between)
    local first = 0
    while type(arg) == "table" and arg[first - 1] ~= nil do first = first - 1 end
    local interp = first < 0 and arg[first]
    local dir = interp and interp:match("^(.*)/[^/]*$") or "."
    path = dir .. "/bench-engine"
  end
  if not fs.exists(path) then return nil, path end
  return path
end

-- Runs bench-engine with the arguments `fmt` formats (after the executable) and returns its output;
-- raises a message naming --membw when the tool is missing.
local function run_bench_engine(exe, fmt, ...)
  local why
  if not exe then exe, why = M.bench_engine_path() end
  if not exe then
    error(string.format("--membw: the bandwidth probe '%s' was not found (build it: cmake --build build; "
      .. "or set EMBER_BENCH_ENGINE)", why), 0)
  end
  local cmd = shell_quote(exe) .. " " .. string.format(fmt, ...)
  local p = io.popen(cmd, "r")
  local text = p and p:read("a") or ""
  if p then p:close() end
  return text, cmd
end

local function json_number(text, key) return tonumber(text:match('"' .. key .. '":%s*([%d%.eE+-]+)')) end

-- paired(model_path, opts [, exe]) -> { pairs, share, decode_tok_s, membw_gbs }, best: bench-engine run on
-- the same model with --membw, which times every decoded token and one probe pass right after it
-- and reports the median share of the ceiling over those pairs (docs/performance.md: the machine's
-- bandwidth can change between a decode run and a separate probe). opts: threads, kernels,
-- prompt_tokens, gen_tokens, repeat. best: that run's best-of-10 probe in GB/s (a 1 GiB array,
-- docs/performance.md). Raises a message naming --membw on failure.
function M.paired(model_path, opts, exe)
  local text, cmd = run_bench_engine(exe, "--model %s --membw --json --threads %d --kernels %s --kv-cache %s "
    .. "--prompt-tokens %d --gen-tokens %d --repeat %d --warmup 0 2>&1", shell_quote(model_path), opts.threads,
    opts.kernels or "auto", opts.kv_cache or "f32", opts.prompt_tokens, opts.gen_tokens, opts["repeat"])
  local r = { pairs = json_number(text, "pairs"), share = json_number(text, "paired_share"),
    decode_tok_s = json_number(text, "paired_decode_tok_s"), membw_gbs = json_number(text, "paired_membw_gbs") }
  local best = json_number(text, "membw_gbs")
  if not r.pairs or not r.share or not r.decode_tok_s or not r.membw_gbs or not best or best <= 0 then
    error(string.format("--membw: '%s' gave no paired measurement (output: %q)", cmd, text:sub(1, 400)), 0)
  end
  return r, best
end

-- membw(threads, mib [, exe]) -> GB/s: bench-engine's read-bandwidth probe alone (threads threads
-- summing their slices of a mib-MiB array, best of 10 passes). Raises a message naming --membw.
function M.membw(threads, mib, exe)
  local text, cmd = run_bench_engine(exe, "--membw --json --threads %d --membw-mib %d 2>&1", threads, mib)
  local gbs = json_number(text, "membw_gbs")
  if not gbs or gbs <= 0 then
    error(string.format("--membw: '%s' gave no bandwidth (output: %q)", cmd, text:sub(1, 400)), 0)
  end
  return gbs
end

-- cpu_clock_ghz([cpuinfo_text, max_freq_text]) -> GHz, source: the clock the compute peak is taken
-- at: cpufreq's cpuinfo_max_freq (kHz) when the kernel exposes it, else the first "cpu MHz" of
-- /proc/cpuinfo (a virtual machine's nominal clock; boost can run higher). nil, reason when neither
-- can be read. The texts are for tests; by default the files are read.
function M.cpu_clock_ghz(cpuinfo_text, max_freq_text)
  local max_path = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
  if max_freq_text == nil then
    max_freq_text = fs.read_system(max_path, 64) or false
  end
  local khz = max_freq_text and tonumber(max_freq_text:match("^%s*(%d+)"))
  if khz and khz > 0 then return khz / 1e6, max_path end
  if cpuinfo_text == nil then
    cpuinfo_text = fs.read_system("/proc/cpuinfo", 1 << 22) or ""
  end
  local mhz = tonumber(cpuinfo_text:match("cpu MHz%s*:%s*([%d%.]+)"))
  if mhz and mhz > 0 then return mhz / 1e3, "/proc/cpuinfo cpu MHz" end
  return nil, "the clock could not be read (neither " .. max_path .. " nor /proc/cpuinfo's cpu MHz)"
end

-- f32_flops_per_cycle(cpu) -> FLOP per cycle per core, how: the peak of the widest FMA units the
-- CPU's features announce, assuming two FMA pipes per core (Intel since Haswell, AMD since Zen 2;
-- a part with one AVX-512 FMA unit has half): 2 pipes x lanes x 2 (a multiply and an add).
-- cpu: ember.cpu().
function M.f32_flops_per_cycle(cpu)
  if cpu.avx512f then return 64, "AVX-512 FMA: 2 pipes x 16 f32 lanes x 2" end
  if cpu.avx2 and cpu.fma then return 32, "AVX2 FMA: 2 pipes x 8 f32 lanes x 2" end
  return 8, "SSE, no FMA: 1 multiply + 1 add pipe x 4 f32 lanes"
end

return M
