-- ember.model.tokenizer — loads a tokenizer from a HuggingFace tokenizer.json or from the vocabulary
-- embedded in a GGUF file, and returns an ember.Tokenizer (see src/lua_bindings/l_tokenizer.c).
-- Must not tokenize: this file only reads JSON (lua-cjson), checks that every piece of the file
-- is one ember implements, and hands a flat description to the C builder.
--
--   local tokenizer = require("ember.model.tokenizer")
--   local tok = tokenizer{ file = "tokenizer.json" }      -- + tokenizer_config.json beside it
--   local tok = tokenizer{ gguf = "vocab-only.gguf" }
--   options: add_bos = bool (override the family's default), bos_id / eos_id = integer overrides,
--            config = path of tokenizer_config.json, or false to ignore one that sits beside the file

local core = require("ember.core")
local cjson = require("cjson")
local fs = require("ember.store.fs")

local null = cjson.null
local SPACE_MARK = "\u{2581}" -- SentencePiece's visible space

-- Raised without a position prefix: the message names the file and the problem itself.
local function fail(fmt, ...)
  error("ember.tokenizer: " .. string.format(fmt, ...), 0)
end

local function is_null(v)
  return v == nil or v == null
end

-- Text from a file, made safe for a message: control bytes, DEL, quotes and backslashes as \xNN,
-- cut short after 120 bytes.
local function esc(v)
  local s = tostring(v)
  local cut = #s > 120
  if cut then s = s:sub(1, 120) end
  s = s:gsub("[%c\127'\\]", function(c) return string.format("\\x%02X", c:byte()) end)
  return cut and s .. "..." or s
end

-- The largest tokenizer.json or tokenizer_config.json read (real ones are under 40 MB).
local MAX_JSON_BYTES = 256 * 1024 * 1024

-- Returns the decoded value and the raw text. Only regular files are read (fs.read: a FIFO or a
-- directory is an error naming it, never a hang).
local function read_json(path, what)
  local read, text = pcall(fs.read, path, "cannot open " .. what, MAX_JSON_BYTES)
  if not read then fail("%s", text) end
  local ok, value = pcall(cjson.decode, text)
  if not ok then fail("%s: invalid JSON (%s)", path, esc(tostring(value):gsub("^.-:%d+: ", ""))) end
  if type(value) ~= "table" then fail("%s: expected a JSON object at the top level", path) end
  return value, text
end

-- lua-cjson decodes [] and {} alike, so whether an empty table was written as an array is read
-- from the text: every `"key": ` in the file must be followed by '['.
local function spelled_as_object(text, key)
  for pre, open in text:gmatch('(.)"' .. key .. '"%s*:%s*([%[{])') do
    if pre ~= "\\" and open == "{" then return true end
  end
  return false
end

-- A JSON array: a table whose keys are exactly 1..n (an empty one checked in the text).
local function check_array(t, text, key, field, path)
  if type(t) ~= "table" then fail("%s: %s must be an array, got %s", path, field, type(t)) end
  local n = 0
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 then fail("%s: %s must be an array, got an object", path, field) end
    n = n + 1
  end
  if n ~= #t then fail("%s: %s must be an array, got an object", path, field) end
  if n == 0 and spelled_as_object(text, key) then fail("%s: %s must be an array, got an object", path, field) end
end

-- An id as JSON writes it: a number with an integer value (cjson gives floats), never a string.
local function check_id(v, field, path)
  if type(v) ~= "number" or v ~= math.floor(v) or v ~= v or v == math.huge or v == -math.huge then
    fail("%s: %s must be an integer id, got %s%s", path, field, type(v),
      type(v) == "string" and " '" .. esc(v) .. "'" or type(v) == "number" and " " .. tostring(v) or "")
  end
end

local function type_of(node)
  return type(node) == "table" and node.type or tostring(node)
end

-- The split patterns ember matches by hand (src/tokenizer/tokenizer_pretok.c), exactly as the
-- tokenizer.json files of GPT-2, LLaMA 3 and Qwen2/3 write them.
local KNOWN_REGEXES = {
  [ [=['s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+]=] ] = "gpt2",
  [ [=[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|]=]
    .. [=[\s*[\r\n]+|\s+(?!\S)|\s+]=] ] = "llama3",
  [ [=[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|]=]
    .. [=[\s*[\r\n]+|\s+(?!\S)|\s+]=] ] = "qwen2",
}

-- normalizer -> cfg.nfc / cfg.escape_spaces / cfg.add_space_prefix
local function read_normalizer(node, cfg, path)
  if is_null(node) then return end
  local t = type_of(node)
  if t == "Sequence" then
    for _, n in ipairs(node.normalizers or {}) do read_normalizer(n, cfg, path) end
  elseif t == "NFC" then
    cfg.nfc = true
  elseif t == "Replace" and type(node.pattern) == "table" and node.pattern.String == " "
      and node.content == SPACE_MARK then
    cfg.escape_spaces = true
  elseif t == "Prepend" and node.prepend == SPACE_MARK then
    cfg.add_space_prefix = true
  else
    fail("%s: normalizer '%s' is not supported (ember knows NFC, Replace ' ' -> '\u{2581}', "
      .. "Prepend '\u{2581}' and Sequence of these)", path, esc(t))
  end
end

-- pre_tokenizer -> cfg.pre / cfg.byte_level
local function read_pre_tokenizer(node, cfg, path)
  if is_null(node) then return end
  local t = type_of(node)
  local function set_pre(pre)
    if cfg.pre ~= "none" and cfg.pre ~= pre then
      fail("%s: pre_tokenizer combines two split patterns, which is not supported", path)
    end
    cfg.pre = pre
  end
  if t == "Sequence" then
    for _, p in ipairs(node.pretokenizers or {}) do read_pre_tokenizer(p, cfg, path) end
  elseif t == "ByteLevel" then
    if node.add_prefix_space == true then
      fail("%s: pre_tokenizer ByteLevel with add_prefix_space = true is not supported", path)
    end
    cfg.byte_level = true
    if node.use_regex ~= false then set_pre("gpt2") end -- HF's default is the GPT-2 pattern
  elseif t == "Split" then
    local pattern = type(node.pattern) == "table" and node.pattern or {}
    if pattern.Regex then
      local pre = KNOWN_REGEXES[pattern.Regex]
      if not pre then
        fail("%s: pre_tokenizer Split pattern is not one ember implements: %s", path, esc(pattern.Regex))
      end
      if node.behavior ~= "Isolated" or node.invert then
        fail("%s: pre_tokenizer Split must be behavior = Isolated, invert = false", path)
      end
      set_pre(pre)
    elseif pattern.String == " " and cfg.escape_spaces then
      -- the normalizer has already turned every ' ' into U+2581, so this split never fires
    else
      fail("%s: pre_tokenizer Split on %s is not supported", path, esc(cjson.encode(node.pattern)))
    end
  else
    fail("%s: pre_tokenizer '%s' is not supported (ember knows ByteLevel, Split with the GPT-2, "
      .. "LLaMA 3 or Qwen2 pattern, and Sequence of these)", path, esc(t))
  end
end

-- decoder: only checked; decoding follows from the model (byte-level or U+2581 + byte fallback).
local function read_decoder(node, cfg, path)
  if is_null(node) then return end
  local t = type_of(node)
  if t == "Sequence" then
    for _, d in ipairs(node.decoders or {}) do read_decoder(d, cfg, path) end
  elseif t == "Strip" then
    if node.content == " " and (node.start or 0) == 1 then cfg.decode_strip_space = true
    elseif (node.start or 0) ~= 0 or (node["stop"] or 0) ~= 0 then
      fail("%s: decoder Strip other than one leading space is not supported", path)
    end
  elseif t == "Replace" then
    if not (type(node.pattern) == "table" and node.pattern.String == SPACE_MARK and node.content == " ") then
      fail("%s: decoder Replace other than '\u{2581}' -> ' ' is not supported", path)
    end
  elseif t ~= "ByteLevel" and t ~= "ByteFallback" and t ~= "Fuse" then
    fail("%s: decoder '%s' is not supported", path, esc(t))
  end
end

-- post_processor: the BOS a TemplateProcessing puts first. Returns its token string or nil.
local function read_post_processor(node, path)
  if is_null(node) then return nil end
  local t = type_of(node)
  if t == "Sequence" then
    local bos
    for _, p in ipairs(node.processors or {}) do bos = read_post_processor(p, path) or bos end
    return bos
  elseif t == "ByteLevel" then
    return nil
  elseif t == "TemplateProcessing" then
    local first = type(node.single) == "table" and node.single[1]
    if type(first) == "table" and type(first.SpecialToken) == "table" then
      local name = first.SpecialToken.id
      local st = type(node.special_tokens) == "table" and node.special_tokens[name]
      if type(st) == "table" and type(st.tokens) == "table" and #st.tokens == 1 then return st.tokens[1] end
      return name
    end
    return nil
  end
  fail("%s: post_processor '%s' is not supported", path, esc(t))
end

-- "<bos>" or { content = "<bos>" } (tokenizer_config.json writes both forms).
local function token_name(v)
  if type(v) == "string" then return v end
  if type(v) == "table" and type(v.content) == "string" then return v.content end
  return nil
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

-- Whether something sits at path (a stat, never an open: a FIFO must not block the probe).
local function file_exists(path) return fs.exists(path) end

-- check_bpe(j, text, path) -> the model and the added tokens of a parsed tokenizer.json j (text: its
-- bytes, for telling arrays from objects), every field ember reads checked
local function check_bpe(j, text, path)
  local model = j.model
  if type(model) ~= "table" then fail("%s: has no \"model\" object", path) end
  if model.type ~= "BPE" then
    -- null (cjson's light userdata) or a table must not print as "userdata: 0x..."
    if is_null(model.type) then fail("%s: model.type is null or missing (ember implements BPE)", path) end
    if type(model.type) ~= "string" then
      fail("%s: model.type is a %s, not a model name (ember implements BPE)", path, type(model.type))
    end
    fail("%s: model type '%s' is not supported (ember implements BPE)", path, esc(model.type))
  end
  if not is_null(model.dropout) and model.dropout ~= 0 then fail("%s: BPE dropout is not supported", path) end
  for _, k in ipairs({ "continuing_subword_prefix", "end_of_word_suffix" }) do
    if not is_null(model[k]) and model[k] ~= "" then fail("%s: BPE %s is not supported", path, k) end
  end
  if type(model.vocab) ~= "table" then fail("%s: model.vocab must be an object", path) end
  for k, v in pairs(model.vocab) do
    if type(k) ~= "string" then fail("%s: model.vocab must be an object, got an array", path) end
    check_id(v, "model.vocab['" .. esc(k) .. "']", path)
  end
  if not is_null(model.merges) then check_array(model.merges, text, "merges", "model.merges", path) end
  local added = j.added_tokens
  if is_null(added) then added = {} end
  check_array(added, text, "added_tokens", "added_tokens", path)
  for i, a in ipairs(added) do
    if type(a) ~= "table" then fail("%s: added_tokens[%d] must be an object", path, i) end
    check_id(a.id, "added_tokens[" .. i .. "].id", path)
    if type(a.content) ~= "string" then
      fail("%s: added_tokens[%d].content must be a string, got %s", path, i, type(a.content))
    end
  end
  return model, added
end

-- special_ids(cfg, j, model, added, opts, path): the unknown, BOS and EOS ids into cfg, and whether
-- to add BOS. A name is found among the added tokens (which may extend the vocabulary), else in the
-- model vocabulary; BOS/EOS come from tokenizer_config.json, then the post-processor template, then
-- the LLaMA 3 rule.
local function special_ids(cfg, j, model, added, opts, path)
  local added_ids = {}
  for _, a in ipairs(added) do
    if type(a) == "table" and type(a.content) == "string" then added_ids[a.content] = a.id end
  end
  local function id_of(name)
    if name == nil then return nil end
    return added_ids[name] or model.vocab[name]
  end
  if not is_null(model.unk_token) then
    cfg.unk_id = id_of(model.unk_token)
    if not cfg.unk_id then fail("%s: unk_token '%s' is not in the vocabulary", path, esc(model.unk_token)) end
  end

  local config_path = opts.config
  if config_path == nil then
    config_path = dirname(path) .. "/tokenizer_config.json"
    if not file_exists(config_path) then config_path = false end
  end
  local config = config_path and read_json(config_path, "tokenizer config") or {}
  local template_bos = read_post_processor(j.post_processor, path)
  local bos_name = token_name(config.bos_token) or template_bos
  local add_bos
  if type(config.add_bos_token) == "boolean" then
    add_bos = config.add_bos_token
  elseif template_bos then
    add_bos = true
  elseif added_ids["<|begin_of_text|>"] then
    -- LLaMA 3: older tokenizer.json files lack the BOS template, yet the model wants BOS
    -- (llama.cpp's llama-bpe vocabularies add it too)
    add_bos, bos_name = true, bos_name or "<|begin_of_text|>"
  else
    add_bos = false
  end
  cfg.bos_id = id_of(bos_name)
  if bos_name and not cfg.bos_id then fail("%s: BOS token '%s' is not in the vocabulary", path, esc(bos_name)) end
  local eos_name = token_name(config.eos_token)
  if not eos_name then
    for _, name in ipairs({ "<|endoftext|>", "<|end_of_text|>", "<eos>", "</s>" }) do
      if added_ids[name] then eos_name = name; break end
    end
  end
  cfg.eos_id = id_of(eos_name)
  if eos_name and not cfg.eos_id then fail("%s: EOS token '%s' is not in the vocabulary", path, esc(eos_name)) end
  cfg.add_bos = add_bos and cfg.bos_id ~= nil
end

local function from_json(opts)
  local path = opts.file
  local j, text = read_json(path, "tokenizer file")
  local model, added = check_bpe(j, text, path)
  local cfg = {
    source = path, model = "bpe", pre = "none",
    vocab = model.vocab, merges = not is_null(model.merges) and model.merges or {}, added = added,
    byte_fallback = model.byte_fallback == true, fuse_unk = model.fuse_unk == true,
    ignore_merges = model.ignore_merges == true,
  }
  read_normalizer(j.normalizer, cfg, path)
  read_pre_tokenizer(j.pre_tokenizer, cfg, path)
  read_decoder(j.decoder, cfg, path)
  if cfg.add_space_prefix and not cfg.escape_spaces then
    fail("%s: a Prepend normalizer needs the Replace ' ' -> '\u{2581}' one", path)
  end
  cfg.decode_strip_space = cfg.decode_strip_space or cfg.add_space_prefix

  special_ids(cfg, j, model, added, opts, path)
  return cfg
end

local OPTIONS = { file = true, gguf = true, add_bos = true, bos_id = true, eos_id = true, config = true }

return function(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'tokenizer' (expected a table { file = ... } or { gguf = ... }, got "
      .. type(opts) .. ")", 2)
  end
  for k in pairs(opts) do
    if not OPTIONS[k] then error("bad argument #1 to 'tokenizer' (unknown option '" .. tostring(k) .. "')", 2) end
  end
  if (opts.file == nil) == (opts.gguf == nil) then
    error("bad argument #1 to 'tokenizer' (give exactly one of file = and gguf =)", 2)
  end
  if opts.add_bos ~= nil and type(opts.add_bos) ~= "boolean" then
    error("bad argument #1 to 'tokenizer' (add_bos must be a boolean)", 2)
  end
  for _, k in ipairs({ "bos_id", "eos_id" }) do
    if opts[k] ~= nil and math.type(opts[k]) ~= "integer" then
      error("bad argument #1 to 'tokenizer' (" .. k .. " must be an integer)", 2)
    end
  end
  if opts.gguf then
    if type(opts.gguf) ~= "string" then error("bad argument #1 to 'tokenizer' (gguf must be a path)", 2) end
    if opts.add_bos ~= nil or opts.bos_id or opts.eos_id or opts.config ~= nil then
      error("bad argument #1 to 'tokenizer' (add_bos, bos_id, eos_id and config apply to file = only)", 2)
    end
    return core.tokenizer_from_gguf(opts.gguf)
  end
  if type(opts.file) ~= "string" then error("bad argument #1 to 'tokenizer' (file must be a path)", 2) end
  if opts.config ~= nil and opts.config ~= false and type(opts.config) ~= "string" then
    error("bad argument #1 to 'tokenizer' (config must be a path or false)", 2)
  end
  local cfg = from_json(opts)
  if opts.bos_id then cfg.bos_id = opts.bos_id end
  if opts.eos_id then cfg.eos_id = opts.eos_id end
  if opts.add_bos ~= nil then cfg.add_bos = opts.add_bos end
  return core.tokenizer_build(cfg)
end
