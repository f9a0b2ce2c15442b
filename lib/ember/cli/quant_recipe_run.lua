-- ember.cli.quant_recipe_run — the steps of `ember quant-recipe` once its flags hold: the models and
-- prompts, the passes (ember.analysis.quant_select; the first pass kept, resumed and sharded through
-- ember.analysis.quant_first_pass, its shards run by ember.run.shards), the recipe and command
-- files, the verification with llama-quantize, the plot and the report, written into --out.
-- Progress goes to stderr.

local flags = require("ember.cli.flags")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local qr = require("ember.analysis.quant_recipe")
local sel = require("ember.analysis.quant_select")
local fp = require("ember.analysis.quant_first_pass")

local M = {}

local function model_section(m)
  local man = require("ember.store.manifest")
  return json.ordered({ "path", "sha256", "dtype_summary", "bytes" }, { path = m.info.path,
    sha256 = man.file_sha256(m.info.path), dtype_summary = m.info.dtype_summary, bytes = fs.size(m.info.path) })
end

local function load(o, path, override)
  return flags.load_model(o, { model = path, override = override })
end

-- the prompts that choose, and the held-out ones (nil without --held-out or --split)
local function prompt_sets(c, a)
  local o = c.o
  local all, digest = c.read_prompts(o.prompts, "--prompts", a)
  local held, held_digest
  if o["held-out"] then held, held_digest = c.read_prompts(o["held-out"], "--held-out", a) end
  if o.split then
    if #all < 2 then flags.usage_error("--split: --prompts holds %d prompt; it needs two or more", #all) end
    local choose = {}
    held = {}
    for i, p in ipairs(all) do
      if i % 2 == 1 then choose[#choose + 1] = p else held[#held + 1] = p end
    end
    all = choose
  end
  return all, digest, held, held_digest
end

-- --out: new, or a stopped run's (its checkpoint and no report yet); created here
local function prepare_out(o)
  if fs.exists(o.out) then
    if fs.exists(fs.join(o.out, "report.json")) then
      flags.usage_error("--out: '%s' holds a finished run (report.json); give a new directory", o.out)
    end
    if not fs.exists(fs.join(o.out, fp.FILE)) and #fs.list_dir(o.out) > 0 then
      flags.usage_error("--out: '%s' already exists and is not a stopped quant-recipe run (no %s)", o.out, fp.FILE)
    end
  else
    local ok, err = fs.mkdir(o.out)
    if not ok then flags.usage_error("--out: %s", tostring(err)) end
  end
end

-- the shards of --jobs N as local processes into OUT.shards/I -> their directories
local function run_jobs(c, progress)
  local o = c.o
  local args = { table.unpack(c.args) }
  if not o.threads then -- N processes share the cores
    local cores = require("ember.core").cpu().physical_cores or 1
    args[#args + 1] = "--threads=" .. math.max(1, cores // o.jobs)
  end
  local last = -1
  return require("ember.run.shards").run { command = "quant-recipe", args = args, n = o.jobs,
    base = o.out .. ".shards", label = "quant-recipe --jobs", noun = "groups",
    count = function(dir)
      local ok, doc = pcall(fp.read, dir)
      if not ok or not doc then return 0, nil end
      local n = 0
      for _ in pairs(doc.groups) do n = n + 1 end
      return n, math.tointeger(doc.total_groups)
    end,
    on_count = function(done, total)
      if done ~= last and total then progress(string.format("first pass: %d/%d groups in %d shards", done, total,
        o.jobs)) end
      last = done
    end }
end

-- the passes: reference, B's own divergence, first pass (stopping there for a shard), selection
local function passes(c, a, b, prompts, held, progress, sections)
  local o = c.o
  local metric = require("ember.sweep.metric").token_ids(c.metric, function(t) return a:to_single_token(t) end)
  local settings, digest = fp.settings { a_sha256 = sections.a.sha256, b_sha256 = sections.b.sha256,
    prompts = prompts, metric = metric, per_tensor = o["per-tensor"], kernels = o.kernels or "auto" }
  local from = { o.out }
  for _, d in ipairs(c.from) do from[#from + 1] = d end
  if o.jobs then
    for _, d in ipairs(run_jobs(c, progress)) do from[#from + 1] = d end
  end
  local done, saved = fp.gather(from, digest)
  local ref = qr.reference(a, prompts, metric)
  local held_ref = held and qr.reference(a, held, metric)
  local identical = {}
  for _, t in ipairs(b:tensors()) do identical[t.name] = a:same_tensor(b, t.name) end
  a:close() -- the passes map A's file only for the tensors they take from it
  local base = qr.measure(b, prompts, ref)
  if base.divergence == 0 then
    error("quant-recipe: B does not diverge from A on these prompts (divergence 0): nothing to recover", 0)
  end
  progress(string.format("B's divergence from A: %.6g (top-1 agreement %.1f%%)", base.divergence, 100 * base.top1))
  local tensors = b:tensors()
  local groups = qr.groups(tensors, o["per-tensor"])
  qr.costs(groups, c.types, require("ember.core").WEIGHT_TYPES)
  local shard = o.shard
  local po = { groups = groups, prompts = prompts, ref = ref, base = base, progress = progress,
    target = o.target or 0.9, budget = o["budget-mib"] and math.floor(o["budget-mib"] * 1048576),
    same = function(name) return identical[name] end,
    load = function(names) return load(o, o.quantized, { from = o.reference, tensors = names }) end,
    done = done, mine = shard and function(i) return (i - 1) % shard.count == shard.index end,
    save = fp.saver(o.out, { settings = settings, settings_sha256 = digest, args = c.args, total_groups = #groups,
      shard = shard and json.ordered({ "index", "count" }, { index = shard.index, count = shard.count }) }, done) }
  if saved > 0 then progress(string.format("first pass: %d groups measured before, taken as saved", saved)) end
  local now = require("ember.core").now_ms
  local t0 = now()
  local _, measured, resumed = sel.first_pass(po)
  local t1 = now()
  if shard then return { shard = shard, measured = measured, resumed = resumed, groups = groups } end
  local selection = sel.select(po)
  local timing = json.ordered({ "first_pass_seconds", "first_pass_groups", "first_pass_measured",
    "first_pass_resumed", "selection_seconds", "selection_passes" }, { first_pass_seconds = (t1 - t0) / 1000,
    first_pass_groups = #groups, first_pass_measured = measured, first_pass_resumed = resumed,
    selection_seconds = (now() - t1) / 1000, selection_passes = #selection.steps })
  return { timing = timing, metric = metric, ref = ref, held_ref = held_ref, base = base, groups = groups,
    selection = selection, tensors = tensors, target = po.target, budget = po.budget }
end

-- DIR/tensor-types.txt and DIR/command.txt -> the report's recipe section
local function write_recipe(c, r)
  local o = c.o
  local lines, changed = sel.lines(r.tensors, r.selection.chosen)
  local file = fs.join(o.out, "tensor-types.txt")
  fs.write_atomic(file, table.concat(lines, "\n") .. "\n", "quant-recipe recipe")
  local q = c.quantizer or "llama-quantize"
  local out_gguf = fs.join(o.out, "recipe.gguf")
  local base = sel.base_type(r.tensors)
  local cmd = table.concat({ fs.shell_quote(q), "--pure", "--tensor-type-file", fs.shell_quote(file),
    fs.shell_quote(o.reference), fs.shell_quote(out_gguf), base }, " ")
  fs.write_atomic(fs.join(o.out, "command.txt"), cmd .. "\n", "quant-recipe command")
  return json.ordered({ "file", "lines", "changed", "base_type", "command" },
    { file = file, lines = #lines, changed = changed, base_type = base, command = cmd, out = out_gguf })
end

-- quantizes A with the recipe, checks the file's types and measures it -> the verification section
local function verify(c, r, recipe, held, b, progress)
  if not c.quantizer then return json.ordered({ "skipped" }, { skipped = c.why_not }) end
  progress("quantizing A with the recipe: " .. recipe.command)
  local log = fs.join(c.o.out, "llama-quantize.log")
  local ok = os.execute(recipe.command .. " >" .. fs.shell_quote(log) .. " 2>&1")
  if not ok or not fs.exists(recipe.out) then
    error("quant-recipe: llama-quantize failed (its output: " .. log .. ")", 0)
  end
  local q = load(c.o, recipe.out)
  local types = {}
  for _, t in ipairs(q:tensors()) do types[t.name] = t.type:lower() end
  local round_trip, mismatch = true, json.array({})
  for _, l in ipairs(sel.read_lines(fs.read(recipe.file, "quant-recipe recipe", 1 << 24))) do
    if types[l.name] ~= l.type then
      round_trip = false
      mismatch[#mismatch + 1] = string.format("%s: %s, not %s", l.name, tostring(types[l.name]), l.type)
    end
  end
  local set = held or r.prompts
  local ref = held and r.held_ref or r.ref
  local mq, mb = qr.measure(q, set, ref), qr.measure(b, set, ref)
  q:close()
  return json.ordered({ "file", "held_out", "prompts", "recovered", "kl", "top1_agreement", "b_kl",
    "b_top1_agreement", "bytes", "b_bytes", "a_bytes", "round_trip", "mismatches" }, { file = recipe.out,
    held_out = held ~= nil, prompts = #set, recovered = mb.divergence > 0 and qr.recovered(mb.divergence,
      mq.divergence) or json.null, kl = mq.kl or json.null, top1_agreement = mq.top1, b_kl = mb.kl or json.null,
    b_top1_agreement = mb.top1, bytes = fs.size(recipe.out), b_bytes = fs.size(c.o.quantized),
    a_bytes = fs.size(c.o.reference), round_trip = round_trip, mismatches = mismatch })
end

-- recovered share against added bytes over the kept steps
local function plot(dir, r)
  local xt, v = { "0" }, { 0 }
  for _, s in ipairs(r.selection.steps) do
    if s.accepted then
      xt[#xt + 1] = string.format("%.3g", s.added_bytes / 1048576)
      v[#v + 1] = s.recovered
    end
  end
  local title = string.format("share of B's %s recovered by the groups chosen", r.metric.kind)
  local p = require("ember.analysis.plot").lines { dir = dir, base = "recovery", title = title,
    xlabel = "MiB added to B", ylabel = "recovered share", xtics = xt,
    series = { { name = "chosen groups, measured jointly", values = v } } }
  return json.ordered({ "tool", "files", "title" }, { tool = "gnuplot",
    files = json.array({ fs.basename(p.svg), fs.basename(p.png) }), title = title })
end

function M.run(c, io_)
  local o = c.o
  local function progress(msg) io_.stderr:write("ember: quant-recipe: ", msg, "\n") end
  local a, b = load(o, o.reference), load(o, o.quantized)
  qr.check_pair(a, b)
  local prompts, digest, held, held_digest = prompt_sets(c, a)
  local sections = { a = model_section(a), b = model_section(b) }
  prepare_out(o)
  local r = passes(c, a, b, prompts, held, progress, sections)
  if r.shard then
    b:close()
    io_.stderr:write(string.format("ember: quant-recipe: shard %d/%d: %d groups measured, %d taken as saved, in %s\n",
      r.shard.index, r.shard.count, r.measured, r.resumed, fs.join(o.out, fp.FILE)))
    return 0
  end
  r.prompts = prompts
  local recipe = write_recipe(c, r)
  local v = verify(c, r, recipe, held, b, progress)
  local report = { a = sections.a, b = sections.b, metric = json.ordered({ "kind", "tokens" },
    { kind = r.metric.kind, tokens = json.array(r.metric.tokens) }), prompts = json.ordered({ "path", "sha256",
      "count" }, { path = o.prompts, sha256 = digest, count = #prompts }), held_out = held and json.ordered({ "path",
      "sha256", "count" }, { path = o["held-out"] or (o.prompts .. " (every other prompt)"),
      sha256 = held_digest or digest, count = #held }), base = r.base, groups = r.groups,
    selection = r.selection, algorithm = sel.ALGORITHM, target = r.target, budget = r.budget, recipe = recipe,
    verification = v, timing = r.timing }
  b:close()
  if not o["no-plot"] then
    local ok, err = pcall(function() report.plot = plot(o.out, r) end)
    if not ok then progress("plot not drawn: " .. tostring(err)) end
  end
  local rep = require("ember.analysis.quant_report")
  fs.write_atomic(fs.join(o.out, "report.json"), rep.to_json(report), "quant-recipe report")
  local text = rep.format(report)
  fs.write_atomic(fs.join(o.out, "report.txt"), text, "quant-recipe report")
  io_.stdout:write(text)
  return 0
end

return M
