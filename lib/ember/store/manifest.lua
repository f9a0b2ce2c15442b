-- ember.store.manifest — provenance of a run (model, tokenizer, prompt, ids, settings, experiment) and the
-- run manifest written for every run that has an experiment.
-- Must not run anything: callers pass what was loaded and what generate() returned.
--
-- Capture artifacts embed the same sections (artifact.lua), so a run manifest and an artifact
-- manifest can be read with the same eyes.

local json = require("ember.store.json")
local fs = require("ember.store.fs")
local core = require("ember.core")

local M = {}

M.SCHEMA = "ember.run"
M.SCHEMA_VERSION = "1.0.0"


-- Small files named by the run (tokenizer.json) are hashed here; a workflow runs several sessions
-- on one tokenizer, so their digests are remembered per path and invalidated when the size
-- changes. The model file's digest is the model's own (model:sha256(): cached on disk by the
-- file's identity, computed in the background; docs/artifacts.md).
local digest_cache = {}

local function file_size(path) return require("ember.store.fs").size(path) end

function M.file_sha256(path)
  local size = file_size(path)
  local hit = digest_cache[path]
  if hit and hit.size == size then return hit.sha256 end
  local hex, err = core.sha256_file(path)
  if not hex then error("cannot hash '" .. path .. "': " .. tostring(err), 0) end
  digest_cache[path] = { size = size, sha256 = hex }
  return hex
end

-- model_sha256(model) -> hex, "cached"|"fresh": waits for the model's digest (started at load with
-- provenance=true, else now).
function M.model_sha256(model)
  local hex, source = model:sha256()
  if not hex then error("cannot hash '" .. tostring(model.info.path) .. "': " .. tostring(source), 0) end
  return hex, source
end

-- override_section(info) -> the per-tensor overrides the model was loaded with (ember.load{override=}):
-- the file they come from, its sha256 and the tensors, or nil when none.
function M.override_section(info)
  local o = info.override
  if not o then return nil end
  return json.ordered({ "from", "sha256", "tensors" },
    { from = o.from, sha256 = M.file_sha256(o.from), tensors = json.array(o.tensors) })
end

-- model_section(model) -> what identifies the model: its file's sha256 (and whether that digest
-- was computed for this run or taken from the digest cache) and what the engine read; with the
-- override section when some of its tensors come from another file.
function M.model_section(model)
  local info = model.info
  local sha256, source = M.model_sha256(model)
  return json.ordered({ "path", "sha256", "sha256_source", "family", "architecture", "name", "n_layers",
    "hidden_size", "n_vocab", "dtype_summary", "experimental", "override" }, {
    path = info.path, sha256 = sha256, sha256_source = source, family = info.family,
    architecture = info.architecture, name = info.name, n_layers = info.n_layers,
    hidden_size = info.hidden_size, n_vocab = info.n_vocab, dtype_summary = info.dtype_summary,
    experimental = info.experimental == true, override = M.override_section(info),
  })
end

-- tokenizer_section(tokenizer_path, model_sha256): a tokenizer.json is identified by its own bytes;
-- the GGUF-embedded vocabulary by the GGUF's bytes (it cannot change without them changing).
function M.tokenizer_section(tokenizer_path, model_sha256)
  if tokenizer_path then
    return json.ordered({ "source", "path", "sha256" },
      { source = "file", path = tokenizer_path, sha256 = M.file_sha256(tokenizer_path) })
  end
  return json.ordered({ "source", "sha256" }, { source = "gguf", sha256 = model_sha256 })
end

-- prompt_section(text, ids, withhold): the prompt is always identified by sha256; its text is
-- stored unless withheld. A prompt given as ids is hashed as its decimal id list.
function M.prompt_section(text, ids, withhold)
  local hashed = text
  if hashed == nil then
    local parts = {}
    for i, id in ipairs(ids) do parts[i] = tostring(id) end
    hashed = "ids:" .. table.concat(parts, ",")
  end
  return json.ordered({ "sha256", "source", "text", "withheld", "token_count" }, {
    sha256 = core.sha256(hashed), source = text ~= nil and "text" or "ids",
    text = (text ~= nil and not withhold) and text or json.null, withheld = withhold == true,
    token_count = #ids,
  })
