-- The `ember` command (lib/ember/cli.lua): flags, usage errors that name the flag, text on stdout
-- and notices on stderr, exit codes, run manifests, the capture/patch flags and
-- compare-artifacts. Most runs are in-process through cli.main with captured streams; a few go
-- through the real launcher (tools/ember -> build/ember-lua) to check the process boundary.

local cjson = require("cjson")
local cli = require("ember.cli")
local models = require("helpers.models")
local H = require("helpers.artifacts")

local C = require("helpers.cli")
local sink, ember, need_model = C.sink, C.ember, C.need_model

describe("ember flags", function()
  it("--help lists every flag on stdout and exits 0", function()
    local code, out, err = ember("--help")
    assert.equal(0, code)
    assert.equal("", err)
    for _, f in ipairs(cli.FLAGS) do assert.matches("--" .. f[1], out, 1, true) end
    assert.matches("compare-artifacts", out, 1, true)
  end)

  it("--version prints the version", function()
    local code, out = ember("--version")
    assert.equal(0, code)
    assert.equal("ember " .. require("ember").version .. "\n", out)
  end)

  it("names unknown, malformed, repeated and value-less flags (exit 2, nothing on stdout)", function()
    local cases = {
      { { "--model", "m.gguf", "--prompt", "x", "--max-tokenz", "3" }, "unknown flag '--max-tokenz'" },
      { { "-m", "m.gguf" }, "malformed flag '-m'" },
      { { "--Model=m.gguf" }, "malformed flag '--Model=m.gguf'" },
      { { "--model", "a", "--model", "b" }, "flag '--model' given more than once" },
      { { "--model" }, "flag '--model' needs a value" },
      { { "--model", "--prompt", "x" }, "flag '--model' needs a value" },
      { { "--help=yes" }, "flag '--help' takes no value" },
      { { "--model", "m", "--prompt", "x", "extra" }, "unexpected argument 'extra'" },
    }
    for _, c in ipairs(cases) do
      local code, out, err = ember(table.unpack(c[1]))
      assert.equal(2, code, c[2])
      assert.equal("", out)
      assert.matches(c[2], err, 1, true)
      assert.matches("Try 'ember --help'", err, 1, true)
    end
  end)

  it("names the flag an unknown one misspells, in every command (did you mean)", function()
    local cases = {
      { { "--model", "m.gguf", "--prompt", "x", "--max-token", "3" }, "'--max-token' (did you mean '--max-tokens'?)" },
      { { "--modle", "m.gguf" }, "'--modle' (did you mean '--model'?)" },
      { { "--capture-stage", "all" }, "'--capture-stage' (did you mean '--capture-stages'?)" },
      { { "sweep", "--metrics", "kl" }, "'--metrics' (did you mean '--metric'?)" },
      { { "attention", "--heads", "1" }, "'--heads' (did you mean '--head'?)" },
      { { "control-vector", "--positives", "p.jsonl" }, "'--positives' (did you mean '--positive'?)" },
      { { "compare-models", "--max-tokns", "2" }, "'--max-tokns' (did you mean '--max-tokens'?)" },
      { { "probe", "train", "--layr", "1" }, "'--layr' (did you mean '--layer'?)" },
      -- the subcommands that take directories only: a flag there is not taken for a directory
      { { "sweep", "merge", "--out", "x", "s0" }, "'--out'" },
      { { "sweep", "compare", "--json", "a", "b" }, "'--json'" },
      { { "compare-models", "merge", "--out", "x", "s0" }, "'--out'" },
    }
    for _, c in ipairs(cases) do
      local code, out, err = ember(table.unpack(c[1]))
      assert.equal(2, code, c[2])
      assert.equal("", out)
      assert.matches("unknown flag " .. c[2], err, 1, true)
      -- the hint names the command whose flags are listed
      local cmd = c[1][1]:sub(1, 2) ~= "--" and (c[1][1] .. " ") or ""
      assert.matches("\nTry 'ember " .. cmd .. "--help' for the list of flags.\n", err, 1, true)
    end
    -- a token the grammar refuses gets the flag it misspells too
    local code, _, err = ember("--capture_stages", "all")
    assert.equal(2, code)
    assert.matches("malformed flag '--capture_stages' (flags look like --name or --name=value) (did you mean "
      .. "'--capture-stages'?)", err, 1, true)
    -- far from every flag: no guess
    code, _, err = ember("--zzz")
    assert.equal(2, code)
    assert.matches("unknown flag '--zzz'\n", err, 1, true)
  end)

  it("names the flag whose value is malformed", function()
    local cases = {
      { "--max-tokens", "-1", "--max-tokens: expected a non-negative integer" },
      { "--max-tokens", "4x", "--max-tokens: expected a non-negative integer" },
      { "--temperature", "warm", "--temperature: expected a finite number" },
      { "--top-p", "nan", "--top-p: expected a finite number" },
      { "--kernels", "fast", "--kernels: unknown kernel set 'fast'" },
      { "--zero-layer-output", "4:mlpx", "--zero-layer-output: unknown stage 'mlpx'" },
      { "--zero-layer-output", "four:mlp", "--zero-layer-output: expected LAYER:STAGE" },
      { "--capture-layers", "3-1", "--capture-layers: empty range 3-1" },
      { "--capture-stages", "after_mpl", "--capture-stages: unknown stage 'after_mpl'" },
      { "--capture-phase", "both", "--capture-phase: expected prefill|decode|all" },
      { "--capture-max-records", "0", "--capture-max-records: expected a positive integer" },
      { "--patch-target", "2:after_logits", "--patch-target: unknown stage 'after_logits'" },
    }
    for _, c in ipairs(cases) do
      local code, _, err = ember("--model", "m.gguf", "--prompt", "x", c[1], c[2])
      assert.equal(2, code, c[1])
      assert.matches(c[3], err, 1, true)
    end
  end)

  it("refuses flag combinations that have no meaning", function()
    local cases = {
      { { "--zero-layer-output", "1:mlp", "--experiment", "x.lua" },
        "--zero-layer-output and --experiment cannot be combined" },
      { { "--capture-layers", "1" }, "--capture-layers needs --capture-activations DIR" },
      { { "--capture-omit-prompt" }, "--capture-omit-prompt needs --capture-activations DIR" },
      { { "--patch-target", "1:mlp" }, "--activation-patch DIR and --patch-target L:STAGE go together" },
      { { "--experiment-args", "a=1" }, "--experiment-args needs --experiment" },
    }
    for _, c in ipairs(cases) do
      local args = { "--model", "m.gguf", "--prompt", "x" }
      for _, a in ipairs(c[1]) do args[#args + 1] = a end
      local code, _, err = ember(table.unpack(args))
      assert.equal(2, code, c[2])
      assert.matches(c[2], err, 1, true)
    end
    local code, _, err = ember("--prompt", "x")
    assert.equal(2, code)
    assert.matches("--model FILE.gguf is required", err, 1, true)
  end)

  it("refuses active experiments with inspection commands", function()
    local code, _, err = ember("benchmark", "--model", "m.gguf", "--prompt", "x", "--zero-layer-output", "1:mlp")
    assert.equal(2, code)
    assert.matches("'benchmark' refuses active experiments (--zero-layer-output)", err, 1, true)
  end)

  it("reports a model that cannot be loaded (exit 1)", function()
    local code, out, err = ember("--model", "/nonexistent/m.gguf", "--prompt", "x")
    assert.equal(1, code)
    assert.equal("", out)
    assert.matches("/nonexistent/m.gguf", err, 1, true)
  end)
end)

describe("ember runs", function()
  after_each(H.cleanup)

  it("prints the generated text on stdout and nothing on stderr for a plain run", function()
    local path = need_model()
    if not path then return end
    local code, out, err = ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", "5")
    assert.equal(0, code)
    assert.equal("", err)
    local model = require("ember").load { model = path }
    local want = model:generate { prompt = models.PROMPT, max_tokens = 5, temperature = 0 }
    assert.equal(want.text .. "\n", out)
    -- a plain run writes a run manifest only when asked, and it says no experiment ran
    local dir = H.tmpdir()
    code = ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", "5", "--run-manifest", dir .. "/run.json")
    assert.equal(0, code)
    local m = cjson.decode(H.read(dir .. "/run.json"))
    assert.equal("none", m.experiment.name)
    assert.is_false(m.experiment.modified)
    assert.same(want.ids, m.generated_ids)
  end)

  it("checks output and source locations before loading the model", function()
    local cases = {
      { "--activation-stats", "/nonexistent/dir/s.json",
        "--activation-stats: directory '/nonexistent/dir' does not exist" },
      { "--capture-activations", "/nonexistent/dir/cap",
        "--capture-activations: directory '/nonexistent/dir' does not exist" },
      { "--run-manifest", "/nonexistent/r.json", "--run-manifest: directory '/nonexistent' does not exist" },
    }
    for _, c in ipairs(cases) do
      local code, _, err = ember("--model", "/nonexistent/m.gguf", "--prompt", "x", c[1], c[2])
      assert.equal(2, code, c[1])
      assert.matches(c[3], err, 1, true)
    end
    local code, _, err = ember("--model", "/nonexistent/m.gguf", "--prompt", "x", "--activation-patch",
      "/nonexistent/A",
      "--patch-target", "1:mlp")
    assert.equal(2, code)
    assert.matches("--activation-patch: '/nonexistent/A' is not a directory", err, 1, true)
  end)

  it("an out-of-range layer is a usage error before anything runs or is written", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    local code, out, err = ember("--model", path, "--prompt", "x", "--zero-layer-output", "99:attention",
      "--run-manifest", dir .. "/run.json", "--capture-activations", dir .. "/cap")
    assert.equal(2, code)
    assert.equal("", out)
    assert.matches("--zero-layer-output: layer 99 is out of range (the model has 6 layers: 0-5)", err, 1, true)
    assert.same({}, H.listdir(dir))
  end)

  it("--zero-layer-output changes the run, says so on stderr, and records it in the run manifest", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    local N = 4 -- generated tokens: one prefill and N decode evaluations (SPEC §4.1)
    local code, _, err = ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N),
      "--zero-layer-output", "3:attention", "--run-manifest", dir .. "/run.json")
    assert.equal(0, code)
    assert.matches("this run was MODIFIED by zero-layer-output 3:attention", err, 1, true)
    assert.matches(("in %d evaluations (prefill 1, decode %d)"):format(1 + N, N), err, 1, true)
    local m = cjson.decode(H.read(dir .. "/run.json"))
    assert.equal("ember.run", m.schema)
    assert.equal("completed", m.status)
    assert.equal("zero-layer-output", m.experiment.name)
    assert.is_true(m.experiment.modified)
    assert.equal(1 + N, m.experiment.members[1].stats.interventions)
    assert.equal("3:attention", m.experiment.args)
    assert.equal(N, #m.generated_ids)
    assert.equal("--zero-layer-output", m.argv[#m.argv - 3])
  end)

  it("--activation-stats writes the statistics and a manifest saying nothing was modified", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    local N = 3 -- generated tokens: one prefill and N decode evaluations (SPEC §4.1)
    local code, out_stats = ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N),
      "--activation-stats", dir .. "/stats.json", "--run-manifest", dir .. "/run.json")
    assert.equal(0, code)
    local _, out_plain = ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N))
    assert.equal(out_plain, out_stats)
    local stats = cjson.decode(H.read(dir .. "/stats.json"))
    assert.is_true(stats.observation_only)
    assert.equal((1 + N) * (4 * 6 + 2), #stats.records) -- evaluations x (4 stages x 6 layers + 2 logits hooks)
    local m = cjson.decode(H.read(dir .. "/run.json"))
    assert.is_false(m.experiment.modified)
    assert.equal(dir .. "/stats.json", m.outputs.activation_stats)
    assert.same({ "run.json", "stats.json" }, H.listdir(dir))
  end)

  it("puts the run manifest next to its output and writes none into the working directory", function()
    local path = need_model()
    if not path then return end
    local build = (os.getenv("EMBER_BUILD") or "build") .. "/ember-lua"
    local abs = function(p) return p:sub(1, 1) == "/" and p or (os.getenv("PWD") .. "/" .. p) end
    local cwd = H.tmpdir()
    local function ember_in_cwd(...)
      local args = {}
      for i, a in ipairs({ ... }) do args[i] = H.shell_quote(a) end
      local cmd = string.format("cd %s && %s -m ember.cli --model %s --prompt hi --max-tokens 2 %s >/dev/null 2>&1",
        H.shell_quote(cwd), H.shell_quote(abs(build)), H.shell_quote(abs(path)), table.concat(args, " "))
      return os.execute(cmd)
    end
    -- a capture: the manifest is inside the artifact directory
    assert.is_true(ember_in_cwd("--capture-activations", "cap"))
    local m = cjson.decode(H.read(cwd .. "/cap/run.json"))
    assert.equal("ember.run", m.schema)
    assert.equal("cap", m.outputs.capture_artifact)
    assert.equal(2, #m.generated_ids)
    -- statistics: beside the file
    assert.is_true(ember_in_cwd("--activation-stats", "stats.json"))
    assert.equal("activation-stats", cjson.decode(H.read(cwd .. "/stats.run.json")).experiment.members[1].name)
    -- an intervention without outputs: no manifest at all
    assert.is_true(ember_in_cwd("--zero-layer-output", "1:mlp"))
    assert.same({ "cap", "stats.json", "stats.run.json" }, H.listdir(cwd))
    -- unless one is asked for
    assert.is_true(ember_in_cwd("--zero-layer-output", "1:mlp", "--run-manifest", "z.json"))
    assert.equal("zero-layer-output", cjson.decode(H.read(cwd .. "/z.json")).experiment.name)
  end)

  it("--experiment factories get (args, model): key=value pairs as a table, and a model handle", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    -- the factory tokenizes a word and reads the model's shape; its hook records what it saw
    H.write(dir .. "/probe.lua", [[
return function(args, model)
  local ids = model:tokenize(args.word, { bos = false })
  local exp = { name = "probe", stats = { word_id = ids[#ids], layers = model.info.n_layers,
    layer = tonumber(args.layer), args_type = type(args), has_generate = model.generate ~= nil,
    n_vocab = model.info.n_vocab,
    unembed_cols = model.unembed and model:unembed(require("ember").tensor(1, model.info.hidden_size)):shape()[2] } }
  function exp:after_layer(ctx) end
  return exp
end
]])
    local code, _, err = ember("--model", path, "--prompt", "x", "--max-tokens", "1", "--experiment",
      dir .. "/probe.lua",
      "--experiment-args", "word=fox layer=2", "--run-manifest", dir .. "/run.json")
    assert.equal(0, code, err)
    local stats = cjson.decode(H.read(dir .. "/run.json")).experiment.members[1].stats
    local ember_ = require("ember")
    local m = ember_.load(path)
    local want = m:tokenize("fox", { bos = false })
    assert.equal(want[#want], stats.word_id)
    assert.equal(m.info.n_layers, stats.layers)
    -- ember.load_experiment passes the same (args, model handle)
    local e = ember_.load_experiment(dir .. "/probe.lua", { word = "fox", layer = "1" }, m)
    assert.same({ want[#want], m.info.n_layers, 1, false }, { e.stats.word_id, e.stats.layers, e.stats.layer,
      e.stats.has_generate })
    m:close()
    assert.equal(2, stats.layer)
    assert.equal("table", stats.args_type)
    assert.is_false(stats.has_generate) -- a handle, not the model: no runs from a factory
    assert.equal(stats.n_vocab, stats.unembed_cols) -- the logit lens is there to set up with
    -- a string that is not key=value pairs arrives unchanged (zero_layer_output's "4:attention")
    code, _, err = ember("--model", path, "--prompt", "x", "--max-tokens", "1", "--experiment",
      "scripts/experiments/zero_layer_output.lua", "--experiment-args", "2:attention")
    assert.equal(0, code, err)
    assert.matches("MODIFIED", err, 1, true)
  end)

  it("--experiment runs report how often the experiment acted (hook calls that wrote a view)", function()
    local path = need_model()
    if not path then return end
    local N = 3
    local code, _, err = ember("--model", path, "--prompt", "x", "--max-tokens", tostring(N), "--experiment",
      "scripts/experiments/scale_attention.lua", "--experiment-args", "layer=1 factor=0.5")
    assert.equal(0, code, err)
    -- layer 1's after_attention, once in the prefill and once per decode
    assert.matches(string.format("MODIFIED by experiment 'scale-attention': it wrote through a view in %d hook calls "
      .. "over %d evaluations (prefill 1, decode %d)", 1 + N, 1 + N, N), err, 1, true)
    -- out.modified_calls counts calls, not writes: two writes in one call count once; reads never
    local m = require("ember").load(path)
    local exp = { name = "twice-in-prefill" }
    function exp:after_mlp(ctx, v)
      if ctx.layer_index == 0 and ctx.phase == "prefill" then v:scale(1); v:zero() end
      if ctx.layer_index == 1 then v:l2_norm() end
    end
    local out = m:generate { ids = { 1, 2 }, max_tokens = 2, experiment = exp }
    assert.equal(1, out.modified_calls)
    assert.equal(0, m:generate { ids = { 1, 2 }, max_tokens = 2, experiment = { name = "n" } }.modified_calls)
    m:close()
  end)

  it("threads default to the physical cores; --verbose says so and the manifest records it", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    local cpu = require("ember").cpu()
    assert.is_true(cpu.physical_cores >= 1 and cpu.physical_cores <= cpu.logical_cores)
    local code, _, err = ember("--model", path, "--prompt", "x", "--max-tokens", "1", "--verbose",
      "--run-manifest", dir .. "/a.json")
    assert.equal(0, code, err)
    assert.matches(string.format("threads %d (default: the physical cores; %d physical cores, %d CPUs)",
      cpu.physical_cores, cpu.physical_cores, cpu.logical_cores), err, 1, true)
    local ex = cjson.decode(H.read(dir .. "/a.json")).execution
    assert.same({ cpu.physical_cores, true, cpu.physical_cores }, { ex.threads, ex.threads_default, ex.physical_cores })
    code, _, err = ember("--model", path, "--prompt", "x", "--max-tokens", "1", "--verbose", "--threads", "1",
      "--run-manifest", dir .. "/b.json")
    assert.equal(0, code, err)
    assert.matches("threads 1 (--threads;", err, 1, true)
    ex = cjson.decode(H.read(dir .. "/b.json")).execution
    assert.same({ 1, false }, { ex.threads, ex.threads_default })
    code, _, err = ember("--model", path, "--prompt", "x", "--max-tokens", "1")
    assert.is_nil(err:find("threads", 1, true)) -- quiet without --verbose
  end)

  it("a failing hook exits 1 with the hook-failure message and writes nothing", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    H.write(dir .. "/boom.lua", [[
      return function(args)
        local exp = { name = "boom" }
        function exp:after_attention(ctx, v)
          if ctx.phase == "decode" and ctx.layer_index == 1 then error(args .. " at decode") end
        end
        return exp
      end]])
    local code, _, err = ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", "3",
      "--experiment", dir .. "/boom.lua", "--experiment-args", "kaboom", "--run-manifest", dir .. "/run.json",
      "--capture-activations", dir .. "/cap")
    assert.equal(1, code)
    assert.matches("experiment 'boom+capture' failed in after_attention (phase=decode, layer=1):", err, 1, true)
    assert.matches("kaboom at decode", err, 1, true)
    assert.same({ "boom.lua" }, H.listdir(dir))
  end)

  it("refuses a misspelt hook name even behind capture, naming the closest hook", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    H.write(dir .. "/typo.lua", [[
      local exp = { name = "typo" }
      function exp:after_mpl(ctx, v) v:zero() end
      return exp]])
    for _, extra in ipairs({ {}, { "--capture-activations", dir .. "/cap" } }) do
      local code, _, err = ember("--model", path, "--prompt", "x", "--max-tokens", "2", "--experiment",
        dir .. "/typo.lua",
        "--run-manifest", dir .. "/run.json", table.unpack(extra))
      assert.equal(1, code)
      assert.matches("after_mpl", err, 1, true)
      assert.matches("after_mlp", err, 1, true)
    end
    assert.same({ "typo.lua" }, H.listdir(dir))
  end)

  it("capture flags select the records; compare-artifacts classes the runs and enforces --require", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    local N = 3 -- generated tokens: one prefill and N decode evaluations (SPEC §4.1)
    local records = (1 + N) * (2 + 1) -- evaluations x (layers 2 and 3 after_mlp + logits)
    local common = { "--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N), "--capture-stages",
      "after_mlp,after_logits", "--capture-layers", "2-3", "--run-manifest", dir .. "/run.json" }
    local function capture_run(name, ...)
      local args = { table.unpack(common) }
      for _, a in ipairs({ "--capture-activations", dir .. "/" .. name, ... }) do args[#args + 1] = a end
      local code, _, err = ember(table.unpack(args))
      assert.equal(0, code, err)
      return err
    end
    local err = capture_run("A")
    assert.matches("captured " .. records .. " records into " .. dir .. "/A", err, 1, true)
    capture_run("A2")
    capture_run("B", "--zero-layer-output", "2:mlp")
    capture_run("C", "--activation-patch", dir .. "/A", "--patch-target", "2:after_mlp")
    local m = cjson.decode(H.read(dir .. "/A/manifest.json"))
    assert.equal(records, #m.records)

    local code, out = ember("compare-artifacts", dir .. "/A", dir .. "/A2", "--require", "exact")
    assert.equal(0, code)
    assert.matches("class: exact ", out, 1, true)
    code, out = ember("compare-artifacts", dir .. "/A", dir .. "/C", "--require", "exact-semantic")
    assert.equal(0, code)
    assert.matches("class: exact-semantic", out, 1, true)
    local e
    code, out, e = ember("compare-artifacts", dir .. "/A", dir .. "/B", "--require", "exact-semantic")
    assert.equal(1, code)
    assert.matches("does not meet --require exact-semantic", e, 1, true)
    code, out = ember("compare-artifacts", dir .. "/A", dir .. "/B", "--json")
    assert.equal(0, code)
    local doc = cjson.decode(out)
    assert.is_false(require("ember.analysis.compare").at_least(doc.class, "exact-semantic"))
    assert.equal(records, doc.summary.aligned)
  end)

  it("compare-artifacts prints a summary by default, every record with --records", function()
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    local N = 4
    for _, run in ipairs({ { "A" }, { "B", "--zero-layer-output", "3:attention" } }) do
      local code, _, err = ember("--model", path, "--prompt", models.PROMPT, "--max-tokens", tostring(N),
        "--capture-activations", dir .. "/" .. run[1], table.unpack(run, 2))
      assert.equal(0, code, err)
    end
    local n_records = (1 + N) * (4 * 6 + 2) -- evaluations x (4 stages x 6 layers + 2 logits stages)
    local _, js = ember("compare-artifacts", dir .. "/A", dir .. "/B", "--json")
    local doc = cjson.decode(js)
    assert.equal(n_records, #doc.records)
    -- the groups the summary must show, worked out from the JSON records
    local expected, order = {}, {}
    for _, r in ipairs(doc.records) do
      local layer = r.layer == cjson.null and "-" or tostring(math.tointeger(r.layer))
      local key = r.stage .. " " .. layer
      if not expected[key] then expected[key] = { d = 0, t = 0 }; order[#order + 1] = key end
      expected[key].t = expected[key].t + 1
      if r.status ~= "identical" then expected[key].d = expected[key].d + 1 end
    end
    local code, text = ember("compare-artifacts", dir .. "/A", dir .. "/B")
    assert.equal(0, code)
    local _, lines = text:gsub("\n", "")
    assert.is_true(lines < 60, "the summary has " .. lines .. " lines:\n" .. text)
    assert.matches("first differing records", text, 1, true)
    assert.matches("largest differences per stage and layer", text, 1, true)
    local listed, differing_groups = 0, 0
    local compare = require("ember.analysis.compare")
    for _, key in ipairs(order) do
      if expected[key].d > 0 then differing_groups = differing_groups + 1 end
    end
    for _, key in ipairs(order) do
      local e = expected[key]
      local stage, layer = key:match("^(%S+) (%S+)$")
      local row = text:match("\n  " .. stage .. "%s+" .. layer:gsub("%-", "%%-") .. "%s+(%d+/%d+)")
      if row then
        listed = listed + 1
        assert.equal(e.d .. "/" .. e.t, row, key)
      else
        -- not listed: no difference, or beyond the summary's number of groups
        assert.is_true(e.d == 0 or differing_groups > compare.SUMMARY_GROUPS, key)
      end
    end
    assert.is_true(differing_groups > 0)
    assert.equal(math.min(differing_groups, compare.SUMMARY_GROUPS), listed)
    assert.matches("class: ", text, 1, true)
    local _, full = ember("compare-artifacts", dir .. "/A", dir .. "/B", "--records")
    local _, rows = full:gsub("\n  %a[%w_]+%s+[%d%-]+%s+%a+%s+%d+%s+%d+x%d+", "")
    assert.equal(n_records, rows)
  end)

  it("compare-artifacts explains unreadable artifacts and bad arguments", function()
    local dir = H.tmpdir()
    local code, _, err = ember("compare-artifacts", dir, dir)
    assert.equal(1, code)
    assert.matches("manifest.json", err, 1, true)
    code, _, err = ember("compare-artifacts", dir)
    assert.equal(2, code)
    assert.matches("needs two artifact directories", err, 1, true)
    code, _, err = ember("compare-artifacts", dir, dir, "--require", "identical")
    assert.equal(2, code)
    assert.matches("--require: unknown comparison class 'identical'", err, 1, true)
  end)
end)

describe("tools/ember launcher", function()
  after_each(H.cleanup)

  local function run(cmd)
    local p = io.popen(cmd .. "; echo \"rc=$?\"")
    local text = p:read("a")
    p:close()
    return text
  end

  it("keeps generated text on stdout, notices on stderr, and exits with the CLI's code", function()
    local build = (os.getenv("EMBER_BUILD") or "build") .. "/ember-lua"
    if not H.read or not io.open(build, "rb") then return pending("missing " .. build) end
    local path = need_model()
    if not path then return end
    local dir = H.tmpdir()
    local launcher = "EMBER_LUA=" .. H.shell_quote(build) .. " tools/ember"
    local text = run(string.format("%s --model %s --prompt hi --max-tokens 2 --zero-layer-output 1:mlp "
      .. "--run-manifest %s 2>%s", launcher, H.shell_quote(path), H.shell_quote(dir .. "/run.json"),
      H.shell_quote(dir .. "/stderr")))
    assert.matches("rc=0", text, 1, true)
    assert.is_nil(text:find("MODIFIED", 1, true))
    assert.matches("this run was MODIFIED", H.read(dir .. "/stderr"), 1, true)
    text = run(launcher .. " --bogus 2>&1")
    assert.matches("unknown flag '--bogus'", text, 1, true)
    assert.matches("rc=2", text, 1, true)
  end)
end)

-- the tiny models made for this file
teardown(function() require("helpers.fixtures").cleanup() end)
