-- The documentation runs: every code block marked runnable in docs/quickstart.md, docs/lua-api.md,
-- docs/sweeps.md and docs/testing.md (an HTML comment `<!-- run -->` or `<!-- run: file PATH -->` on the line
-- before the fence; the grammar is in spec/helpers/docblocks.lua) is executed, page by page in one
-- shell, from the top of a clean checkout of the tree (spec/helpers/checkout.lua); lua-api.md and
-- sweeps.md need nothing but the built binaries (their model is ember.default_model(), made in a
-- temporary cache directory), and they run before the quickstart, which makes build/models/. A page
-- passes when every block exits 0 and the checkout is as clean afterwards as before (`git status`).

local checkout = require("helpers.checkout")
local docblocks = require("helpers.docblocks")
local fs = require("ember.store.fs")
local read_file = require("helpers.files").read

local q = fs.shell_quote

-- Each page, with lines its output must contain (where exit codes alone would not tell).
-- Pages that need nothing but the built binaries come first (no build/models/ exists yet).
local PAGES = {
  { "docs/lua-api.md", {} },
  { "docs/sweeps.md", { "result: IDENTICAL", "class: exact-semantic" } },
  { "docs/quickstart.md", { "restoration criterion: HOLDS", "\nrestored\n" } },
  { "docs/testing.md", { "1 success / 0 failures" } },
}

describe("documented code", function()
  it("the marker grammar takes only marked sh/lua/python blocks and refuses unknown markers", function()
    local page = table.concat({
      "```sh", "not marked", "```",
      "<!-- run -->", "```sh", "echo one", "```",
      "<!-- run: file $W/x.lua -->", "```lua", "return 1", "```",
      "<!-- run -->", "", "```sh", "a blank line between: not marked", "```",
    }, "\n")
    local b = docblocks.blocks(page)
    assert.are.equal(2, #b)
    assert.are.same({ "sh", "", "echo one\n", 5 }, { b[1].lang, b[1].marker, b[1].code, b[1].line })
    assert.are.same({ "lua", "file $W/x.lua", "return 1\n" }, { b[2].lang, b[2].marker, b[2].code })
    local ok, err = pcall(docblocks.script, docblocks.blocks("<!-- run: twice -->\n```sh\nx\n```\n"), "page.md")
    assert.is_false(ok)
    assert.are.equal("page.md:2: unknown run marker 'twice'", err)
  end)

  local root, why = checkout.make()
  if not root then
    pending(why)
    return
  end
  local cache = fs.make_temp_dir("ember-docs-cache")

  for _, entry in ipairs(PAGES) do
    local page, expected = entry[1], entry[2]
    it(page .. ": every runnable block runs, and the checkout stays clean", function()
      local blocks = docblocks.blocks(read_file(root .. "/" .. page))
      assert.is_true(#blocks > 0, page .. " has no runnable block")
      local script = docblocks.script(blocks, page)
      local ok, out = checkout.sh("cd " .. q(root) .. " && XDG_CACHE_HOME=" .. q(cache) .. " bash -c " .. q(script))
      assert.is_true(ok, out)
      for _, want in ipairs(expected) do assert.is_truthy(out:find(want, 1, true), want .. " not in:\n" .. out) end
      assert.are.equal("", checkout.status(root), "files left in the checkout by " .. page)
    end)
  end

  teardown(function()
    checkout.remove(root)
    fs.remove_tree(cache)
  end)
end)
