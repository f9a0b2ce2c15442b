-- helpers.models — the models the workflow specs run on: the project's default tiny model (made by
-- build/make-tiny-model, as ./run.sh main does) and one parity fixture per family. A missing input
-- or a family the engine cannot load yet is reported as a reason for `pending`, never a pass.

local fx = require("helpers.fixtures")

local M = {}

M.DEFAULT_ARGS = "--family llama --dtype q8_0 --seed 7"
M.PROMPT = "The quick brown fox jumps over the lazy dog."

-- default_model() -> path, or nil and the reason
function M.default_model()
  return fx.tiny_model(M.DEFAULT_ARGS)
end

-- load(path [, tokenizer]) -> model, or nil and the error message
function M.load(path, tokenizer)
  local ember = require("ember")
  local ok, model = pcall(ember.load, { model = path, tokenizer = tokenizer })
  if not ok then return nil, tostring(model) end
  return model
end

-- default() -> model, or nil and the reason (a ready-to-use default tiny model)
function M.default()
  local path, why = M.default_model()
  if not path then return nil, why end
  return M.load(path)
end

-- lazy_default() -> need: need() loads the default tiny model on its first call (one model per
-- spec file that asks) and returns it, or marks the running test pending with the reason and
-- returns nil.
function M.lazy_default()
  local model, why, tried
  return function()
    if not tried then model, why = M.default(); tried = true end
    if not model then pending("default tiny model unavailable: " .. tostring(why)) end
    return model
  end
end

-- generate(model, request, experiment) -> model:generate of a copy of `request` with `experiment`
-- (the experiment specs' fixed greedy runs: one request table, many experiments)
function M.generate(model, request, experiment)
  local req = {}
  for k, v in pairs(request) do req[k] = v end
  req.experiment = experiment
  return model:generate(req)
end

-- family_cases() -> list of { family, case, model, tokenizer, prompt, missing } — the first
-- available dtype per family (q8_0 preferred: the dtype the README's main command uses); a family
-- without a shared fixture uses its case of the project's tests/fixtures/parity-new (the model made
-- again from the case's arguments, with its embedded tokenizer, and M.PROMPT).
function M.family_cases()
  local families = {}
  for i, row in ipairs(require("ember.core").FAMILIES) do families[i] = row.name end -- the engine's table
  local dtypes = { "q8_0", "f32", "f16", "bf16" }
  local out = {}
  for _, family in ipairs(families) do
    local found
    for _, dtype in ipairs(dtypes) do
      local case = family .. "-tiny-" .. dtype
      local dir = fx.root .. "/parity/" .. case
      if fx.exists(dir .. "/model.gguf") then
        local meta = fx.read_json(dir .. "/case.json")
        found = { family = family, case = case, model = dir .. "/model.gguf", tokenizer = dir .. "/tokenizer.json",
          prompt = meta.prompt_text }
        break
      end
    end
    for _, dtype in ipairs(dtypes) do
      local case = family .. "-tiny-" .. dtype
      local dir = fx.families_dir .. "/" .. case
      if not found and fx.exists(dir .. "/case.json") then
        local path, why = fx.case_model(dir)
        found = path and { family = family, case = case, model = path, prompt = M.PROMPT }
          or { family = family, case = case, missing = why }
      end
    end
    out[#out + 1] = found or { family = family, case = family .. "-tiny-*",
      missing = fx.root .. "/parity/" .. family .. "-tiny-{q8_0,f32,f16,bf16}/model.gguf" }
  end
  return out
end

return M
