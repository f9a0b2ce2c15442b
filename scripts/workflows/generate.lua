-- generate.lua — plain text generation: load a model, generate from a prompt, print the text.
-- Must not attach any experiment: this is the disabled path (no hooks, no Lua per layer).
--
-- ember-lua scripts/workflows/generate.lua --model M.gguf [--prompt TEXT] [--max-tokens N]
--     [--tokenizer T.json] [--temperature T] [--top-k K] [--top-p P] [--seed N] [--kernels SET]
--     [--threads N]

local cli = require("ember.cli")
local selectors = require("ember.selectors")

local FLAGS = {
  model = { name = "model", kind = "path", meta = "FILE.gguf" },
  tokenizer = { name = "tokenizer", kind = "path", meta = "FILE" },
  arch = { name = "arch", kind = "string", meta = "ARCH" },
  prompt = { name = "prompt", kind = "string", meta = "TEXT" },
  ["max-tokens"] = { name = "max-tokens", kind = "uint", meta = "N" },
  temperature = { name = "temperature", kind = "float", meta = "T" },
  ["top-k"] = { name = "top-k", kind = "uint", meta = "K" },
  ["top-p"] = { name = "top-p", kind = "float", meta = "P" },
  seed = { name = "seed", kind = "uint", meta = "N" },
  kernels = { name = "kernels", kind = function(s)
    return selectors.parse_choice(s, { "auto", "reference", "avx2", "avx512" }, "kernel set")
  end, meta = "SET" },
  threads = { name = "threads", kind = "uint", meta = "N" },
  stats = { name = "stats", kind = "bool" },
  help = { name = "help", kind = "bool" },
}

local USAGE = "usage: generate.lua --model M.gguf [--prompt TEXT] [--max-tokens N] [--tokenizer T.json]\n"
  .. "                   [--temperature T] [--top-k K] [--top-p P] [--seed N] [--kernels SET] [--threads N] [--stats]\n"

local function main(args)
  local ok, o = pcall(cli.parse_flags, args, 1, FLAGS)
  if not ok then io.stderr:write("generate: ", tostring(o), "\n", USAGE); return 2 end
  if o.help then io.stdout:write(USAGE); return 0 end
  if not o.model then io.stderr:write("generate: --model is required\n", USAGE); return 2 end
  local ember = require("ember")
  local model = ember.load { model = o.model, tokenizer = o.tokenizer, arch = o.arch, kernels = o.kernels,
    threads = o.threads }
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

local ok, code = pcall(main, arg)
if not ok then io.stderr:write("generate: ", tostring(code), "\n"); code = 1 end
os.exit(code)
