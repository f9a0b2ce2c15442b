-- The README's commands, verbatim, in a clean checkout of the tree: `./run.sh main` (the default
-- model, made in a temporary cache directory) and the own-model variant on a parity fixture
-- linked as M.gguf and tokenizer.json. run.sh runs with EMBER_RUN_PREBUILT=1, which skips the
-- apt install and the build (this spec runs inside `./run.sh test`, beside a build in use);
-- `./run.sh test` itself is the command running this spec, so its block is not marked runnable.

local checkout = require("helpers.checkout")
local docblocks = require("helpers.docblocks")
local fx = require("helpers.fixtures")
local fs = require("ember.store.fs")
local read_file = require("helpers.files").read

local q = fs.shell_quote

describe("README commands", function()
  local root, why = checkout.make()
  local fixture = fx.root .. "/parity/llama-tiny-f32"
  if not root then
    pending(why)
    return
  end
  if not fx.exists(fixture .. "/model.gguf") then
    pending("missing fixture " .. fixture .. "/model.gguf")
    checkout.remove(root)
    return
  end
  local abs_fixture = fixture:sub(1, 1) == "/" and fixture or (os.getenv("PWD") .. "/" .. fixture)
  local cache = fs.make_temp_dir("ember-readme-cache")

  local text = read_file(root .. "/README.md")
  local blocks = docblocks.blocks(text)

  it("marks the two ./run.sh main commands runnable", function()
    local cmds = {}
    for _, b in ipairs(blocks) do cmds[#cmds + 1] = b.code end
    assert.are.equal(2, #blocks, table.concat(cmds))
    assert.is_truthy(blocks[1].code:match("^%./run%.sh main%s"))
    assert.is_truthy(blocks[2].code:find('./run.sh main --model M.gguf --tokenizer tokenizer.json --prompt "..."', 1,
      true))
  end)

  it("run verbatim and the restoration criterion holds, leaving the checkout clean", function()
    assert.is_true(checkout.sh("ln -s " .. q(abs_fixture .. "/model.gguf") .. " " .. q(root .. "/M.gguf")
      .. " && ln -s " .. q(abs_fixture .. "/tokenizer.json") .. " " .. q(root .. "/tokenizer.json")))
    for _, b in ipairs(blocks) do
      local script = docblocks.script({ b }, "README.md")
      local ok, out = checkout.sh("cd " .. q(root) .. " && XDG_CACHE_HOME=" .. q(cache)
        .. " EMBER_RUN_PREBUILT=1 bash -c " .. q(script))
      assert.is_true(ok, b.code .. out)
      assert.is_truthy(out:find("restoration criterion: HOLDS", 1, true), out)
      assert.is_nil(out:find("given more than once", 1, true), out)
    end
    -- the default model went to the cache directory given, not into the tree
    assert.is_true(fx.exists(cache .. "/ember/tiny-llama-q8_0.gguf"))
    os.remove(root .. "/M.gguf")
    os.remove(root .. "/tokenizer.json")
    assert.are.equal("", checkout.status(root))
  end)

  it("EMBER_RUN_PREBUILT=1 refuses a checkout without a build", function()
    local ok, out = checkout.sh("cd " .. q(root) .. " && mv build build.away && EMBER_RUN_PREBUILT=1 ./run.sh main; "
      .. "s=$?; mv build.away build; exit $s")
    assert.is_false(ok)
    assert.is_truthy(out:find("EMBER_RUN_PREBUILT=1 but build/ember-lua is missing", 1, true), out)
  end)

  teardown(function()
    checkout.remove(root)
    fs.remove_tree(cache)
  end)
end)
