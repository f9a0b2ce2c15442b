-- ember.cli.demo — `ember demo`: a short guided run on the default model (or --model): a greedy
-- generation, the residual stream's per-layer norms, then zero + patch restoring the output (the
-- frozen criterion of ember.run.workflow). Must not define its own criterion; it narrates the workflow's.

local flags = require("ember.cli.flags")
local fs = require("ember.store.fs")

local M = {}

M.PROMPT = "The quick brown fox jumps over the lazy dog."

M.FLAGS = {
  flags.option("model", flags.DEFAULT_MODEL_HELP),
  flags.option("tokenizer"),
  { "prompt", "string", "TEXT", "the prompt (default: \"" .. M.PROMPT .. "\")" },
  { "max-tokens", flags.uint_in(1, 256), "N", "tokens to generate (default 8)" },
  { "layer", "uint", "L", "the layer zeroed and patched (default 4, or the last of a smaller model)" },
  flags.option("kernels"),
  flags.option("threads"),
  flags.option("help"),
}

function M.usage()
  return flags.usage({ "usage: ember demo [options]", "", "options:" }, M.FLAGS, {
    "", "Three steps on one model: generate; per-layer norms of the residual stream; zero layer L's MLP",
    "and patch it back from a capture (every captured tensor must match again). Experiments are refused.",
  })
end

-- layer_norms(model, prompt) -> list of { layer, norm, last }: the L2 norm of each layer's
-- after_layer output over the whole prompt and of its last row, from one read-only prefill.
function M.layer_norms(model, prompt)
  local rows = {}
  local exp = { name = "demo_norms" }
  exp.after_layer = function(self, ctx, view)
    if ctx.phase ~= "prefill" then return end
    local n = view:shape()[1]
    rows[#rows + 1] = { layer = ctx.layer_index, norm = view:l2_norm(), last = view:row(n):l2_norm() }
  end
  model:generate { prompt = prompt, max_tokens = 0, experiment = exp }
  return rows
end

local function bar(x, max, width)
  local n = max > 0 and math.floor(x / max * width + 0.5) or 0
  return string.rep("#", n)
end

-- main(args, argv, io_) -> exit code; args[1] is "demo".
function M.main(args, argv, io_)
  local o = flags.command({ name = "demo", spec = flags.spec(M.FLAGS), usage = M.usage }, args, io_)
  if not o then return 0 end
  local w = io_.stdout
  local path = o.model or require("ember.model.default_model").path()
  local model = flags.load_model(o, { model = path, provenance = true })
  if model.tokenizer == nil then
    flags.usage_error("demo: the model has no tokenizer; give one with --tokenizer FILE")
  end
  local info = model.info
  local layer = o.layer or math.min(4, info.n_layers - 1)
  if layer >= info.n_layers then
    flags.usage_error("--layer: layer %d is out of range (the model has %d layers: 0-%d)", layer, info.n_layers,
      info.n_layers - 1)
  end
  local prompt = o.prompt or M.PROMPT
  local max_tokens = o["max-tokens"] or 8

  w:write(string.format("ember demo: %s (%s, %d layers, hidden %d, %s kernels)\n\n", info.path, info.family,
    info.n_layers, info.hidden_size, info.kernels))
  w:write("1. generation (greedy)\n")
  w:write(string.format("   prompt: %q\n", prompt))
  w:write("   output: ")
  local stream = model.tokenizer:stream { exact = true }
  local eos = model.tokenizer.eos_id
  local out = model:generate { prompt = prompt, max_tokens = max_tokens, on_token = function(id)
    if id == eos then return end
    -- control bytes shown escaped, so a tiny model's noise cannot move the cursor
    w:write((stream:push(id):gsub("%c", function(c) return string.format("\\x%02x", c:byte()) end)))
    if w.flush then w:flush() end
  end }
  w:write(string.format("\n   ids: %s (%d prompt tokens; %.1f tok/s decode)\n\n", table.concat(out.ids, " "),
    #out.prompt_ids, out.stats.decode_tok_s))

  w:write("2. the residual stream after each layer (L2 norm over the prompt, and of its last token)\n")
  local norms = M.layer_norms(model, prompt)
  local max = 0
  for _, r in ipairs(norms) do if r.norm > max then max = r.norm end end
  for _, r in ipairs(norms) do
    w:write(string.format("   layer %2d  %10.3f  last %9.3f  %s\n", r.layer, r.norm, r.last, bar(r.norm, max, 30)))
  end
  w:write("\n")

  w:write(string.format("3. zero layer %d's MLP output, then patch it back from a capture of the baseline\n", layer))
  local root = fs.make_temp_dir("ember-demo")
  local okw, report = pcall(require("ember.run.workflow").capture_patch_restore, {
    model = model, tokenizer_path = o.tokenizer, prompt = prompt, layer = layer, max_tokens = math.min(max_tokens, 4),
    out_dir = fs.join(root, "artifacts"), argv = argv,
  })
  fs.remove_tree(root)
  if not okw then error(report, 0) end
  local text = require("ember.run.workflow").format(report, nil, false)
  w:write((text:gsub("([^\n]*)\n", function(l) return (l == "" and "" or "   " .. l) .. "\n" end)))
  model:close()
  return report.ok and 0 or 1
end

return M
