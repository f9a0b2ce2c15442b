-- helpers.docblocks — the runnable code blocks of a Markdown page, and one bash script that runs
-- them in order. Must not guess: only blocks marked runnable are taken.
--
-- The marker is an HTML comment on the line right before the opening fence (invisible when the
-- page is rendered):
--   <!-- run -->              a ```sh block runs as shell commands; a ```lua block runs as a
--                             script under build/ember-lua; a ```python block under
--                             /usr/bin/python3 (Debian's, with numpy)
--   <!-- run: file PATH -->   the block's text is written to PATH (shell words expand, e.g.
--                             $W/halve.lua) before the blocks after it run
-- Blocks of one page share one shell, so variables set in one block (M=..., W=...) are seen by
-- the blocks after it.

local M = {}

-- blocks(text) -> { { lang, marker, code, line } } of the marked blocks, in page order.
function M.blocks(text)
  local out, lines = {}, {}
  for l in (text .. "\n"):gmatch("(.-)\r?\n") do lines[#lines + 1] = l end
  local i = 1
  while i <= #lines do
    local marker = lines[i]:match("^<!%-%-%s*run(.-)%-%->%s*$")
    local fence, lang = (lines[i + 1] or ""):match("^(```+)%s*(%w*)")
    if marker and fence then
      local code, j = {}, i + 2
      while j <= #lines and not lines[j]:match("^" .. fence .. "%s*$") do
        code[#code + 1] = lines[j]
        j = j + 1
      end
      if j > #lines then error("unterminated code block after the marker on line " .. i, 0) end
      marker = marker:gsub("^%s*:?%s*", ""):gsub("%s+$", "")
      out[#out + 1] = { lang = lang, marker = marker, code = table.concat(code, "\n") .. "\n", line = i + 1 }
      i = j + 1
    else
      i = i + 1
    end
  end
  return out
end

local function heredoc_tag(code)
  local tag = "EMBER_DOC_BLOCK"
  while code:find(tag, 1, true) do tag = tag .. "_" end
  return tag
end

-- script(blocks, page) -> bash text that runs the blocks in order, stopping at the first failure
-- with a message naming the page and the block's line.
function M.script(blocks, page)
  local parts = { "set -euo pipefail" }
  for _, b in ipairs(blocks) do
    local where = string.format("%s:%d", page, b.line)
    parts[#parts + 1] = string.format("echo '== %s' >&2", where)
    parts[#parts + 1] = string.format("trap 'echo \"docs: the block at %s failed\" >&2' ERR", where)
    local file = b.marker:match("^file%s+(.+)$")
    local tag = heredoc_tag(b.code)
    if file then
      parts[#parts + 1] = "cat > " .. file .. " <<'" .. tag .. "'\n" .. b.code .. tag
    elseif b.marker ~= "" then
      error(string.format("%s: unknown run marker '%s'", where, b.marker), 0)
    elseif b.lang == "sh" or b.lang == "bash" then
      parts[#parts + 1] = b.code
    elseif b.lang == "lua" then
      parts[#parts + 1] = "build/ember-lua - <<'" .. tag .. "'\n" .. b.code .. tag
    elseif b.lang == "python" then
      parts[#parts + 1] = "/usr/bin/python3 - <<'" .. tag .. "'\n" .. b.code .. tag
    else
      error(string.format("%s: a runnable block must be sh, lua or python, got '%s'", where, b.lang), 0)
    end
  end
  return table.concat(parts, "\n") .. "\n"
end

return M
