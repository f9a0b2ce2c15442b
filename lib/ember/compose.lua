-- ember.compose — runs several experiments as one: each hook calls the members that define it,
-- in the order given. Must not add behaviour of its own (no copies, no error rewriting).
--
-- Order is the contract: interventions first, observers after, so that a capture or statistics
-- member sees the value the rest of the network will see (e.g. the zeroed MLP output in run B).

local M = {}

M.HOOKS = {
  "on_model_loaded", "before_prefill", "before_layer", "after_attention", "after_mlp", "after_layer",
  "before_logits", "after_logits", "on_generation_complete",
}

local HOOK_SET = {}
for _, h in ipairs(M.HOOKS) do HOOK_SET[h] = true end

local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- A member's misspelt hook (after_mpl) would be invisible behind the composite, which only
-- forwards real hook names; so the composite refuses it, as the runtime does for one experiment.
function M.check_hook_names(e)
  for k, v in pairs(e) do
    if type(k) == "string" and type(v) == "function" and not HOOK_SET[k]
      and (k:match("^before_") or k:match("^after_") or k:match("^on_")) then
      local best, best_d = nil, math.huge
      for _, h in ipairs(M.HOOKS) do
        local d = distance(k, h)
        if d < best_d then best, best_d = h, d end
      end
      error(string.format("experiment '%s': '%s' is not a hook name (did you mean '%s'?)", e.name, k, best), 0)
    end
  end
end

-- compose(list) -> experiment. One member is returned unchanged; the composite is named
-- "a+b+..." so a hook failure names every participant, and keeps them in `members`.
function M.compose(list)
  local members = {}
  for _, e in ipairs(list) do
    if e then members[#members + 1] = e end
  end
  assert(#members > 0, "compose: no experiment given")
  for i, e in ipairs(members) do
    if type(e) ~= "table" or type(e.name) ~= "string" or e.name == "" then
      error("compose: experiment " .. i .. " has no name", 2)
    end
    M.check_hook_names(e)
  end
  if #members == 1 then return members[1] end
  local names = {}
  for i, e in ipairs(members) do names[i] = e.name end
  local exp = { name = table.concat(names, "+"), members = members }
  for _, hook in ipairs(M.HOOKS) do
    local fns, selves = {}, {}
    for _, e in ipairs(members) do
      if type(e[hook]) == "function" then
        fns[#fns + 1] = e[hook]
        selves[#selves + 1] = e
      end
    end
    local n = #fns
    if n == 1 then
      local f, s = fns[1], selves[1]
      exp[hook] = function(_, ctx, view) return f(s, ctx, view) end
    elseif n > 1 then
      -- no per-call allocation: the member lists are fixed here, once
      exp[hook] = function(_, ctx, view)
        for i = 1, n do fns[i](selves[i], ctx, view) end
      end
    end
  end
  return exp
end

return M
