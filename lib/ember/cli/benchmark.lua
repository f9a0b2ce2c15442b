-- ember.cli.benchmark — `ember benchmark --model FILE.gguf [options]`: prefill and decode speed, peak
-- RSS, the bandwidth ceiling and the A/B runs, as a table or one JSON object on stdout.
-- Must not measure anything itself (ember.run.benchmark does) nor assert a speed.

local flags = require("ember.cli.flags")

local M = {}

local positive = flags.positive
local usage_error = flags.usage_error

M.FLAGS_LIST = {
  flags.option("model"),
  { "prompt-tokens", positive, "N", "prompt length in tokens (default 52)" },
  { "gen-tokens", positive, "N", "tokens generated per run (default 32)" },
  flags.option("threads"),
  flags.option("kernels"),
  flags.option("kv-cache"),
  { "repeat", positive, "R", "measured runs; medians are reported (default 5)" },
  { "warmup", "uint", "W", "unreported runs first (default 1)" },
  { "json", "bool", nil, "print one JSON object" },
  { "membw", "bool", nil, "also measure read bandwidth (bench-engine --membw) and the decode ceiling" },
  { "hooks-ab", "bool", nil, "interleave no experiment (A) with a name-only experiment (B); report both" },
  { "trace-ab", "bool", nil, "interleave untraced runs (A) with runs writing a --trace file (B); report both" },
  { "provenance-ab", "bool", nil, "time to first token: plain runs (A) against runs writing a manifest (B)" },
  flags.option("help"),
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.usage({ "usage: ember benchmark --model FILE.gguf [options]", "", "options:" }, M.FLAGS_LIST,
    { "", "Prefill and decode tok/s are medians of the repeats (greedy, end-of-sequence ignored)." })
end

local function mib(kib) return kib and kib / 1024 or nil end

local function run_opts(o)
  return { prompt_tokens = o["prompt-tokens"], gen_tokens = o["gen-tokens"], ["repeat"] = o["repeat"],
    warmup = o.warmup }
end

-- measure(o, probe) -> r: the runs (plain or A/B), the peak RSS, and with --membw the bandwidth,
-- the decode ceiling and the paired measurement.
local function measure(o, probe)
  local bench = require("ember.run.benchmark")
  local model = flags.load_model(o)
  local r = {}
  if o["hooks-ab"] or o["trace-ab"] then
    local ab = o["trace-ab"] and bench.trace_ab(model, run_opts(o)) or bench.hooks_ab(model, run_opts(o))
    r.res, r.ab = ab, ab
    ab.prefill_tok_s, ab.decode_tok_s = ab.a.prefill_tok_s, ab.a.decode_tok_s
  else
    r.res = bench.run(model, run_opts(o))
  end
  r.rss = mib(bench.peak_rss_kib()) -- before the probe (a separate process anyway)
  model:close()
  if o.membw then -- one bench-engine run: the best-of-10 probe and the paired measurement
    local res = r.res
    r.paired, r.gbs = bench.paired(o.model, { threads = res.threads, kernels = res.kernels, kv_cache = res.kv_cache,
      prompt_tokens = res.prompt_tokens, gen_tokens = res.gen_tokens, ["repeat"] = res["repeat"] }, probe)
    r.ceiling = r.gbs * 1e9 / res.model.weight_bytes_per_token
  end
  return r
end

local MODEL_KEYS = { "path", "family", "name", "dtype", "n_layers", "hidden_size", "n_vocab", "weight_bytes_per_token" }
local DOC_KEYS = { "model", "kernels", "kv_cache", "threads", "prompt_tokens", "gen_tokens", "repeat", "warmup",
  "prefill_tok_s", "decode_tok_s", "prefill_runs", "decode_runs", "peak_rss_mib", "membw_gbs",
  "decode_ceiling_tok_s", "paired", "hooks_ab", "trace_ab" }

-- ab_json(o, ab) -> the hooks_ab or the trace_ab section (the other one nil)
local function ab_json(o, ab)
  local json = require("ember.store.json")
  local function side(x)
    return json.ordered({ "prefill_tok_s", "decode_tok_s", "prefill_runs", "decode_runs" }, {
      prefill_tok_s = x.prefill_tok_s, decode_tok_s = x.decode_tok_s,
      prefill_runs = json.array(x.prefill or x.a.prefill), decode_runs = json.array(x.decode or x.a.decode) })
  end
  if not ab then return nil, nil end
  local a_name, b_name = "no_experiment", "name_only"
  if o["trace-ab"] then a_name, b_name = "untraced", "traced" end
  local section = json.ordered({ a_name, b_name, "prefill_ratio", "decode_ratio" }, { [a_name] = side(ab.a),
    [b_name] = side(ab.b), prefill_ratio = ab.prefill_ratio, decode_ratio = ab.decode_ratio })
  if o["trace-ab"] then return nil, section end
  return section, nil
end

local function json_report(o, r)
  local json = require("ember.store.json")
  local res, ab, m = r.res, r.ab, r.res.model
  local model = {}
  for _, k in ipairs(MODEL_KEYS) do model[k] = m[k] end
  local hooks_ab, trace_ab = ab_json(o, ab)
  return json.encode(json.ordered(DOC_KEYS, {
    model = json.ordered(MODEL_KEYS, model),
    kernels = res.kernels, kv_cache = res.kv_cache, threads = res.threads, prompt_tokens = res.prompt_tokens,
    gen_tokens = res.gen_tokens, ["repeat"] = res["repeat"], warmup = res.warmup, prefill_tok_s = res.prefill_tok_s,
    decode_tok_s = res.decode_tok_s, prefill_runs = json.array(ab and ab.a.prefill or res.prefill),
    decode_runs = json.array(ab and ab.a.decode or res.decode), peak_rss_mib = r.rss, membw_gbs = r.gbs,
    decode_ceiling_tok_s = r.ceiling,
    paired = r.paired and json.ordered({ "pairs", "share", "decode_tok_s", "membw_gbs" }, r.paired) or nil,
    hooks_ab = hooks_ab, trace_ab = trace_ab,
  }), { indent = "  " })
end

local function speeds_text(o, r, w)
  local res, ab = r.res, r.ab
  if ab then
    w:write(string.format(o["trace-ab"] and "trace A/B  %d interleaved pairs: A untraced, B traced into a file\n"
      or "hooks A/B  %d interleaved pairs: A no experiment, B an experiment with only a name\n", res["repeat"]))
    w:write(string.format("prefill    A %.1f tok/s, B %.1f tok/s, B/A %.3f (medians, %d-token prompt)\n",
      ab.a.prefill_tok_s, ab.b.prefill_tok_s, ab.prefill_ratio, res.prompt_tokens))
    w:write(string.format("decode     A %.2f tok/s, B %.2f tok/s, B/A %.3f (medians, %d tokens)\n",
      ab.a.decode_tok_s, ab.b.decode_tok_s, ab.decode_ratio, res.gen_tokens))
  else
    w:write(string.format("prefill    %.1f tok/s median of %d, %d-token prompt\n", res.prefill_tok_s, res["repeat"],
      res.prompt_tokens))
    w:write(string.format("decode     %.2f tok/s median of %d, %d tokens\n", res.decode_tok_s, res["repeat"],
      res.gen_tokens))
  end
end

local function text_report(o, r, w)
  local res, m = r.res, r.res.model
  w:write(string.format("model      %s (%s, %s)\n", m.path, m.family, m.dtype))
  w:write(string.format("kernels    %s, %d threads, %s KV cache\n", res.kernels, res.threads, res.kv_cache))
  speeds_text(o, r, w)
  if r.rss then w:write(string.format("peak RSS   %.1f MiB\n", r.rss)) end
  w:write(string.format("weights    %.1f MB read per decoded token\n", m.weight_bytes_per_token / 1e6))
  if r.gbs then
    w:write(string.format("bandwidth  %.1f GB/s -> decode ceiling %.1f tok/s (decode reaches %.0f%%)\n", r.gbs,
      r.ceiling, 100 * res.decode_tok_s / r.ceiling))
  end
  local paired = r.paired
  if paired then
    w:write(string.format("paired     decode reaches %.0f%% of the ceiling: median over %d pairs of one decoded "
      .. "token and\n           one probe pass right after it (bench-engine; medians: decode %.1f tok/s, bandwidth "
      .. "%.1f GB/s)\n", 100 * paired.share, paired.pairs, paired.decode_tok_s, paired.membw_gbs))
  end
end

local function provenance_ab(o, io_)
  local bench = require("ember.run.benchmark")
  local res = bench.provenance_ab({ model = o.model, kernels = o.kernels, threads = o.threads }, run_opts(o))
  if o.json then
    io_.stdout:write(require("ember.store.json").encode(res, { indent = "  " }))
  else
    io_.stdout:write(bench.format_provenance_ab(res))
  end
  return 0
end

-- main(args, argv, io_) -> exit code; args[1] is "benchmark".
function M.main(args, _, io_)
  local o = flags.command({ name = "benchmark", spec = M.FLAGS, usage = M.usage }, args, io_)
  if not o then return 0 end
  if o["hooks-ab"] and o["trace-ab"] then usage_error("benchmark: --hooks-ab and --trace-ab are two runs; give one") end
  if o.model == nil then usage_error("benchmark: --model FILE.gguf is required") end
  if o["provenance-ab"] then return provenance_ab(o, io_) end
  -- the probe is looked for before the model loads: a long run must not end in a missing tool
  local probe
  if o.membw then
    local why
    probe, why = require("ember.run.benchmark").bench_engine_path()
    if not probe then
      usage_error("--membw: the bandwidth probe '%s' was not found (build it, or set EMBER_BENCH_ENGINE)", why)
    end
  end
  local r = measure(o, probe)
  if o.json then
    io_.stdout:write(json_report(o, r))
  else
    text_report(o, r, io_.stdout)
  end
  return 0
end

return M
