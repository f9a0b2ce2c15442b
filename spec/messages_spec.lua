-- What a user reads when something is wrong is the reason, not where in lib/ember it was raised: no
-- message of the bad-input cases below carries a "lib/ember/x.lua:NN:" prefix (an error() without
-- level 0, a luaL_error from a binding called by the library, a Lua runtime error). Each case runs
-- the ember command in-process with captured streams and must fail with a message.

local fs = require("ember.store.fs")
local H = require("helpers.artifacts")
local C = require("helpers.cli")

local q = fs.shell_quote
local POSITION = "lib/ember/[%w_/]+%.lua:%d+:"

-- error_calls(src) -> { { line, level } } of every error(...) call in Lua source whose level is
-- missing or 1: the arguments are read up to the matching parenthesis, strings and comments skipped.
local function error_calls(src)
  local out = {}
  local i, n, line = 1, #src, 1
  local function skip_string(j)
    local c = src:sub(j, j)
    if c == '"' or c == "'" then
      local k = j + 1
      while k <= n do
        local d = src:sub(k, k)
        if d == "\\" then k = k + 2
        elseif d == c then return k + 1
        else k = k + 1 end
      end
      return k
    end
    local eq = src:match("^%[(=*)%[", j)
    if eq then
      local close = "]" .. eq .. "]"
      local e = src:find(close, j, true)
      return (e or n) + #close
    end
    return nil
  end
  local function skip_comment(j)
    if src:sub(j, j + 1) ~= "--" then return nil end
    local eq = src:match("^%-%-%[(=*)%[", j)
    if eq then local e = src:find("]" .. eq .. "]", j, true) return (e or n) + #eq + 2 end
    local e = src:find("\n", j, true)
    return e or n + 1
  end
  while i <= n do
    local s = skip_comment(i) or skip_string(i)
    if s then i = s
    else
      local pre = src:sub(i - 1, i - 1)
      if src:sub(i, i + 5) == "error(" and not pre:match("[%w_.:]") then
        -- the call's arguments up to the matching ')', depth-counted, strings skipped
        local j, depth, top_commas, last_arg_start = i + 6, 1, 0, i + 6
        while j <= n and depth > 0 do
          local t = skip_comment(j) or skip_string(j)
          if t then j = t
          else
            local c = src:sub(j, j)
            if c == "(" or c == "{" or c == "[" then depth = depth + 1
            elseif c == ")" or c == "}" or c == "]" then depth = depth - 1
            elseif c == "," and depth == 1 then top_commas = top_commas + 1; last_arg_start = j + 1 end
            j = j + 1
          end
        end
        local lineno = select(2, src:sub(1, i):gsub("\n", "")) + 1
        local level = top_commas >= 1 and src:sub(last_arg_start, j - 2):match("^%s*(.-)%s*$") or nil
        if level == nil or level == "1" then out[#out + 1] = { line = lineno, level = level } end
        i = j
      else
        i = i + 1
      end
    end
  end
  return out
end

describe("messages of bad input", function()
  after_each(H.cleanup)

  it("carry no lib/ember/x.lua:NN: prefix", function()
    local model = C.need_model()
    if not model then return end
    local d = H.tmpdir()
    local function file(name, text) H.write(d .. "/" .. name, text) return d .. "/" .. name end
    assert(os.execute("mkfifo " .. q(d .. "/fifo") .. " && mkdir " .. q(d .. "/empty") .. " " .. q(d .. "/art")))
    local bad_json = file("bad.json", "{ not json")
    local null_type = file("null_type.json", '{"model":{"type":null,"vocab":{},"merges":[]},"added_tokens":[]}')
    file("art/manifest.json", '{"schema":"ember.activations","schema_version":"1.1.0"}')
    local garbage = file("garbage.npy", "\147NUMPY garbage")
    local st = file("bad.safetensors", string.pack("<I8", 3) .. "{x}")
    local prompts = file("p.jsonl", '{"prompt": 3}\n')
    local probe = file("probe.json", '{"schema": "ember.probe"}')
    local exp = file("exp.lua", "return function() error('mine') end")
    local cases = {
      { "--model", d .. "/none.gguf", "--prompt", "hi" },
      { "--model", d .. "/empty", "--prompt", "hi" },
      { "--model", d .. "/fifo", "--prompt", "hi" },
      { "--model", bad_json, "--prompt", "hi" },
      { "--model", model, "--tokenizer", bad_json, "--prompt", "hi" },
      { "--model", model, "--tokenizer", null_type, "--prompt", "hi" },
      { "--model", model, "--tokenizer", d .. "/fifo", "--prompt", "hi" },
      { "--model", model, "--prompt", "hi", "--max-tokens", "abc" },
      { "--model", model, "--prompt", "hi", "--steer", "0:after_layer:" .. garbage },
      { "--model", model, "--prompt", "hi", "--steer", "0:after_layer:" .. st },
      { "--model", model, "--prompt", "hi", "--steer", "0:after_layer:" .. d .. "/fifo.npy" },
      { "--model", model, "--prompt", "hi", "--control-vector", bad_json },
      { "--model", model, "--prompt", "hi", "--activation-patch", d .. "/art", "--patch-target", "0:mlp" },
      { "--model", model, "--prompt", "hi", "--activation-patch", d .. "/empty", "--patch-target", "0:mlp" },
      { "--model", model, "--prompt", "hi", "--experiment", exp },
      { "--model", model, "--prompt", "hi", "--experiment", d .. "/none.lua" },
      { "--model", model, "--prompt", "hi", "--trace", d .. "/no/t.jsonl" },
      { "--model", model, "--prompts", prompts, "--extract-hidden", "0", "--extract-out", d .. "/x.safetensors" },
      { "compare-artifacts", d .. "/art", d .. "/empty" },
      { "compare-artifacts", d .. "/none", d .. "/none" },
      { "sweep", "merge", d .. "/merged", d .. "/empty" },
      { "sweep", "compare", d .. "/empty", d .. "/art" },
      { "probe", "eval", "--probe", probe, "--data", prompts },
      { "probe", "train", "--model", model, "--data", prompts, "--layer", "0" },
      { "compare-models", "merge", d .. "/cm", d .. "/empty" },
    }
    for _, args in ipairs(cases) do
      local code, _, err = C.ember(table.unpack(args))
      local what = table.concat(args, " ")
      assert.are_not.equal(0, code, what)
      assert.is_truthy(err:match("%S"), what .. ": no message")
      assert.is_nil(err:match(POSITION), what .. ":\n" .. err)
    end
  end)

  it("come from error() calls that name their level: 0, or 2 and up for a caller's mistake", function()
    -- level 1 (the default) puts lib/ember's own file and line in front of the message; only
    -- generate's argument checks use it on purpose (it rethrows them at its caller's position)
    local found = {}
    local p = assert(io.popen("find lib -name '*.lua' | sort"))
    for path in p:lines() do
      for _, hit in ipairs(error_calls(require("helpers.files").read(path))) do
        if not (path == "lib/ember/model/generate.lua" and hit.level == "1") then
          found[#found + 1] = path .. ":" .. hit.line .. " (level " .. tostring(hit.level) .. ")"
        end
      end
    end
    p:close()
    assert.same({}, found)
  end)
end)
