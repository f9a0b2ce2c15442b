-- ember.cli.compare_artifacts — `ember compare-artifacts DIR_A DIR_B [--records] [--json] [--require CLASS]`:
-- two activation artifacts (or two sweeps) compared, the summary or every record on stdout.
-- Must not compare anything itself: ember.analysis.compare and ember.sweep.compare do.

local flags = require("ember.cli.flags")
local selectors = require("ember.run.selectors")

local M = {}

M.FLAGS = flags.spec({ { "json", "bool" }, { "records", "bool" }, { "require", selectors.parse_class } })

-- The lines `ember --help` gives this subcommand.
function M.help_lines()
  return {
    "compare-artifacts: aligns records on (stage, layer, phase, start_position) and prints a summary",
    "  (counts, the first differing records, the largest differences per stage and layer) and a class:",
    "  " .. table.concat(selectors.CLASSES, " > "),
    "  (two sweep directories are compared cell by cell, with the same classes)",
    "  --records         every aligned record instead of the summary",
    "  --json            machine-readable result",
    "  --require CLASS   exit 0 only for CLASS or a stricter class",
  }
end

-- main(args, argv, io_) -> exit code; args[1] is "compare-artifacts".
function M.main(args, _, io_)
  local opts, pos = flags.parse(args, 2, M.FLAGS)
  if #pos ~= 2 then flags.usage_error("compare-artifacts needs two artifact directories, got %d", #pos) end
  local compare = require("ember.analysis.compare")
  -- two sweep artifacts are compared cell by cell, with the same classes, --json and --require
  local sweeps = require("ember.sweep.compare")
  local sa, sb = sweeps.is_sweep(pos[1]), sweeps.is_sweep(pos[2])
  if sa ~= sb then
    error(string.format("compare-artifacts: '%s' is %s and '%s' is %s; compare two sweeps or two activation "
      .. "artifacts", pos[1], sa and "a sweep" or "not a sweep", pos[2], sb and "a sweep" or "not a sweep"), 0)
  end
  local kind = sa and sweeps or compare
  local res = kind.compare_dirs(pos[1], pos[2])
  if opts.json then
    io_.stdout:write(kind.to_json(res))
  else
    -- activation artifacts: a summary, or every record with --records
    io_.stdout:write(kind.format_text(res, { records = opts.records }))
  end
  if opts.require and not compare.at_least(res.class, opts.require) then
    io_.stderr:write(string.format("ember: compare-artifacts: class %s does not meet --require %s\n",
      res.class, opts.require))
    return 1
  end
  return 0
end

return M