end

-- settings_section(gen) -> the sampling settings that decide the generated ids.
function M.settings_section(gen)
  return json.ordered({ "max_tokens", "temperature", "top_k", "top_p", "seed" }, {
    max_tokens = gen.max_tokens, temperature = (gen.temperature or 0) + 0.0, top_k = gen.top_k or 0,
    top_p = (gen.top_p or 1) + 0.0, seed = gen.seed or 0,
  })
end

-- execution_section(model) -> how it was computed: kernel set, threads and whether the thread
-- count was the default (the physical cores of the machine) -- recorded, not semantic -- and the
-- KV cache type (a numerics setting: compare treats it as semantic).
function M.execution_section(model)
  local info = model.info
  return json.ordered({ "kernels", "threads", "threads_default", "physical_cores", "kv_cache" }, {
    kernels = info.kernels, threads = info.threads, threads_default = info.threads_default == true,
    physical_cores = core.cpu().physical_cores, kv_cache = info.kv_cache or "f32",
  })
end

-- experiment_section(exp, args, out): what ran and whether it changed execution. Members of a
-- composed experiment report their own counters through an optional `stats` table.
function M.experiment_section(exp, args, out)
  local members = json.array()
  for _, m in ipairs(exp and (exp.members or { exp }) or {}) do
    local stats = {}
    if type(m.stats) == "table" then
      for k, v in pairs(m.stats) do
        if type(v) == "number" or type(v) == "string" or type(v) == "boolean" then stats[k] = v end
      end
    end
    -- `details`: what an intervention wants on record beyond counters (the steering vectors'
    -- sha256, shape, scale, layers and stage), written as given; absent for most members
    members[#members + 1] = json.ordered({ "name", "stats", "details" }, { name = m.name, stats = stats,
      details = type(m.details) == "table" and m.details or nil })
  end
  return json.ordered({ "name", "args", "modified", "members" }, {
    name = exp and exp.name or "none", args = args or "", modified = out and out.modified == true or false,
    members = members,
  })
end

-- sections(p) -> the provenance tables shared by run manifests and artifacts.
-- p: { model, tokenizer_path, prompt_text, withhold_prompt, gen (generate options), out (its
--      result), experiment, experiment_args, argv, created_at_unix }
function M.sections(p)
  local model = M.model_section(p.model)
  local argv = json.array()
  for i, a in ipairs(p.argv or {}) do argv[i] = tostring(a) end
  return {
    created_at_unix = p.created_at_unix or os.time(),
    tool = json.ordered({ "name", "version" }, { name = "ember", version = core.version }),
    model = model,
    tokenizer = M.tokenizer_section(p.tokenizer_path, model.sha256),
    prompt = M.prompt_section(p.prompt_text, p.out.prompt_ids, p.withhold_prompt),
    input_ids = json.array({ table.unpack(p.out.prompt_ids) }),
    generated_ids = json.array({ table.unpack(p.out.ids) }),
    settings = M.settings_section(p.gen),
    execution = M.execution_section(p.model),
    experiment = M.experiment_section(p.experiment, p.experiment_args, p.out),
    argv = argv,
  }
end

local RUN_ORDER = { "schema", "schema_version", "created_at_unix", "status", "tool", "model", "tokenizer",
  "prompt", "input_ids", "generated_ids", "settings", "execution", "experiment", "outputs", "argv" }

-- write_run(path, sections, outputs [, status]): the run manifest (what ran, with what, whether it
-- modified execution, where its outputs went), written atomically.
function M.write_run(path, sections, outputs, status)
  local doc = {}
  for k, v in pairs(sections) do doc[k] = v end
  doc.schema = M.SCHEMA
  doc.schema_version = M.SCHEMA_VERSION
  doc.status = status or "completed"
  doc.outputs = outputs or {}
  fs.write_atomic(path, json.encode(json.ordered(RUN_ORDER, doc), { indent = "  " }), "run manifest")
end

return M
