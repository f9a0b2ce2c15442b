-- ember.analysis.quant_report — the report of `ember quant-recipe` (docs/quant-recipe.md) as JSON
-- (DIR/report.json) and as text (DIR/report.txt, and stdout). Must not compute or measure: it lays
-- out what ember.analysis.quant_select and the verification found.

local json = require("ember.store.json")

local M = {}

local function num(x) return x == nil and json.null or x end
local function mib(b) return b / 1048576 end

local function group_json(g)
  local tensors = {}
  for i, t in ipairs(g.tensors) do tensors[i] = t.name end
  return json.ordered({ "name", "tensors", "added_bytes", "recovered", "certified_identical", "divergence", "kl",
    "top1_agreement" }, { name = g.name, tensors = json.array(tensors), added_bytes = g.added_bytes,
    recovered = g.recovered, certified_identical = g.certified == true, divergence = num(g.divergence),
    kl = num(g.kl), top1_agreement = num(g.top1) })
end

local function step_json(s)
  return json.ordered({ "group", "added_bytes", "recovered", "kl", "top1_agreement", "accepted", "skipped" },
    { group = s.group, added_bytes = s.added_bytes, recovered = num(s.recovered), kl = num(s.kl),
      top1_agreement = num(s.top1), accepted = s.accepted == true, skipped = num(s.skipped) })
end

-- to_json(r) -> the report's JSON text. r: { a, b (model sections), metric, prompts, held_out, base,
-- groups, selection, recipe, verification }
function M.to_json(r)
  local groups, steps, chosen = {}, {}, {}
  for i, g in ipairs(r.groups) do groups[i] = group_json(g) end
  for i, s in ipairs(r.selection.steps) do steps[i] = step_json(s) end
  for i, g in ipairs(r.selection.chosen) do chosen[i] = g.name end
  local sel = json.ordered({ "algorithm", "target", "budget_bytes", "chosen", "recovered", "kl", "top1_agreement",
    "added_bytes", "reached_target", "steps" }, { algorithm = r.algorithm, target = r.target,
    budget_bytes = num(r.budget), chosen = json.array(chosen), recovered = r.selection.recovered,
    kl = num(r.selection.kl), top1_agreement = num(r.selection.top1), added_bytes = r.selection.added_bytes,
    reached_target = r.selection.reached, steps = json.array(steps) })
  return json.encode(json.ordered({ "tool", "a", "b", "metric", "prompts", "held_out", "base", "groups",
    "selection", "recipe", "verification", "timing", "plot" }, {
    tool = "ember quant-recipe", a = r.a, b = r.b, metric = r.metric, prompts = r.prompts,
    held_out = num(r.held_out), base = json.ordered({ "divergence", "kl", "top1_agreement" },
      { divergence = r.base.divergence, kl = num(r.base.kl), top1_agreement = r.base.top1 }),
    groups = json.array(groups), selection = sel, recipe = r.recipe, verification = r.verification,
    timing = num(r.timing), plot = num(r.plot),
  }), { indent = "  " })
end

local function g4(x) return x == nil and "-" or string.format("%.4g", x) end

-- format(r) -> the report as text
function M.format(r)
  local out = {}
  local function line(...) out[#out + 1] = string.format(...) end
  line("quant-recipe: A %s (%s), B %s (%s)", r.a.path, r.a.dtype_summary, r.b.path, r.b.dtype_summary)
  line("metric %s on %d prompts; B's divergence from A %s%s, top-1 agreement %.1f%%", r.metric.kind,
    r.prompts.count, g4(r.base.divergence), r.base.kl and "" or " (mean |logit-difference gap|)",
    100 * r.base.top1)
  line("")
  line("first pass: each group taken from A alone")
  line("  %-22s %12s %10s %8s", "group", "added MiB", "recovered", "top-1")
  for _, g in ipairs(r.groups) do
    line("  %-22s %12.4f %10s %8s%s", g.name, mib(g.added_bytes), g4(g.recovered),
      g.top1 and string.format("%.1f%%", 100 * g.top1) or "-", g.certified and "  identical in A and B" or "")
  end
  line("")
  line("selection (%s)", r.algorithm)
  for _, s in ipairs(r.selection.steps) do
    line("  %-22s %12.4f MiB  %s", s.group, mib(s.added_bytes), s.skipped and "over the budget"
      or string.format("joint recovered %s  %s", g4(s.recovered), s.accepted and "kept" or "dropped"))
  end
  line("chosen: %d group(s), +%.4f MiB, recovered %s of B's divergence (target %s: %s)", #r.selection.chosen,
    mib(r.selection.added_bytes), g4(r.selection.recovered), g4(r.target),
    r.selection.reached and "reached" or "not reached")
  line("recipe: %s (%d lines, %d changed from B)", r.recipe.file, r.recipe.lines, r.recipe.changed)
  line("command: %s", r.recipe.command)
  local v = r.verification
  if v.skipped then
    line("verification: skipped (%s)", v.skipped)
  else
    line("verification with llama-quantize on %s prompts:", v.held_out and "held-out" or "the selection's")
    line("  recovered %s, KL %s, top-1 agreement %.1f%% (B: KL %s, top-1 %.1f%%)", g4(v.recovered), g4(v.kl),
      100 * v.top1_agreement, g4(v.b_kl), 100 * v.b_top1_agreement)
    line("  size %.4f MiB (B %.4f MiB, A %.4f MiB); recipe types round-trip: %s", mib(v.bytes), mib(v.b_bytes),
      mib(v.a_bytes), v.round_trip and "yes" or "NO")
  end
  return table.concat(out, "\n") .. "\n"
end

return M
