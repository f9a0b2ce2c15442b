-- `ember benchmark` (lib/ember/cli.lua over lib/ember/run/benchmark.lua): flags, usage errors that name
-- the flag, the refusal of experiments, the JSON fields and that the numbers are positive. Never a
-- speed threshold: speed is measured, not tested.

local cjson = require("cjson")
local cli = require("ember.cli")
local bench = require("ember.run.benchmark")
local models = require("helpers.models")
local H = require("helpers.artifacts")

local C = require("helpers.cli")
local sink, ember, need_model = C.sink, C.ember, C.need_model

-- a short run: the numbers only need to exist
local QUICK = { "--prompt-tokens", "6", "--gen-tokens", "3", "--repeat", "3", "--threads", "2" }

describe("ember benchmark flags", function()
  it("--help lists every benchmark flag", function()
    local code, out, err = ember("benchmark", "--help")
    assert.equal(0, code)
    assert.equal("", err)
    for _, f in ipairs(require("ember.cli.benchmark").FLAGS_LIST) do assert.matches("--" .. f[1], out, 1, true) end
  end)

  it("names the flag in usage errors (exit 2, nothing on stdout)", function()
    local cases = {
      { { "--model", "m.gguf", "--repeat", "0" }, "--repeat: expected a positive integer, got '0'" },
      { { "--model", "m.gguf", "--prompt-tokens", "many" }, "--prompt-tokens:" },
      { { "--model", "m.gguf", "--gen-tokens", "0" }, "--gen-tokens: expected a positive integer" },
      { { "--model", "m.gguf", "--threads", "-2" }, "--threads:" },
      { { "--model", "m.gguf", "--kernels", "sse" }, "--kernels:" },
      { { "--model", "m.gguf", "--warmup", "x" }, "--warmup:" },
      { { "--model", "m.gguf", "--json=yes" }, "flag '--json' takes no value" },
      { { "--model", "m.gguf", "--prompt", "x" }, "unknown flag '--prompt'" },
      { { "--model", "m.gguf", "extra" }, "benchmark: unexpected argument 'extra'" },
      { { "--repeat", "2" }, "benchmark: --model FILE.gguf is required" },
    }
    for _, c in ipairs(cases) do
      local code, out, err = ember("benchmark", table.unpack(c[1]))
      assert.equal(2, code, c[2])
      assert.equal("", out)
      assert.matches(c[2], err, 1, true)
    end
  end)

  it("refuses active experiments, naming the flag", function()
    for _, flag in ipairs({ "--experiment", "--activation-stats", "--capture-activations", "--activation-patch" }) do
      local code, _, err = ember("benchmark", "--model", "m.gguf", flag, "x")
      assert.equal(2, code)
      assert.matches("'benchmark' refuses active experiments (" .. flag .. ")", err, 1, true)
    end
  end)

  it("must come first", function()
    local code, _, err = ember("--model", "m.gguf", "benchmark")
    assert.equal(2, code)
    assert.matches("'benchmark' must be the first argument", err, 1, true)
  end)

  it("reports a model that cannot be loaded (exit 1)", function()
    local code, out, err = ember("benchmark", "--model", "/nonexistent/m.gguf")
    assert.equal(1, code)
    assert.equal("", out)
    assert.matches("/nonexistent/m.gguf", err, 1, true)
  end)
end)

