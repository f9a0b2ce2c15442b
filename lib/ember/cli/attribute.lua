-- ember.cli.attribute — `ember attribute --model M --clean T --corrupted T --metric M --components
-- LIST [--verify K] [--out DIR]`: attribution patching's report (attribute.json, scores.safetensors,
-- heatmaps of the head and residual scores). Must not compute scores: ember.analysis.attribute does.

local flags = require("ember.cli.flags")

local M = {}

local usage_error = flags.usage_error

M.FLAGS_LIST = flags.model_command {
  { "clean", "string", "TEXT", "the clean prompt (required)" },
  { "corrupted", "string", "TEXT", "the corrupted prompt, as many tokens as the clean one (required)" },
  { "pairs", "path", "FILE.jsonl", "a dataset instead of --clean/--corrupted (sweep --pairs' lines): the means "
    .. "over its pairs (metric default logit-diff, each pair's answer and wrong)" },
  { "metric", "string", "M", "logit-diff[:A,B] | prob[:A] | logit[:A] | logprob[:A] | kl (default kl)" },
  { "components", "string", "LIST", "heads,neurons,resid (default: all three)" },
  { "freeze", "string", "LIST", "attention,norm: the gradients' frozen modes (docs/attribution.md)" },
  { "verify", "uint", "K", "patch the top K and K sampled from the rest exactly: Spearman rho, false negatives" },
  { "seed", "uint", "N", "the seed of verify's sample (default 1)" },
  { "top", "uint", "N", "components listed in the report and on stdout (default 20)" },
  { "out", "path", "DIR", "where the report goes (default: none, stdout only)" },
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.command_usage("usage: ember attribute --model FILE.gguf --clean TEXT --corrupted TEXT | --pairs "
    .. "FILE.jsonl [options]",
    M.FLAGS_LIST, {
      "Writes DIR/attribute.json, DIR/scores.safetensors (heads [layers*heads, P], neurons [layers*n_ff, P],",
      "resid [layers, P]) and heatmaps of the head and residual scores. See docs/attribution.md." })
end

local function entry_json(json, e)
  return json.ordered({ "rank", "component", "layer", "index", "position", "score", "estimate", "group", "exact",
    "effect" }, { rank = e.rank, component = e.component, layer = e.layer, index = e.index, position = e.position,
    score = e.score, estimate = e.estimate, group = e.group, exact = e.exact, effect = e.effect })
end

-- The heatmaps: resid (layers x positions) and heads (layer.head x positions).
local function draw(dir, r, labels)
  local fs = require("ember.store.fs")
  local plot = require("ember.analysis.plot")
  local files = {}
  for _, c in ipairs(r.components) do
    if c ~= "neurons" then -- n_layers * n_ff rows: no readable figure; the scores are in the safetensors
      local units, rows, ytics = r.units[c], {}, {}
      local t = r.scores[c]
      for i = 1, t:shape()[1] do
        local l, u = (i - 1) // units, (i - 1) % units
        ytics[i] = c == "heads" and string.format("%d.%d", l, u) or tostring(l)
        rows[i] = t:row(i):values()
      end
      local out = plot.grid { dir = dir, base = "atp-" .. c, title = "AtP score, " .. c .. " (clean -> corrupted)",
        xlabel = "position", ylabel = c == "heads" and "layer.head" or "layer", cblabel = "score",
        xtics = labels, ytics = ytics, rows = rows, palette = "diverging" }
      files[#files + 1] = { component = c, svg = fs.basename(out.svg), png = fs.basename(out.png) }
    end
  end
  return files
end

local function report(o, r, model)
  local json = require("ember.store.json")
  local fs = require("ember.store.fs")
  local top = json.array()
  for i = 1, math.min(o.top or 20, #r.ranked) do top[i] = entry_json(json, r.ranked[i]) end
  local doc = { metric = { kind = r.metric.kind, tokens = json.array(r.metric.tokens) },
    clean_value = r.clean_value, corrupted_value = r.corrupted_value, components = json.array(r.components),
    clean_ids = json.array(r.clean_ids), corrupted_ids = json.array(r.corrupted_ids), top = top,
    model = model.info.family, n_layers = r.n_layers, positions = r.positions,
    pairs = r.pairs and { count = r.count, file = r.where or json.null } or nil }
  if r.verify then
    local checked, fns = json.array(), json.array()
    for i, e in ipairs(r.verify.checked) do checked[i] = entry_json(json, e) end
    for i, e in ipairs(r.verify.false_negatives) do fns[i] = entry_json(json, e) end
    doc.verify = { k = r.verify.k, rho = r.verify.rho, checked = checked, false_negatives = fns }
  end
  if o.out then
    fs.mkdir_p(o.out)
    require("ember.store.tensor_file").save(fs.join(o.out, "scores.safetensors"), r.scores)
    local token = require("ember.analysis.token_label").token
    local labels = {} -- as the sweep's: "position clean/corrupted token"
    for p = 1, r.positions do
      local a, b = token(model, r.clean_ids[p]), token(model, r.corrupted_ids[p])
      labels[p] = string.format("%d %s", p - 1, a == b and a or (a .. "/" .. b))
    end
    doc.plots = json.array(draw(o.out, r, labels))
    fs.write_atomic(fs.join(o.out, "attribute.json"), json.encode(doc, { indent = "  " }), "report")
  end
  return doc
end

local function freeze_list(v)
  if v == nil then return nil end
  local list = {}
  for item in v:gmatch("[^,]+") do list[#list + 1] = item end
  return list
end

-- main(args, argv, io_) -> exit code; args[1] is "attribute".
function M.main(args, _, io_)
  local o = flags.command({ name = "attribute", spec = M.FLAGS, usage = M.usage, required = { "model" } }, args, io_)
  if not o then return 0 end
  flags.pairs_or_prompts(o, "attribute")
  local fs = require("ember.store.fs")
  if not fs.exists(o.model) then usage_error("--model: cannot open '%s'", o.model) end
  local unwritable = require("ember.run.outputs").writable { { flag = "--out", path = o.out, kind = "dir" } }
  if unwritable then usage_error("%s", unwritable) end
  local model = flags.load_model(o)
  local r = require("ember.analysis.attribute").run { model = model, clean = o.clean, corrupted = o.corrupted,
    pairs = o.pairs, metric = o.metric, components = o.components, verify = o.verify, seed = o.seed,
    freeze = freeze_list(o.freeze) }
  report(o, r, model)
  for i = 1, math.min(o.top or 20, #r.ranked) do
    local e = r.ranked[i]
    io_.stdout:write(string.format("%d\t%s\tlayer %d\t%s %d\tposition %d\t%.6g\n", i, e.component, e.layer,
      e.component == "heads" and "head" or e.component == "neurons" and "neuron" or "unit", e.index, e.position,
      e.score))
  end
  if r.verify then
    io_.stderr:write(string.format("ember: attribute: verified %d components: Spearman rho %s, %d false negatives\n",
      #r.verify.checked, r.verify.rho and string.format("%.3f", r.verify.rho) or "undefined",
      #r.verify.false_negatives))
  end
  model:close()
  return 0
end

return M
