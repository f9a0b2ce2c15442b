-- ember.run.compose — runs several experiments as one: each hook calls the members that define it,
-- in the order given. Must not add behaviour of its own (no copies, no error rewriting).
--
-- Order is the contract: interventions first, observers after, so that a capture or statistics
-- member sees the value the rest of the network will see (e.g. the zeroed MLP output in run B).

local core = require("ember.core")

local M = {}

-- Every hook of a generation in call order; the names come from the core (the engine's stages
-- plus the lifecycle hooks), never from a list of our own.
M.HOOKS = {}
for i, h in ipairs(core.hooks) do M.HOOKS[i] = h end

-- A member's misspelt hook (after_mpl) would be invisible behind the composite, which only
-- forwards real hook names; so each member gets the runtime's own attach-time checks (name,
-- misspelt hooks through the __index chain, callables). Returns { hook = callable }.
function M.check_hook_names(e)
  return core.check_experiment(e, "compose")
end

-- compose(list) -> experiment. One member is returned unchanged; the composite is named
-- "a+b+..." so a hook failure names every participant, and keeps them in `members`.
function M.compose(list)
  local members, defs = {}, {}
  for _, e in ipairs(list) do
    if e then members[#members + 1] = e end
  end
  assert(#members > 0, "compose: no experiment given")
  for i, e in ipairs(members) do
    if type(e) ~= "table" or type(e.name) ~= "string" or e.name == "" then
      error("compose: experiment " .. i .. " has no name", 2)
    end
    defs[i] = M.check_hook_names(e)
  end
  if #members == 1 then return members[1] end
  local names = {}
  for i, e in ipairs(members) do names[i] = e.name end
  local exp = { name = table.concat(names, "+"), members = members }
  for _, hook in ipairs(M.HOOKS) do
    local fns, selves = {}, {}
    for i, e in ipairs(members) do
      local f = defs[i][hook] -- a function or any callable, inherited ones included
      if f ~= nil then
        fns[#fns + 1] = f
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