describe("ember benchmark runs", function()
  it("--json prints the medians, the runs, peak RSS, kernels, threads and the model", function()
    local path = need_model()
    if not path then return end
    local code, out, err = ember("benchmark", "--model", path, "--json", "--kernels", "reference",
      table.unpack(QUICK))
    assert.equal(0, code, err)
    local r = cjson.decode(out)
    assert.equal("reference", r.kernels)
    assert.equal(2, r.threads)
    assert.same({ 6, 3, 3, 1 }, { r.prompt_tokens, r.gen_tokens, r["repeat"], r.warmup })
    for _, k in ipairs({ "prefill_tok_s", "decode_tok_s", "peak_rss_mib" }) do
      assert.is_true(type(r[k]) == "number" and r[k] > 0, k)
    end
    assert.equal(3, #r.prefill_runs)
    assert.equal(3, #r.decode_runs)
    for i = 1, 3 do assert.is_true(r.prefill_runs[i] > 0 and r.decode_runs[i] > 0) end
    -- the median is one of the three runs
    local sorted = { table.unpack(r.decode_runs) }
    table.sort(sorted)
    assert.equal(sorted[2], r.decode_tok_s)
    assert.equal(path, r.model.path)
    assert.equal("llama", r.model.family)
    assert.is_true(r.model.n_layers > 0 and r.model.n_vocab > 0 and r.model.weight_bytes_per_token > 0)
    assert.is_nil(r.hooks_ab)
    assert.is_nil(r.membw_gbs)
  end)

  it("prints a text summary without --json", function()
    local path = need_model()
    if not path then return end
    local code, out = ember("benchmark", "--model", path, table.unpack(QUICK))
    assert.equal(0, code)
    for _, s in ipairs({ "model ", "kernels ", "prefill ", "decode ", "peak RSS ", "median of 3" }) do
      assert.matches(s, out, 1, true)
    end
  end)

  it("--hooks-ab reports both sides' medians and the ratios", function()
    local path = need_model()
    if not path then return end
    local code, out, err = ember("benchmark", "--model", path, "--hooks-ab", "--json", table.unpack(QUICK))
    assert.equal(0, code, err)
    local r = cjson.decode(out)
    local ab = r.hooks_ab
    for _, side in ipairs({ ab.no_experiment, ab.name_only }) do
      assert.is_true(side.prefill_tok_s > 0 and side.decode_tok_s > 0)
      assert.equal(3, #side.prefill_runs)
    end
    assert.near(ab.name_only.decode_tok_s / ab.no_experiment.decode_tok_s, ab.decode_ratio, 1e-12)
    assert.near(ab.name_only.prefill_tok_s / ab.no_experiment.prefill_tok_s, ab.prefill_ratio, 1e-12)
    assert.equal(ab.no_experiment.decode_tok_s, r.decode_tok_s)
    code, out = ember("benchmark", "--model", path, "--hooks-ab", table.unpack(QUICK))
    assert.equal(0, code)
    assert.matches("B/A", out, 1, true)
  end)

  it("stages_ab runs B with empty methods on the named stages, interleaved with A", function()
    local path = need_model()
    if not path then return end
    local model <close> = require("ember").load { model = path }
    local r = bench.stages_ab(model, { prompt_tokens = 4, gen_tokens = 2, ["repeat"] = 2, warmup = 0 },
      { "attention_pattern", "mlp_activation" })
    for _, side in ipairs({ r.a, r.b }) do
      assert.is_true(side.prefill_tok_s > 0 and side.decode_tok_s > 0)
      assert.equal(2, #side.decode)
    end
    assert.near(r.b.decode_tok_s / r.a.decode_tok_s, r.decode_ratio, 1e-12)
  end)

  it("--provenance-ab times plain runs against manifest-writing runs, in alternating rounds", function()
    local path = need_model()
    if not path then return end
    local code, out, err = ember("benchmark", "--model", path, "--provenance-ab", "--json", table.unpack(QUICK))
    assert.equal(0, code, err)
    local r = cjson.decode(out)
    for _, side in ipairs({ r.a, r.b }) do
      assert.equal(3, #side.ttft)
      for i = 1, 3 do assert.is_true(side.ttft[i] > 0 and side.total[i] >= side.ttft[i]) end
      assert.equal(bench.median(side.ttft), side.ttft_ms)
    end
    for i = 1, 3 do assert.near(r.b.ttft[i] - r.a.ttft[i], r.ttft_deltas[i], 1e-9) end
    assert.equal(bench.median(r.ttft_deltas), r.ttft_delta_ms)
    -- every B run recorded where its digest came from (a model written moments ago is not cached)
    assert.equal(3, #r.b.sources)
    for _, s in ipairs(r.b.sources) do assert.is_true(s == "fresh" or s == "cached") end
    assert.is_true(r.first_b.source == "fresh" or r.first_b.source == "cached")
    code, out = ember("benchmark", "--model", path, "--provenance-ab", table.unpack(QUICK))
    assert.equal(0, code)
    assert.matches("B - A", out, 1, true)
  end)

  it("--membw names the flag when the probe is missing", function()
    if os.getenv("EMBER_BENCH_ENGINE") then return pending("EMBER_BENCH_ENGINE is set") end
    local exe = bench.bench_engine_path()
    if exe then return pending("a bench-engine is beside this interpreter: " .. exe) end
    local code, _, err = ember("benchmark", "--model", "m.gguf", "--membw")
    assert.equal(2, code)
    assert.matches("--membw: the bandwidth probe", err, 1, true)
  end)

  it("--membw through the launcher adds the bandwidth and the decode ceiling", function()
    local build = (os.getenv("EMBER_BUILD") or "build")
    if not io.open(build .. "/bench-engine", "rb") then return pending("missing " .. build .. "/bench-engine") end
    local path = need_model()
    if not path then return end
    local p = io.popen(string.format("EMBER_LUA=%s tools/ember benchmark --model %s --membw --json --threads 1 "
      .. "--prompt-tokens 4 --gen-tokens 2 --repeat 1 --warmup 0", H.shell_quote(build .. "/ember-lua"),
      H.shell_quote(path)))
    local r = cjson.decode(p:read("a"))
    p:close()
    assert.is_true(r.membw_gbs > 0)
    assert.near(r.membw_gbs * 1e9 / r.model.weight_bytes_per_token, r.decode_ceiling_tok_s,
      1e-6 * r.decode_ceiling_tok_s)
    -- the paired measurement: one pair per decoded token of every measured run
    assert.equal(2, r.paired.pairs)
    assert.is_true(r.paired.share > 0 and r.paired.decode_tok_s > 0 and r.paired.membw_gbs > 0)
  end)
end)

describe("ember.benchmark", function()
  it("median, prompt ids and peak RSS", function()
    assert.equal(2, bench.median({ 3, 1, 2 }))
    assert.equal(2.5, bench.median({ 4, 1, 3, 2 }))
    local a, b = bench.prompt_ids(20, 100), bench.prompt_ids(20, 100)
    assert.same(a, b)
    for _, id in ipairs(a) do assert.is_true(math.type(id) == "integer" and id >= 0 and id < 100) end
    assert.is_true(bench.peak_rss_kib() > 0)
  end)

  it("reads the clock from cpufreq, else /proc/cpuinfo, and the FMA peak from the CPU's features", function()
    local ghz, src = bench.cpu_clock_ghz("cpu MHz\t\t: 2445.404\n", "3500000\n")
    assert.equal(3.5, ghz)
    assert.matches("cpuinfo_max_freq", src, 1, true)
    ghz, src = bench.cpu_clock_ghz("model name : X\ncpu MHz\t\t: 2445.404\ncpu MHz : 1000\n", false)
    assert.near(2.445404, ghz, 1e-12)
    assert.equal("/proc/cpuinfo cpu MHz", src)
    ghz, src = bench.cpu_clock_ghz("", false)
    assert.is_nil(ghz)
    assert.matches("could not be read", src)
    -- the machine's own files: the clock is read when /proc/cpuinfo shows one (an independent read)
    local f = io.open("/proc/cpuinfo", "rb")
    local mhz = f and tonumber((f:read("a") or ""):match("cpu MHz%s*:%s*([%d%.]+)"))
    if f then f:close() end
    if mhz then assert.is_number((bench.cpu_clock_ghz())) end
    assert.equal(64, (bench.f32_flops_per_cycle({ avx512f = true, avx2 = true, fma = true })))
    assert.equal(32, (bench.f32_flops_per_cycle({ avx2 = true, fma = true })))
    assert.equal(8, (bench.f32_flops_per_cycle({ avx2 = true, fma = false })))
  end)

  it("bench/sae_bench.lua reports features/s and the share of the compute or bandwidth limit", function()
    local build = (os.getenv("EMBER_BUILD") or "build")
    if not io.open(build .. "/bench-engine", "rb") then return pending("missing " .. build .. "/bench-engine") end
    local path = need_model()
    if not path then return end
    local p = io.popen(string.format("%s bench/sae_bench.lua --model %s --layer 1 --d-sae 128 --tokens 4 --repeat 1 "
      .. "--membw-mib 8 --prefill 0 --ghz 2 --flops-per-cycle 16 --threads 1", H.shell_quote(build .. "/ember-lua"),
      H.shell_quote(path)))
    local r = cjson.decode(p:read("a"):match("\n(%{[^\n]*)\n$"))
    p:close()
    assert.equal(32, r.limits.peak_gflops) -- 1 core x 16 FLOP/cycle x 2 GHz
    assert.is_true(r.limits.membw_gbs > 0 and r.peak_rss_mib > 0)
    for _, e in ipairs(r.encode) do
      assert.near(e.rows * 128, e.features_per_s * e.ms / 1e3, 1e-9 * e.rows * 128)
      assert.near(e.gflops / 32, e.compute_share, 1e-12)
      assert.near(e.weight_gbs / r.limits.membw_gbs, e.bandwidth_share, 1e-12)
      assert.equal(e.limit == "compute" and e.compute_share or e.bandwidth_share, e.share)
    end
    assert.equal(64 * 128 * 2, r.weight_bytes) -- the f16 encoder: d_in x d_sae x 2 bytes
  end)

  it("rejects counts that are not positive", function()
    local path = need_model()
    if not path then return end
    local model = require("ember").load { model = path, threads = 1 }
    assert.has_error(function() bench.run(model, { ["repeat"] = 0 }) end,
      "benchmark: repeat must be a positive integer (got 0)")
    model:close()
  end)
end)

teardown(function() require("helpers.fixtures").cleanup() end)
