-- ember.cli.attention — `ember attention --model M --prompt T --layer L [--head H] [--out DIR]`: the
-- attention pattern of one layer, one figure per head, as SVG and PNG. Must not hold drawing or
-- model logic: it parses flags and hands over to ember.analysis.attention.

local flags = require("ember.cli.flags")

local M = {}

local usage_error = flags.usage_error

M.FLAGS_LIST = flags.model_command {
  { "prompt", "string", "TEXT", "the prompt (required)" },
  { "layer", "uint", "L", "the layer, 0-based (required)" },
  { "head", "uint", "H", "draw only this head (default: every head of the layer)" },
  { "out", "path", "DIR", "where the figures go (default: the current directory)" },
}
M.FLAGS = flags.spec(M.FLAGS_LIST)

function M.usage()
  return flags.command_usage("usage: ember attention --model FILE.gguf --prompt TEXT --layer L [--head H] [options]",
    M.FLAGS_LIST, {
      "Writes DIR/attention-L<layer>-H<head>.svg and .png: queries down, keys across, labelled with the",
      "prompt's tokens. See docs/inspection.md." })
end

-- main(args, argv, io_) -> exit code; args[1] is "attention" (experiments were refused before:
-- ember.cli). Usage errors are raised (ember.cli.flags).
function M.main(args, _, io_)
  local o = flags.command({ name = "attention", spec = M.FLAGS, usage = M.usage,
    required = { "model", "prompt", "layer" } }, args, io_)
  if not o then return 0 end
  local fs = require("ember.store.fs")
  if not fs.exists(o.model) then usage_error("--model: cannot open '%s'", o.model) end
  local out = o.out or "."
  if not fs.is_dir(out) and not fs.is_dir(fs.dirname(out)) then
    usage_error("--out: directory '%s' does not exist", fs.dirname(out))
  end
  local model = flags.load_model(o)
  local res = require("ember.analysis.attention").draw { model = model, prompt = o.prompt, layer = o.layer,
    heads = o.head, out = out }
  model:close()
  for _, f in ipairs(res.files) do io_.stdout:write(f.svg, "\n", f.png, "\n") end
  io_.stderr:write(string.format("ember: attention: layer %d, %d of %d heads, %d token%s -> %s\n", o.layer,
    #res.files, res.n_heads, #res.tokens, #res.tokens == 1 and "" or "s", out))
  return 0
end

return M
