-- ember.model.generate_batch — model:generate{ prompts = {...} }: one batch (model:batch) prefills
-- every prompt in one pass, then each decode step evaluates the sequences still running in one
-- pass; each sequence stops on its own (its eos or max_tokens). A sequence's tokens are what
-- model:generate gives for its prompt alone with the same options (its own sampler, same seed),
-- bit for bit. Tensor hooks of experiment= see every running sequence's rows (ctx.sequences).

local core = require("ember.core")
local internal = core.internal

local M = {}

local OPTIONS = { "prompts", "ids", "bos", "max_tokens", "temperature", "top_k", "top_p", "seed", "experiment",
  "context", "eos" }

local function bad(msg) error("bad argument to 'generate' (" .. msg .. ")", 0) end

-- The prompts as id lists: prompts= texts through the tokenizer, or ids= a list of id lists.
local function prompt_list(model, opts)
  local list = opts.prompts or opts.ids
  if opts.prompts ~= nil and opts.ids ~= nil then bad("give one of prompts= (texts) or ids= (lists of ids)") end
  if type(list) ~= "table" or #list == 0 then bad("prompts must be a non-empty list") end
  local out, n_vocab = {}, model.info.n_vocab
  for i, p in ipairs(list) do
    local ids = p
    if opts.prompts ~= nil then
      if type(p) ~= "string" then bad("prompts[" .. i .. "] must be a string, got " .. type(p)) end
      local tok = internal.need_tokenizer(model, "generate")
      ids = opts.bos ~= nil and tok:encode(p, { bos = opts.bos }) or tok:encode(p)
    end
    if type(ids) ~= "table" or #ids == 0 then bad("prompt " .. i .. " gives no tokens") end
    out[i] = internal.check_ids(ids, n_vocab, "generate")
  end
  return out
end

-- The stop id: eos= (an id, or false for none), else the tokenizer's eos_id; -1 for none.
local function stop_id(opts, tok)
  if opts.eos == false then return -1 end
  if opts.eos ~= nil then return internal.opt_int(opts, "generate", "eos", -1) end
  local id = tok and tok.eos_id
  return math.type(id) == "integer" and id or -1
end

-- generate(model, opts) -> a list of results, one per prompt: { prompt_ids, ids, text, stop, logits }
function M.generate(model, opts)
  internal.check_options(opts, "generate", OPTIONS)
  local prompts = prompt_list(model, opts)
  local max_tokens = internal.opt_int(opts, "generate", "max_tokens", 16)
  if max_tokens < 0 then bad("max_tokens must be >= 0, got " .. max_tokens) end
  local n, longest, tok = #prompts, 0, model.tokenizer
  for _, ids in ipairs(prompts) do longest = math.max(longest, #ids) end
  local context = internal.opt_int(opts, "generate", "context", 0)
  if context == 0 then context = longest + math.max(max_tokens, 1) end
  local eos = stop_id(opts, tok)
  local samplers = {}
  for i = 1, n do
    samplers[i] = core.sampler({ n_vocab = model.info.n_vocab, temperature = opts.temperature, top_k = opts.top_k,
      top_p = opts.top_p, seed = opts.seed }, "generate")
  end
  local b <close> = model:batch { size = n, context = context }
  local eval_opts = opts.experiment and { experiment = opts.experiment } or nil
  local logits = b:prefill(prompts, eval_opts)
  local out, next_id, running = {}, {}, {}
  for i = 1, n do
    out[i] = { prompt_ids = prompts[i], ids = {}, stop = "max_tokens", logits = logits[i] }
    next_id[i] = samplers[i]:sample(logits[i])
    if max_tokens > 0 then running[#running + 1] = i end
  end
  for k = 1, max_tokens do
    if #running == 0 then break end
    local ids = {}
    for j, i in ipairs(running) do
      out[i].ids[k] = next_id[i]
      ids[j] = next_id[i]
    end
    local step = b:decode(ids, { experiment = opts.experiment, sequences = running })
    local still = {}
    for j, i in ipairs(running) do
      out[i].logits = step[j]
      if ids[j] == eos then
        out[i].stop = "eos"
      else
        next_id[i] = samplers[i]:sample(step[j])
        if k < max_tokens then still[#still + 1] = i end
      end
    end
    running = still
  end
  for i = 1, n do
    samplers[i]:close()
    local o = out[i]
    if tok ~= nil then o.text = tok:decode(table.move(o.ids, 1, #o.ids - (o.stop == "eos" and 1 or 0), 1, {})) end
  end
  return out
end

return M
