#!/bin/sh
# scripts/slurm/sweep_array.sh — runs an `ember sweep` (or `ember sae top`, or the first pass of `ember
# quant-recipe`) as a Slurm job array (one shard per task) followed by a merge job. Must stay a thin
# launcher: sharding and merge are ember's.
#
# usage: sweep_array.sh --shards N --out DIR [--command "sae top"|quant-recipe] [--wait]
#                       [--sbatch-args "ARGS"] -- FLAGS...
#   Task i runs `ember sweep FLAGS --shard i/N --out DIR.shards/i`; the merge job (started only when
#   every task succeeded) runs `ember sweep merge DIR DIR.shards/0 ... DIR.shards/N-1` (--command: that command's).
#   A rerun resumes: each shard keeps the cells it already has. --wait blocks until the merge job
#   ends and exits with its status. EMBER is the path of the ember command (one executable; default:
#   this tree's build/ember, or when installed the prefix's bin/ember, else `ember` on PATH); it
#   must be reachable from the compute nodes. No path or value is written into the job scripts.
set -eu

usage() { sed -n '6,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "sweep_array.sh: $*" >&2; exit 2; }

shards= out= wait= extra= command=sweep
while [ $# -gt 0 ]; do
  case $1 in
    --shards) [ $# -ge 2 ] || die "--shards needs a value"; shards=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
    --command) [ $# -ge 2 ] || die "--command needs a value"; command=$2; shift 2 ;;
    --wait) wait=1; shift ;;
    --sbatch-args) [ $# -ge 2 ] || die "--sbatch-args needs a value"; extra=$2; shift 2 ;;
    --help|-h) usage ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (sweep flags go after --)" ;;
  esac
done
case $shards in ''|*[!0-9]*|0) die "--shards N must be a positive integer (got '$shards')" ;; esac
[ -n "$out" ] || die "--out DIR is required"
case $command in sweep|"sae top"|quant-recipe) ;;
  *) die "--command must be 'sweep', 'sae top' or 'quant-recipe' (got '$command')" ;; esac
[ $# -gt 0 ] || die "no sweep flags after -- (at least --model, --clean, --corrupted)"
for a in "$@"; do
  case $a in --out|--out=*|--shard|--shard=*|--jobs|--jobs=*) die "'$a' is set by the launcher; leave it out" ;; esac
done
command -v sbatch >/dev/null 2>&1 || die "sbatch not found (is this a Slurm submit host?)"

here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${EMBER:-}" ]; then
  if [ -x "$here/../../build/ember" ]; then EMBER=$(cd "$here/../../build" && pwd)/ember
  # installed as P/share/ember/scripts/slurm/: the launcher of the same prefix
  elif [ -x "$here/../../../../bin/ember" ]; then EMBER=$(cd "$here/../../../../bin" && pwd)/ember
  else EMBER=ember; fi
fi
case $out in /*) ;; *) out=$(pwd)/$out ;; esac
base=$out.shards
mkdir -p "$base"

# The job scripts hold no value of ours: EMBER, the command, the shard count and every path reach
# them as arguments of sbatch (argv, never text a shell parses), so a path with spaces, quotes, `$`,
# backticks or newlines passes as it is and nothing in it runs.
task=$base/task.sh
cat >"$task" <<'TASK'
#!/bin/sh
# task.sh EMBER COMMAND SHARDS BASE FLAGS...: shard $SLURM_ARRAY_TASK_ID of SHARDS into BASE/ID.
# COMMAND is "sweep", "sae top" or "quant-recipe" (checked by the launcher): its words are split on
# purpose; quant-recipe reports its groups as lines and takes no --progress.
ember=$1 command=$2 shards=$3 base=$4
shift 4
progress="--progress summary"
[ "$command" = quant-recipe ] && progress=
# shellcheck disable=SC2086
exec "$ember" $command "$@" --shard "$SLURM_ARRAY_TASK_ID/$shards" --out "$base/$SLURM_ARRAY_TASK_ID" $progress
TASK
merge=$base/merge.sh
cat >"$merge" <<'MERGE'
#!/bin/sh
# merge.sh EMBER COMMAND OUT SHARD_DIRS...: merges the shards into OUT
ember=$1 command=$2
shift 2
# shellcheck disable=SC2086
exec "$ember" $command merge "$@"
MERGE
chmod +x "$task" "$merge"
# sbatch reads %A, %a, %j ... in --output: a % of the path is written %%
logs=$(printf '%s' "$base" | sed 's/%/%%/g')

# shellcheck disable=SC2086 # --sbatch-args is a list of words on purpose
array=$(sbatch --parsable $extra --job-name=ember-sweep --array=0-$((shards - 1)) \
  --output="$logs/slurm-%A_%a.log" "$task" "$EMBER" "$command" "$shards" "$base" "$@")
array=${array%%;*}
echo "sweep_array.sh: submitted array job $array ($shards tasks), shards in $base"
# the merge runs only if every task succeeded; otherwise Slurm cancels it instead of leaving it pending
submit_merge() {
  set -- "$EMBER" "$command" "$out"
  i=0
  while [ $i -lt "$shards" ]; do set -- "$@" "$base/$i"; i=$((i + 1)); done
  # shellcheck disable=SC2086
  sbatch --parsable $extra ${wait:+--wait} --job-name=ember-sweep-merge --dependency=afterok:"$array" \
    --kill-on-invalid-dep=yes --output="$logs/slurm-merge-%j.log" "$merge" "$@"
}
merge_id=$(submit_merge) || {
  echo "sweep_array.sh: the merge job did not succeed; see $base/slurm-*.log" >&2
  exit 1
}
merge_id=${merge_id%%;*}
if [ -n "$wait" ]; then
  echo "sweep_array.sh: merge job $merge_id finished: $out"
else
  echo "sweep_array.sh: submitted merge job $merge_id -> $out"
fi
