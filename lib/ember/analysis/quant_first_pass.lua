-- ember.analysis.quant_first_pass — the first pass of `ember quant-recipe` kept on disk: DIR/first-pass.json,
-- rewritten atomically after every group, holds each measured group under the settings that fix
-- its value (A's and B's sha256, the prompts' ids, the metric, the grouping, the kernel set), so
-- that a run resumes where it stopped, shards (--shard I/N) measure their share of the groups, and
-- a run over their directories (--jobs, `quant-recipe merge`, a Slurm array) takes every group
-- measured there instead of measuring it again. Must not measure nor select.

local core = require("ember.core")
local fs = require("ember.store.fs")
local json = require("ember.store.json")

local M = {}

M.FILE = "first-pass.json"
local MAX_BYTES = 64 * 1024 * 1024
local FIELDS = { "recovered", "divergence", "kl", "top1" }

local function fail(msg, ...) error("quant-recipe: " .. string.format(msg, ...), 0) end

-- settings{ a_sha256, b_sha256, prompts, metric, per_tensor, kernels } -> the settings table and its
-- digest: what a measured group's value depends on (threads do not change a bit)
function M.settings(o)
  local ids = {}
  for i, p in ipairs(o.prompts) do ids[i] = table.concat(p.ids, ",") end
  local s = json.ordered({ "a_sha256", "b_sha256", "prompts_sha256", "metric", "per_tensor", "kernels" }, {
    a_sha256 = o.a_sha256, b_sha256 = o.b_sha256, prompts_sha256 = core.sha256(table.concat(ids, "\n")),
    metric = o.metric.kind .. (#o.metric.tokens > 0 and (":" .. table.concat(o.metric.tokens, ",")) or ""),
    per_tensor = o.per_tensor and true or false, kernels = o.kernels })
  return s, core.sha256(json.encode(s))
end

-- read(dir) -> the checkpoint document of dir, or nil when dir holds none; a file that is not one
-- is an error naming it
function M.read(dir)
  local path = fs.join(dir, M.FILE)
  if not fs.exists(path) then return nil end
  local ok, doc = pcall(json.decode, fs.read(path, "quant-recipe first pass", MAX_BYTES))
  if not ok or type(doc) ~= "table" or type(doc.settings_sha256) ~= "string" or type(doc.groups) ~= "table" then
    fail("%s is not a first-pass file (%s)", path, ok and "no settings_sha256 or groups" or tostring(doc))
  end
  for name, g in pairs(doc.groups) do
    if type(name) ~= "string" or type(g) ~= "table" or type(g.recovered) ~= "number" then
      fail("%s: group '%s' has no recovered share", path, tostring(name))
    end
  end
  doc.path = path
  return doc
end

-- gather(dirs, digest) -> name -> the saved measurement, from every dir's checkpoint (a dir without
-- one gives nothing); a checkpoint made with other settings is refused, naming it
function M.gather(dirs, digest)
  local out, count = {}, 0
  for _, d in ipairs(dirs) do
    local doc = M.read(d)
    if doc then
      if doc.settings_sha256 ~= digest then
        fail("%s was measured with other settings (models, prompts, metric, grouping or kernels): "
          .. "use another --out, or remove it", doc.path)
      end
      for name, g in pairs(doc.groups) do
        if not out[name] then count = count + 1 end
        out[name] = g
      end
    end
  end
  return out, count
end

-- saver(dir, doc, done) -> function(group): records one measured group in dir's checkpoint, with
-- the groups of done (name -> saved). doc: the checkpoint's other fields (settings,
-- settings_sha256, shard, args: the flags that made it, total_groups).
function M.saver(dir, doc, done)
  local groups = {}
  for name, g in pairs(done or {}) do groups[name] = g end
  local path = fs.join(dir, M.FILE)
  return function(g)
    local entry = { certified = g.certified or false }
    for _, f in ipairs(FIELDS) do entry[f] = g[f] end
    groups[g.name] = entry
    local ordered = groups -- encoded in sorted key order
    fs.write_atomic(path, json.encode(json.ordered({ "version", "settings", "settings_sha256", "shard", "args",
      "total_groups", "groups" }, { version = 1, settings = doc.settings, settings_sha256 = doc.settings_sha256,
      shard = doc.shard or json.null, args = doc.args and json.array(doc.args) or json.null,
      total_groups = doc.total_groups, groups = ordered }), { indent = "  " }), "quant-recipe first pass")
  end
end

-- restore(g, saved) -> g with the saved measurement's fields
function M.restore(g, saved)
  g.certified = saved.certified == true
  for _, f in ipairs(FIELDS) do
    local v = saved[f]
    if v ~= nil and v ~= json.null then g[f] = v end
  end
  return g
end

return M
