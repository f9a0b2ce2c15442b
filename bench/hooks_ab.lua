-- bench/hooks_ab.lua — the disabled path costs nothing: prefill and decode tok/s with no experiment
-- (A) against an experiment that defines only `name` (B), interleaved A/B/A/B; medians reported.
-- A thin wrapper over ember.benchmark.hooks_ab (the same as `ember benchmark --hooks-ab`). Usage:
--   build/ember-lua bench/hooks_ab.lua [--model M.gguf] [--prompt-tokens 52] [--gen-tokens 32]
--                                      [--repeat 7] [--kernels auto] [--threads N] [--stages a,b]
-- --stages: B is an experiment with empty methods on those stages instead (the cost of observing
-- them, e.g. --stages attention_pattern).
-- Without --model it makes a mid-size random llama model with build/make-tiny-model.

local ember = require("ember")
local bench = require("ember.run.benchmark")

local USAGE = "usage: hooks_ab.lua [--model M] [--prompt-tokens N] [--gen-tokens N] [--repeat R] [--kernels K]"
  .. " [--threads N]"
  .. " [--stages a,b]"
local KNOWN = { model = true, prompt_tokens = true, gen_tokens = true, ["repeat"] = true, kernels = true,
  threads = true,
  stages = true }
local opts = bench.flags("hooks_ab.lua", arg, USAGE, KNOWN, { ["repeat"] = 7 })
opts.model = opts.model
  or bench.made_model("bench-llama-q8_0", "--family llama --dtype q8_0 --layers 8 --hidden 512 --heads 8 "
    .. "--kv-heads 4 --ff 1536 --vocab 4096 --context 512 --seed 3")

local model = ember.load { model = opts.model, kernels = opts.kernels or "auto", threads = opts.threads }
local bopts = { prompt_tokens = opts.prompt_tokens, gen_tokens = opts.gen_tokens, ["repeat"] = opts["repeat"] }
local r, b_name = nil, "name-only"
if opts.stages then
  local stages, err = require("ember.run.selectors").parse_stage_list(opts.stages)
  if not stages or stages == "all" then error("hooks_ab.lua: --stages: " .. (err or "name the stages"), 0) end
  r, b_name = bench.stages_ab(model, bopts, stages), "read " .. opts.stages
else
  r = bench.hooks_ab(model, bopts)
end
local info = model.info
print(("model %s (%s, %s), kernels %s, %d threads, %d prompt + %d generated tokens, %d interleaved repeats")
  :format(opts.model, info.family, info.dtype_summary, info.kernels, info.threads, r.prompt_tokens,
    r.gen_tokens, r["repeat"]))
print(("prefill tok/s   no experiment %9.1f   %s %9.1f   B/A %.3f"):format(r.a.prefill_tok_s, b_name,
  r.b.prefill_tok_s, r.prefill_ratio))
print(("decode  tok/s   no experiment %9.1f   %s %9.1f   B/A %.3f"):format(r.a.decode_tok_s, b_name,
  r.b.decode_tok_s, r.decode_ratio))
