-- ember.cli.compare_models — `ember compare-models A.gguf B.gguf --prompt TEXT`: the divergence
-- table on stdout, and with --out DIR a JSON report plus plots (SVG and PNG, drawn by gnuplot).
-- Must not hold comparison logic (analysis/compare_models.lua) nor drawing code (analysis/plot.lua).

local flags = require("ember.cli.flags")
local selectors = require("ember.run.selectors")

local M = {}

-- The largest shard report.json compare-models merge reads (fs.read's bound).
local MAX_REPORT_BYTES = 1 << 30

local usage_error = flags.usage_error
local function stage_list(s) return selectors.parse_stage_list(s) end

M.FLAGS_LIST = {
  { "prompt", "string", "TEXT", "the prompt (required)" },
  { "max-tokens", "uint", "N", "tokens A generates greedily; B is fed the same (default 4)" },
  { "metric", function(s) return require("ember.sweep.metric").parse(s) end, "M",
    require("ember.sweep.metric").GRAMMAR .. ", A and B ids or strings (\" Paris\"); the shares recovered "
      .. "are of it (default kl)" },
  { "stages", stage_list, "LIST", "stages to localise (default after_layer; all = the four per-layer stages)" },
  { "out", "path", "DIR", "write report.json, divergence.{svg,png} and recovery.{svg,png} into DIR" },
  { "json", "bool", nil, "print the JSON report instead of the table" },
  { "shard", function(s) return require("ember.sweep").parse_shard(s) end, "I/N",
    "localise only the cells with index mod N = I (join with compare-models merge)" },
  flags.option("threads"),
  flags.option("kernels"),
  { "no-plot", "bool", nil, "do not draw the plots" },
  flags.option("help"),
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.usage({ "usage: ember compare-models A.gguf B.gguf --prompt TEXT [options]",
    "       ember compare-models merge OUT SHARD_DIR...", "", "options:" }, M.FLAGS_LIST,
    { "", "A and B are the same model in two weight types. See docs/sweeps.md." })
end

-- plots(dir, report) -> the report's plot section (file names and labels)
local function plots(dir, r)
  local json = require("ember.store.json")
  local plot = require("ember.analysis.plot")
  local xt = {}
  for l = 0, r.n_layers - 1 do xt[#xt + 1] = tostring(l) end
  local series = {}
  for _, stage in ipairs(selectors.RESIDUAL_LAYER_STAGES) do
    local v = {}
    for _, row in ipairs(r.divergence) do
      if row.stage == stage and row.prefill then v[row.layer + 1] = row.prefill.rel_l2 end
    end
    series[#series + 1] = { name = stage .. " (prefill)", values = v }
  end
  local title = string.format("relative L2 divergence of B (%s) from A (%s)", r.b.dtype, r.a.dtype)
  local d = plot.lines { dir = dir, base = "divergence", title = title, xlabel = "layer", ylabel = "relative L2",
    xtics = xt, series = series }
  local rec = {}
  for _, stage in ipairs(r.stages) do
    local pre, dec = {}, {}
    for _, l in ipairs(r.localisation) do
      if l.stage == stage then
        pre[l.layer + 1] = l.recovered_prefill ~= json.null and l.recovered_prefill or nil
        dec[l.layer + 1] = l.recovered_decode ~= json.null and l.recovered_decode or nil
      end
    end
    rec[#rec + 1] = { name = stage .. " prefill", values = pre }
    rec[#rec + 1] = { name = stage .. " decode", values = dec }
  end
  local kind = r.metric and r.metric.kind or "kl"
  local rtitle = kind == "kl" and "share of B's KL from A recovered by patching A's activation"
    or string.format("share of the gap from B's %s to A's recovered by patching A's activation", kind)
  local ylabel = kind == "kl" and "recovered share of KL" or ("recovered share of " .. kind)
  local c = plot.lines { dir = dir, base = "recovery", title = rtitle, xlabel = "layer patched",
    ylabel = ylabel, xtics = xt, series = rec }
  local fs = require("ember.store.fs")
  return json.ordered({ "tool", "files", "titles", "xlabels", "ylabels" }, { tool = "gnuplot",
    files = json.array({ fs.basename(d.svg), fs.basename(d.png), fs.basename(c.svg), fs.basename(c.png) }),
    titles = json.array({ title, rtitle }), xlabels = json.array({ "layer", "layer patched" }),
    ylabels = json.array({ "relative L2", ylabel }) })
end

-- main(args, argv, io_) -> exit code; args[1] is "compare-models". Usage errors are raised (ember.cli.flags)
-- for the ember command to report with exit code 2.
function M.main(args, _, io_)
  if args[2] == "merge" then return M.merge(args, io_) end
  local o, pos = flags.command({ name = "compare-models", spec = M.FLAGS, usage = M.usage, positionals = true }, args,
    io_)
  if not o then return 0 end
  if #pos ~= 2 then usage_error("compare-models needs two model files A.gguf B.gguf, got %d", #pos) end
  if o.prompt == nil then usage_error("compare-models: --prompt TEXT is required") end
  local fs = require("ember.store.fs")
  for i, p in ipairs(pos) do
    if not fs.exists(p) then usage_error("compare-models: cannot open model %s '%s'", i == 1 and "A" or "B", p) end
  end
  if o.out and fs.exists(o.out) then usage_error("--out: '%s' already exists", o.out) end
  if o.out and not fs.is_dir(fs.dirname(o.out)) then
    usage_error("--out: directory '%s' does not exist", fs.dirname(o.out))
  end
  local a, b = flags.load_model(o, { model = pos[1] }), flags.load_model(o, { model = pos[2] })
  local stages = o.stages
  if stages == "all" then stages = { table.unpack(selectors.RESIDUAL_LAYER_STAGES) } end
  local cm = require("ember.analysis.compare_models")
  -- token strings are resolved through A's tokenizer (A and B are one network: one vocabulary)
  local metric = o.metric and require("ember.sweep.metric").token_ids(o.metric,
    function(text) return a:to_single_token(text) end)
  local r = cm.run { a = a, b = b, prompt = o.prompt, max_tokens = o["max-tokens"], stages = stages, shard = o.shard,
    metric = metric }
  M.write(o, r, io_)
  io_.stdout:write(o.json and cm.to_json(r) or cm.format(r))
  return 0
end

-- write(o, report, io): DIR/report.json and, unless --no-plot or a shard, the plots
function M.write(o, r, io_)
  local fs = require("ember.store.fs")
  local cm = require("ember.analysis.compare_models")
  if o.out then
    assert(fs.mkdir(o.out))
    if not o["no-plot"] and not r.shard then
      local ok, err = pcall(function() r.plot = plots(o.out, r) end)
      if not ok then io_.stderr:write("ember: compare-models: plots not drawn: ", tostring(err), "\n") end
    end
    fs.write_atomic(fs.join(o.out, "report.json"), cm.to_json(r), "compare-models report")
    io_.stderr:write("ember: compare-models: report written to " .. o.out .. "\n")
  end
end

-- `ember compare-models merge OUT DIR...`: the shards' reports joined, with the plots
function M.merge(args, io_)
  local fs, json = require("ember.store.fs"), require("ember.store.json")
  local dirs = flags.operands("compare-models merge", args, M.usage, io_)
  if not dirs then return 0 end
  local out = table.remove(dirs, 1)
  if out == nil or #dirs == 0 then usage_error("compare-models merge needs OUT and at least one shard directory") end
  if fs.exists(out) then usage_error("compare-models merge: '%s' already exists", out) end
  local reports = {}
  for _, dir in ipairs(dirs) do
    local path = fs.join(dir, "report.json")
    reports[#reports + 1] = json.decode(fs.read(path, "compare-models merge", MAX_REPORT_BYTES), path)
  end
  local r = require("ember.analysis.compare_models").merge(reports)
  M.write({ out = out }, r, io_)
  io_.stdout:write(require("ember.analysis.compare_models").format(r))
  return 0
end

return M
