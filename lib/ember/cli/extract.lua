-- ember.cli.extract — `ember --extract-hidden LAYERS --extract-out FILE` (with --prompt or --prompts):
-- the flags an extraction takes checked, the model loaded, the extraction run and its files written.
-- Must not hold extraction logic (ember.analysis.extract does) nor run with an experiment (refused first).

local extract = require("ember.analysis.extract")
local flags = require("ember.cli.flags")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local sha256 = require("ember.core").sha256

local M = {}

-- The flags of `ember` an extraction uses; any other (generation, capture, patch settings) would
-- be silently ignored, so it is a usage error.
local EXTRACT_FLAGS = { "model", "tokenizer", "arch", "kernels", "threads", "kv-cache", "verify-model", "verbose",
  "prompt", "prompts", "extract-hidden", "extract-out" }

-- run(o, argv, io_) -> exit code: the flags parsed by ember.cli; refuses experiments first.
function M.run(o, argv, io_)
  local usage_error = flags.usage_error
  for _, k in ipairs(flags.EXPERIMENT_FLAGS) do
    if o[k] ~= nil then flags.refuse_experiments("--extract-hidden", k) end
  end
  if o["extract-hidden"] == nil or o["extract-out"] == nil then
    usage_error("--extract-hidden LAYERS and --extract-out FILE go together (--prompts FILE.jsonl needs both)")
  end
  local allowed = {}
  for _, k in ipairs(EXTRACT_FLAGS) do allowed[k] = true end
  local given = {}
  for k in pairs(o) do given[#given + 1] = k end
  table.sort(given)
  for _, k in ipairs(given) do
    if not allowed[k] then
      usage_error("--%s does not apply to --extract-hidden (an extraction runs the prompt only, nothing is "
        .. "generated)", k)
    end
  end
  if (o.prompt == nil) == (o.prompts == nil) then
    usage_error("--extract-hidden needs exactly one of --prompt TEXT or --prompts FILE.jsonl")
  end
  if o.model == nil then usage_error("--model FILE.gguf is required") end
  local out = o["extract-out"]
  local sidecar = extract.sidecar_path(out)
  local outs = require("ember.run.outputs")
  local list = {
    { flag = "--extract-out", path = out, kind = "file" },
    { flag = "--extract-out (its sidecar)", path = sidecar, kind = "file" },
  }
  local clash = outs.check(list)
  if clash then usage_error("%s", clash) end
  local parent = fs.dirname(out)
  if not fs.is_dir(parent) then
    usage_error("--extract-out: directory '%s' does not exist (so '%s' cannot be created)", parent, out)
  end
  if fs.is_dir(out) then usage_error("--extract-out: '%s' is a directory; give a file name", out) end
  local unwritable = outs.writable(list)
  if unwritable then usage_error("%s", unwritable) end
  local prompts, data
  if o.prompts then
    local okp, list, digest = pcall(extract.read_prompts, o.prompts, "--prompts")
    if not okp then usage_error("%s", list) end
    prompts, data = list, { source = "jsonl", path = o.prompts, sha256 = digest }
  else
    prompts = { { prompt = o.prompt } }
    data = { source = "prompt", path = json.null, sha256 = sha256(o.prompt) }
  end

  local model = flags.load_model(o, { provenance = true })
  if model.tokenizer == nil then
    usage_error("--extract-hidden needs a tokenizer and the model has none: give one with --tokenizer FILE")
  end
  local layers, lerr = extract.check_layers(o["extract-hidden"], model.info)
  if not layers then usage_error("--extract-hidden: %s", lerr) end
  for i, p in ipairs(prompts) do
    local n = #model.tokenizer:encode(p.prompt)
    local limit = model.info.context_length or 0
    if limit > 0 and n + 1 > limit then
      usage_error("--prompts: prompt %d (line %s) has %d tokens, more than the model's context_length %d", i,
        tostring(p.line or "-"), n, limit)
    end
  end
  local progress = require("ember.sweep.progress").new { label = "extract", unit = "prompts",
    stream = io_.stderr, resumable = false }
  local results = extract.run(model, prompts, layers, progress)
  for i, r in ipairs(results) do r.line = prompts[i].line end
  local doc = extract.write(out, results, { model = model, layers = layers, tokenizer_path = o.tokenizer, data = data,
    argv = argv })
  io_.stderr:write(string.format("ember: extracted layers %s of %d prompts (%d tokens, hidden %d) into %s "
    .. "(sidecar %s)\n", table.concat(layers, ","), doc.prompt_count, doc.token_count, doc.hidden_size, out, sidecar))
  model:close()
  return 0
end

return M
