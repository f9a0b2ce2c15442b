-- ember.run — one generation with optional interventions and observers, then its outputs: the
-- capture artifact and the run manifest. Shared by the `ember` command and the workflows.
-- Must not parse flags or print: callers decide what the user sees.

local capture = require("ember.run.capture")
local compose = require("ember.run.compose")
local manifest = require("ember.store.manifest")

local M = {}

-- late_failure(err, outputs) -> err, plus what this run had already put in place by then (the
-- outputs written before the run manifest), so a failed run does not hide finished artifacts.
function M.late_failure(err, outputs)
  local done, keys = {}, {}
  for k in pairs(outputs) do
    if not k:match("_sha256$") then keys[#keys + 1] = k end
  end
  table.sort(keys)
  for _, k in ipairs(keys) do done[#done + 1] = string.format("%s '%s'", (k:gsub("_", " ")), outputs[k]) end
  if #done == 0 then return tostring(err) end
  return string.format("%s; already written and complete: %s (the run manifest describing them is missing)",
    tostring(err), table.concat(done, ", "))
end

-- execute(p) -> { out, sections, experiment, capture_manifest }
-- p: { model, tokenizer_path, prompt (text) | ids, gen = { max_tokens, temperature, top_k, top_p,
--      seed, context }, experiments = { interventions..., observers... } (order kept), capture = { config,
--      dir } | nil, experiment_args, argv, run_manifest = path | nil, outputs = {...}, on_token }
-- Hook failures propagate unchanged (SPEC §4.4 message); nothing is written for a failed run.
-- A run manifest is written whenever a path is given (experiment "none" for a plain run).
function M.execute(p)
  local list = {}
  for _, e in ipairs(p.experiments or {}) do list[#list + 1] = e end
  -- the dump observer reads views only; it is not an experiment of the run (no manifest section)
  local dump_obs = p.dumps and p.dumps.observer
  local cap
  if p.capture then
    cap = capture.experiment(p.capture.config)
    list[#list + 1] = cap -- last: it records what the network actually used
  end
  local exp = #list > 0 and compose.compose(list) or nil
  local hooks = exp
  if dump_obs then hooks = exp and compose.compose({ exp, dump_obs }) or dump_obs end
  -- The manifest needs the model file's digest: start it now (if load did not) so it runs in the
  -- background while generating; it is collected only when the manifest is written.
  if exp or p.run_manifest then p.model:sha256_start() end
  local gen = p.gen or {}
  local req = {
    max_tokens = gen.max_tokens, temperature = gen.temperature, top_k = gen.top_k, top_p = gen.top_p,
    seed = gen.seed, context = gen.context, experiment = hooks, on_token = p.on_token, trace = p.trace,
    trace_filter = p.trace_filter,
  }
  if p.ids then req.ids = p.ids else req.prompt = p.prompt end
  local ok, out = pcall(p.model.generate, p.model, req)
  if not ok then
    if dump_obs then dump_obs:discard() end -- the spilled views of a run that did not finish
    error(out, 0)
  end

  local result = { out = out, experiment = exp, capture = cap }
  local written = {}
  if dump_obs then
    local dump = require("ember.run.dump")
    local prov = dump.provenance(p.model, p.prompt, p.tokenizer_path, gen, out)
    if p.dumps.layers then
      dump.write_layers(p.dumps.layers, dump_obs, prov, p.model.info.n_layers)
      written.layer_dump = p.dumps.layers
    end
    if p.dumps.logits then
      dump.write_logits(p.dumps.logits, dump_obs, prov)
      written.logits_dump = p.dumps.logits
    end
  end
  if out.trace then
    written.trace = p.trace
    written.trace_fingerprint = out.trace.fingerprint
  end
  if exp or p.run_manifest then
    result.sections = manifest.sections {
      model = p.model, tokenizer_path = p.tokenizer_path, prompt_text = p.prompt, gen = gen, out = out,
      experiment = exp, experiment_args = p.experiment_args, argv = p.argv,
      withhold_prompt = p.capture and p.capture.config.omit_prompt,
    }
    if cap then
      result.capture_manifest, result.capture_manifest_sha256 = capture.write(p.capture.dir, cap, result.sections)
    end
    if p.run_manifest then
      local outputs = {}
      for k, v in pairs(p.outputs or {}) do outputs[k] = v end
      for k, v in pairs(written) do outputs[k] = v end
      if cap then outputs.capture_artifact = p.capture.dir end
      -- binds the run manifest to the artifact it describes (sha256 of its manifest.json)
      if cap then outputs.capture_manifest_sha256 = result.capture_manifest_sha256 end
      local ok, err = pcall(manifest.write_run, p.run_manifest, result.sections, outputs)
      if not ok then error(M.late_failure(err, outputs), 0) end
    end
  end
  return result
end

return M
