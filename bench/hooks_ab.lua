-- bench/hooks_ab.lua — the disabled path costs nothing: prefill and decode tok/s with no experiment
-- (A) against an experiment that defines only `name` (B), interleaved A/B/A/B so that machine
-- noise hits both alike; medians reported. Usage:
--   build/ember-lua bench/hooks_ab.lua [--model M.gguf] [--prompt-tokens 52] [--gen-tokens 32]
--                                      [--repeat 7] [--kernels auto] [--threads N]
-- Without --model it makes a mid-size random llama model with build/make-tiny-model.

local ember = require("ember")

local opts = { prompt_tokens = 52, gen_tokens = 32, ["repeat"] = 7, kernels = "auto" }
local i = 1
while i <= #arg do
  local k, v = arg[i]:match("^%-%-([%w-]+)$"), arg[i + 1]
  if not k or v == nil then error("usage: hooks_ab.lua [--model M] [--prompt-tokens N] [--gen-tokens N] [--repeat R] [--kernels K] [--threads N]", 0) end
  k = k:gsub("-", "_")
  opts[k] = tonumber(v) or v
  i = i + 2
end

if not opts.model then
  opts.model = "build/models/bench-llama-q8_0.gguf"
  local f = io.open(opts.model, "rb")
  if f then
    f:close()
  else
    os.execute("mkdir -p build/models")
    assert(os.execute("build/make-tiny-model --family llama --dtype q8_0 --layers 8 --hidden 512 --heads 8 "
      .. "--kv-heads 4 --ff 1536 --vocab 4096 --context 512 --seed 3 --out " .. opts.model .. " >/dev/null"),
      "could not make the benchmark model")
  end
end

local model = ember.load { model = opts.model, kernels = opts.kernels, threads = opts.threads }
local prompt = {}
for t = 1, opts.prompt_tokens do prompt[t] = (t * 37) % model.info.n_vocab end

local function run(exp)
  local out = model:generate { ids = prompt, max_tokens = opts.gen_tokens, eos = false, experiment = exp }
  return out.stats.prefill_tok_s, out.stats.decode_tok_s
end

local function median(t)
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end

run(nil) -- warm-up: page in the weights, grow the workspace
local a_pre, a_dec, b_pre, b_dec = {}, {}, {}, {}
for r = 1, opts["repeat"] do
  a_pre[r], a_dec[r] = run(nil)
  b_pre[r], b_dec[r] = run({ name = "name-only" })
end

local info = model.info
print(("model %s (%s, %s), kernels %s, %d threads, %d prompt + %d generated tokens, %d interleaved repeats")
  :format(opts.model, info.family, info.dtype_summary, info.kernels, info.threads, opts.prompt_tokens,
    opts.gen_tokens, opts["repeat"]))
local ap, ad, bp, bd = median(a_pre), median(a_dec), median(b_pre), median(b_dec)
print(("prefill tok/s   no experiment %9.1f   name-only %9.1f   B/A %.3f"):format(ap, bp, bp / ap))
print(("decode  tok/s   no experiment %9.1f   name-only %9.1f   B/A %.3f"):format(ad, bd, bd / ad))
