-- ember.cli.quant_recipe_run — the steps of `ember quant-recipe` once its flags hold: the models and
-- prompts, the passes (ember.analysis.quant_select), the recipe and command files, the verification
-- with llama-quantize, the plot and the report, written into --out. Progress goes to stderr.

local flags = require("ember.cli.flags")
local fs = require("ember.store.fs")
local json = require("ember.store.json")
local qr = require("ember.analysis.quant_recipe")
local sel = require("ember.analysis.quant_select")

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

-- the passes: reference, B's own divergence, first pass, selection
local function passes(c, a, b, prompts, held, progress)
  local o = c.o
  local metric = require("ember.sweep.metric").token_ids(c.metric, function(t) return a:to_single_token(t) end)
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
  local po = { groups = groups, prompts = prompts, ref = ref, base = base, progress = progress,
    target = o.target or 0.9, budget = o["budget-mib"] and math.floor(o["budget-mib"] * 1048576),
    same = function(name) return identical[name] end,
    load = function(names) return load(o, o.quantized, { from = o.reference, tensors = names }) end }
  local now = require("ember.core").now_ms
  local t0 = now()
  sel.first_pass(po)
  local t1 = now()
  local selection = sel.select(po)
  local timing = json.ordered({ "first_pass_seconds", "first_pass_groups", "selection_seconds", "selection_passes" },
    { first_pass_seconds = (t1 - t0) / 1000, first_pass_groups = #groups, selection_seconds = (now() - t1) / 1000,
      selection_passes = #selection.steps })
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
  local r = passes(c, a, b, prompts, held, progress)
  r.prompts = prompts
  assert(fs.mkdir(o.out))
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
