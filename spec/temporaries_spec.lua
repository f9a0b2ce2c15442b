-- Temporaries are ember's alone and swept only when provably dead. A name carries ember's own mark,
-- this boot's id and the PID namespace as well as the writer's pid: NAME.ember-tmp-BOOT-PIDNS-PID-
-- RANDOM. The sweep before every atomic write (and before --dump-layers, --dump-logits and the
-- artifact directories) removes only those written on this boot, in this PID namespace, by a
-- process that is gone; a live writer on another node of a shared file system (another boot id),
-- in another container (another namespace), or a user's own "keep.tmp-99999-cafe/" is never touched.
-- The expected boot id and namespace are read here by other means (the kernel's file, stat(1)).

local fs = require("ember.store.fs")
local H = require("helpers.artifacts")
local C = require("helpers.cli")

local q = fs.shell_quote

local function sh_read(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return (out:gsub("%s+$", ""))
end

local BOOT = sh_read("tr -d '-' < /proc/sys/kernel/random/boot_id 2>/dev/null | cut -c1-16")
local PIDNS = sh_read("stat -L -c %i /proc/self/ns/pid 2>/dev/null")
local DEAD = "4194305" -- above Linux's largest pid_max (2^22): no such process can run

local function name(base, boot, ns, pid)
  return string.format("%s.ember-tmp-%s-%s-%s-0123456789abcdef", base, boot, ns, pid)
end

local function touch(path) H.write(path, "partial") end

describe("temporaries", function()
  if #BOOT ~= 16 or PIDNS == "" then
    pending("no boot id or PID namespace here (/proc/sys/kernel/random/boot_id, /proc/self/ns/pid)")
    return
  end
  after_each(H.cleanup)

  it("are named with ember's mark, this boot, this PID namespace and this process", function()
    local t = fs.temp_sibling("/x/out.json")
    local pid = sh_read("echo $PPID") -- the shell's parent: this process
    assert.matches("^/x/out%.json%.ember%-tmp%-" .. BOOT .. "%-" .. PIDNS .. "%-" .. pid .. "%-%x+$", t)
  end)

  it("only ember's own, dead on this boot and in this namespace, are swept", function()
    local dir = H.tmpdir()
    local other_boot = (BOOT:sub(1, 1) == "a" and "b" or "a") .. BOOT:sub(2)
    local swept_names = { name("out.json", BOOT, PIDNS, DEAD), name("cap", BOOT, PIDNS, DEAD) }
    local kept_names = {
      name("live.json", BOOT, PIDNS, "1"),              -- pid 1 runs: a live writer
      name("node.json", other_boot, PIDNS, DEAD),       -- another machine (or boot) on a shared file system
      name("ns.json", BOOT, tostring(tonumber(PIDNS) + 1), DEAD), -- another PID namespace
      name("unknown.json", "0", "0", DEAD),             -- a writer that could not tell who it was
      "old.json.tmp-" .. DEAD .. "-0123456789abcdef",   -- the form earlier versions wrote
      "keep.tmp-99999-cafe",                            -- a user's own directory
      "notes.ember-tmp-draft",                          -- the mark without the form
    }
    touch(dir .. "/" .. swept_names[1])
    assert(fs.mkdir(dir .. "/" .. swept_names[2]))
    touch(dir .. "/" .. swept_names[2] .. "/tensors.safetensors")
    for _, n in ipairs(kept_names) do touch(dir .. "/" .. n) end
    assert(fs.mkdir(dir .. "/keep.tmp-99999-cafe.d"))
    touch(dir .. "/keep.tmp-99999-cafe.d/mine")
    local swept = fs.write_atomic(dir .. "/new.json", "{}", "test")
    table.sort(swept)
    assert.same({ dir .. "/" .. swept_names[2], dir .. "/" .. swept_names[1] }, swept)
    for _, n in ipairs(kept_names) do assert.is_true(fs.exists(dir .. "/" .. n), n) end
    assert.is_true(fs.exists(dir .. "/keep.tmp-99999-cafe.d/mine"))
  end)

  it("scratch directories (make_temp_dir) outlive their process: never named like a temporary", function()
    local d = fs.make_temp_dir("ember-scratch")
    assert.is_nil(fs.basename(d):find(fs.TEMP_MARK, 1, true))
    assert.is_false(fs.temp_writer_dead(fs.basename(d)))
    fs.remove_tree(d)
  end)

  it("--dump-layers and --dump-logits sweep a killed dump's leftovers beside them", function()
    local model = C.need_model()
    if not model then return end
    local dir = H.tmpdir()
    local stale_dir = dir .. "/" .. name("layers", BOOT, PIDNS, DEAD)
    local stale_spill = dir .. "/" .. name("logits.safetensors", BOOT, PIDNS, DEAD)
    assert(fs.mkdir(stale_dir))
    touch(stale_dir .. "/.layer_00.spill")
    touch(stale_spill)
    local code, _, err = C.ember("--model", model, "--prompt", "hi", "--max-tokens", "1", "--dump-layers",
      dir .. "/layers", "--dump-logits", dir .. "/logits.safetensors")
    assert.equal(0, code, err)
    assert.is_false(fs.exists(stale_dir))
    assert.is_false(fs.exists(stale_spill))
    assert.is_true(fs.exists(dir .. "/layers/dump.json"))
  end)
end)
