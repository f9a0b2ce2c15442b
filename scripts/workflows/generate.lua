-- generate.lua — plain text generation: load a model, generate from a prompt, print the text.
-- Must not attach any experiment: this is the disabled path (no hooks, no Lua per layer).
--
-- ember-lua scripts/workflows/generate.lua --model M.gguf [--prompt TEXT] [--max-tokens N]
--     [--tokenizer T.json] [--temperature T] [--top-k K] [--top-p P] [--seed N] [--kernels SET]
--     [--threads N]

local flags = require("ember.cli.flags")

local FLAGS = {
  { "model", "path", "FILE.gguf" },
  { "tokenizer", "path", "FILE" },
  { "arch", "string", "ARCH" },
  { "prompt", "string", "TEXT" },
  { "max-tokens", "uint", "N" },
  { "temperature", "float", "T" },
  { "top-k", "uint", "K" },
  { "top-p", "float", "P" },
  { "seed", "uint", "N" },
  flags.option("kernels"),
  flags.option("threads"),
  { "stats", "bool" },
  flags.option("help"),
}

local USAGE = "usage: generate.lua --model M.gguf [--prompt TEXT] [--max-tokens N] [--tokenizer T.json]\n"
  .. "                   [--temperature T] [--top-k K] [--top-p P] [--seed N] [--kernels SET] [--threads N] [--stats]\n"

local function main(o)
  if not o.model then flags.usage_error("--model is required") end
  local model = flags.load_model(o)
  local prompt = o.prompt or "Once upon a time"
  local out = model:generate { prompt = prompt, max_tokens = o["max-tokens"] or 32, temperature = o.temperature or 0,
    top_k = o["top-k"] or 0, top_p = o["top-p"] or 1, seed = o.seed or 0 }
  io.stdout:write(prompt, out.text, "\n")
  if o.stats then
    local s = out.stats
    io.stderr:write(string.format("prompt %d tokens, %.1f tok/s prefill; %d tokens, %.1f tok/s decode\n",
      #out.prompt_ids, s.prefill_tok_s, #out.ids, s.decode_tok_s))
  end
  return 0
end

os.exit(flags.script("generate", FLAGS, USAGE, main, arg))
