-- ember.model.default_model — the model a command uses when given none: the project's tiny llama (Q8_0,
-- seed 7; what `make-tiny-model --family llama --dtype q8_0 --seed 7` writes), made on first use
-- in the user's cache directory. Must not look anywhere else (no source tree, no working directory).

local fs = require("ember.store.fs")

local M = {}

M.FILE = "tiny-llama-q8_0.gguf"
M.PARAMS = { family = "llama", dtype = "q8_0", seed = 7 }

-- cache_dir() -> $XDG_CACHE_HOME/ember, else $HOME/.cache/ember (the XDG base directory rule:
-- a relative XDG_CACHE_HOME is ignored).
function M.cache_dir()
  local xdg = os.getenv("XDG_CACHE_HOME")
  if xdg and xdg:sub(1, 1) == "/" then return fs.join(xdg, "ember") end
  local home = os.getenv("HOME")
  if not home or home == "" then
    error("default model: neither XDG_CACHE_HOME nor HOME is set; give --model FILE.gguf", 0)
  end
  return fs.join(home, ".cache/ember")
end

-- path() -> the default model's path, making it when it is missing. Concurrent first uses are
-- safe: the generator writes a temporary file and renames it into place.
function M.path()
  local dir = M.cache_dir()
  local path = fs.join(dir, M.FILE)
  if fs.exists(path) then return path end
  local ok, err = fs.mkdir_p(dir)
  if not ok then error("default model: " .. err, 0) end -- err names the directory and why
  local made, why = require("ember.core").make_tiny_model(path, M.PARAMS)
  if not made then error(string.format("default model: cannot write '%s': %s", path, why), 0) end
  return path
end

return M
