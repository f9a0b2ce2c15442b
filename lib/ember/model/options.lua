-- ember.model.options — what the one-pass methods of a model (run_with_cache, gradients) share of
-- their options: the table checked against the names it may hold, and the prompt as ids= or
-- prompt= (through the model's tokenizer, bos= passed on). Runs nothing.

local M = {}

function M.sorted_keys(set)
  local out = {}
  for k in pairs(set) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- check(opts, valid, fail): opts is a table whose keys are all in the set `valid`; fail(message)
-- raises (with the method's prefix).
function M.check(opts, valid, fail)
  if type(opts) ~= "table" then fail("expected a table of options, got " .. type(opts)) end
  for k in pairs(opts) do
    if not valid[k] then
      fail("unknown option '" .. tostring(k) .. "' (options: " .. table.concat(M.sorted_keys(valid), ", ") .. ")")
    end
  end
end

-- prompt_ids(model, opts, fail) -> the prompt's ids: ids= as given, or prompt= tokenized.
function M.prompt_ids(model, opts, fail)
  if (opts.ids == nil) == (opts.prompt == nil) then fail("give exactly one of ids= (token ids) or prompt= (text)") end
  if opts.ids ~= nil then
    if type(opts.ids) ~= "table" or #opts.ids == 0 then fail("ids must be a non-empty table of token ids") end
    return opts.ids
  end
  if type(opts.prompt) ~= "string" then fail("prompt must be a string, got " .. type(opts.prompt)) end
  local ids = model:tokenize(opts.prompt, opts.bos ~= nil and { bos = opts.bos } or nil)
  if #ids == 0 then fail("the prompt gives no tokens") end
  return ids
end

return M
