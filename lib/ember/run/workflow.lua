-- ember.run.workflow — the frozen capture -> zero -> patch -> restore criterion of SPEC §6.4, as a
-- function that returns a report (scripts/workflows/capture_patch_restore.lua prints it).
-- Must not loosen the criterion: equal generated text alone is never accepted as restoration.

local artifact = require("ember.store.artifact")
local compare = require("ember.analysis.compare")
local fs = require("ember.store.fs")
local run = require("ember.run")
local capture = require("ember.run.capture")
local patch = require("ember.run.patch")

local M = {}

-- Provenance that may differ between A and C (SPEC §6.4): what was recorded about the run, never
-- what it computed from. created_at_unix and capture.output_dir are ignored by compare anyway.
M.ALLOWED_AC_DIFFERENCES = { "experiment", "capture.config", "capture.config_sha256", "argv",
  "created_at_unix", "capture.output_dir", "model.sha256_source" }

local function allowed(path)
  for _, p in ipairs(M.ALLOWED_AC_DIFFERENCES) do
    if path == p or path:sub(1, #p + 1) == p .. "." then return true end
  end
  return false
end

local ids_equal = compare.same_ids

local function check(report, name, ok, detail)
  report.checks[#report.checks + 1] = { name = name, ok = ok and true or false, detail = detail }
end

-- the captured logits of two artifacts equal by sha256 per tensor (not through compare's byte
-- equality) -> equal, the number of after_logits records of c
local function logits_equal_by_sha256(a, c)
  local logits_a, logits_c, equal = {}, {}, true
  for _, r in ipairs(a.records) do if r.stage == "after_logits" then logits_a[artifact.record_key(r)] = r.sha256 end end
  local n_logits = 0
  for _, r in ipairs(c.records) do
    if r.stage == "after_logits" then
      n_logits = n_logits + 1
      logits_c[artifact.record_key(r)] = r.sha256
      if logits_a[artifact.record_key(r)] ~= r.sha256 then equal = false end
    end
  end
  for k in pairs(logits_a) do if not logits_c[k] then equal = false end end
  return equal, n_logits
end

-- restoration_checks(report, A, C, p): the criterion's checks of the patched run C against the
-- baseline A (p: the patch experiment), added to report.checks
local function restoration_checks(report, A, C, p)
  local ac = compare.compare(A, C)
  report.ac = ac
  check(report, "A/C: class exact-semantic or stricter", compare.at_least(ac.class, "exact-semantic"),
    string.format("class %s (%s)", ac.class, ac.reason))
  check(report, "A/C: every aligned record bit-identical",
    ac.summary.aligned > 0 and ac.summary.identical == ac.summary.aligned,
    string.format("%d of %d aligned records bit-identical", ac.summary.identical, ac.summary.aligned))

  local logits_equal, n_logits = logits_equal_by_sha256(A, C)
  check(report, "A/C: captured logits equal by sha256", logits_equal and n_logits > 0,
    string.format("%d after_logits records", n_logits))

  local ma, mc = A.manifest, C.manifest
  check(report, "A/C: generated token ids equal", ids_equal(ma.generated_ids, mc.generated_ids),
    "A " .. table.concat(ma.generated_ids, " ") .. " | C " .. table.concat(mc.generated_ids, " "))
  local same_inputs = ma.model.sha256 == mc.model.sha256 and ma.tokenizer.sha256 == mc.tokenizer.sha256
    and ma.prompt.sha256 == mc.prompt.sha256 and ids_equal(ma.input_ids, mc.input_ids)
  check(report, "A/C: model, tokenizer, prompt and input hashes equal", same_inputs, nil)
  local unexpected = {}
  for _, d in ipairs(ac.provenance_differences) do
    if not allowed(d.path) then unexpected[#unexpected + 1] = d.path end
  end
  check(report, "A/C: only recorded provenance differs", #unexpected == 0,
    #unexpected == 0 and "experiment, capture config, argv, timestamp"
      or ("unexpected: " .. table.concat(unexpected, ", ")))
  -- one prefill and one decode per generated token, the last one included (SPEC §4.1)
  check(report, "patch applied at every source record",
    p.stats.applied == #p.entries and #p.entries == 1 + #ma.generated_ids,
    string.format("%d applications for %d source records (prefill + %d decodes)", p.stats.applied, #p.entries,
      #ma.generated_ids))
end

-- capture_patch_restore(opts) -> report
-- opts: { model = loaded model, tokenizer_path, prompt, layer = 4, max_tokens = 4, out_dir (must
--         not exist; created), argv, zero_stage = "mlp" }
-- report: { ok, checks = { {name, ok, detail} }, ab, ac (compare results), runs = {A, B, C},
--           dirs = {A, B, C}, layer }
function M.capture_patch_restore(opts)
  local model = opts.model
  local info = model.info
  local L = opts.layer or 4
  if L < 0 or L >= info.n_layers then
    error(string.format("layer %d is out of range (the model has %d layers: 0-%d)", L, info.n_layers,
      info.n_layers - 1), 0)
  end
  local cfg = assert(capture.config { layers = "all", phase = "all", positions = "all" })
  local ok_dir, derr = fs.mkdir(opts.out_dir)
  if not ok_dir then error("output directory: " .. derr, 0) end
  local dirs = { A = fs.join(opts.out_dir, "A"), B = fs.join(opts.out_dir, "B"), C = fs.join(opts.out_dir, "C") }
  local gen = { max_tokens = opts.max_tokens or 4, temperature = 0.0, top_k = 0, top_p = 1.0, seed = 0 }
  local base_argv = opts.argv or { "capture_patch_restore.lua" }
  local function argv(session)
    local a = { table.unpack(base_argv) }
    a[#a + 1] = "[session " .. session .. "]"
    return a
  end
  local function session(name, experiments, exp_args)
    return run.execute {
      model = model, tokenizer_path = opts.tokenizer_path, prompt = opts.prompt, gen = gen,
      experiments = experiments, capture = { config = cfg, dir = dirs[name] },
      experiment_args = exp_args, argv = argv(name),
    }
  end

  local report = { layer = L, dirs = dirs, runs = {}, checks = {} }

  -- A: baseline with capture
  report.runs.A = session("A", {}, "")

  -- B: the MLP output of layer L zeroed, same capture
  local zero = require("ember.run.builtin").experiment("zero_layer_output",
    { target = L .. ":mlp", notice = function() end })
  report.runs.B = session("B", { zero }, L .. ":mlp")
  report.zero_interventions = zero.stats.interventions

  local A = artifact.read(dirs.A)
  local B = artifact.read(dirs.B)
  report.ab = compare.compare(A, B)
  check(report, "A/B differ: class weaker than exact-semantic", not compare.at_least(report.ab.class, "exact-semantic"),
    string.format("class %s; %d of %d aligned records differ", report.ab.class, report.ab.summary.differing,
      report.ab.summary.aligned))

  -- C: layer L after_mlp patched from A in prefill and at every decode position, same capture
  local p = patch.experiment { source = A, target = { layer = L, stage = "after_mlp" }, model = model }
  report.runs.C = session("C", { p }, dirs.A .. " " .. L .. ":after_mlp")
  report.patch_applied = p.stats.applied
  report.patch_sources = #p.entries

  restoration_checks(report, A, artifact.read(dirs.C), p)

  report.ok = true
  for _, c in ipairs(report.checks) do if not c.ok then report.ok = false end end
  return report
end

-- format(report [, model_info [, artifacts_kept]]) -> the text the workflow script prints.
function M.format(report, model_info, artifacts_kept)
  local out = {}
  local function line(...) out[#out + 1] = string.format(...) end
  local A, B, C = report.runs.A.out, report.runs.B.out, report.runs.C.out
  line("capture -> zero -> patch -> restore (SPEC 6.4)")
  if model_info then
    line("model: %s (%s, %d layers, hidden %d)", model_info.path, model_info.family, model_info.n_layers,
      model_info.hidden_size)
  end
  line("target: layer %d after_mlp; prompt %d tokens; %d generated tokens", report.layer, #A.prompt_ids, #A.ids)
  line("")
  line("A  baseline + capture                 ids: %s", table.concat(A.ids, " "))
  line("B  zero-layer-output %d:mlp + capture  ids: %s  (%d zeroings)", report.layer, table.concat(B.ids, " "),
    report.zero_interventions)
  line("C  activation-patch %d:after_mlp from A ids: %s  (%d applications)", report.layer, table.concat(C.ids, " "),
    report.patch_applied)
  line("")
  local first_diff
  for _, r in ipairs(report.ab.records) do
    if r.status ~= "identical" then first_diff = r; break end
  end
  line("compare A/B: %s — %d of %d aligned records differ%s", report.ab.class, report.ab.summary.differing,
    report.ab.summary.aligned, first_diff and (", first: " .. first_diff.label) or "")
  line("compare A/C: %s — %d of %d aligned records bit-identical", report.ac.class, report.ac.summary.identical,
    report.ac.summary.aligned)
  local by_kind = { recorded = {}, ignored = {}, semantic = {} }
  for _, d in ipairs(report.ac.provenance_differences) do table.insert(by_kind[d.kind], d.path) end
  for _, kind in ipairs({ "semantic", "recorded", "ignored" }) do
    if #by_kind[kind] > 0 then line("  %s provenance differing A/C: %s", kind, table.concat(by_kind[kind], ", ")) end
  end
  line("")
  for _, c in ipairs(report.checks) do
    line("[%s] %s%s", c.ok and "PASS" or "FAIL", c.name, c.detail and (": " .. c.detail) or "")
  end
  line("")
  if artifacts_kept ~= false then
    line("artifacts: A=%s B=%s C=%s", report.dirs.A, report.dirs.B, report.dirs.C)
  end
  line("restoration criterion: %s", report.ok and "HOLDS" or "FAILED")
  return table.concat(out, "\n") .. "\n"
end

return M
