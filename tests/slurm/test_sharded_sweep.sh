#!/usr/bin/env bash
# ctest slurm.sharded_sweep (label slurm): a sharded sweep on a real one-node Slurm (scripts/slurm/local-cluster).
#   1. configs/smoke.json as 4 array tasks (scripts/slurm/submit) and the afterany merge job: every task wrote
#      its shard with its Slurm ids, the merge exits 0 and the merged rows are exactly the plan's points;
#   2. a second submission, held, whose task 2 is cancelled while pending (deterministic: it never starts):
#      the merge job exits 1 and lists exactly shard 2's points (compared with `run --shard 2/4 --dry-run`);
#   3. only task 2 resubmitted (--array 2) into the same folder: the merge is complete.
# The cluster always goes down at the end (trap). Exit 77 (skipped) without root or the Slurm binaries.
#   tests/slurm/test_sharded_sweep.sh PATH/TO/attnbench
set -euo pipefail

ATTNBENCH="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="$ROOT/configs/smoke.json"
N=4
CANCELLED=2
T0=$SECONDS

say() { printf '[slurm test +%3ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() {
  say "FAIL: $*"
  exit 1
}
indent() { sed 's/^/    | /'; }

if [ "$(id -u)" -ne 0 ]; then
  say "SKIP: not root (scripts/slurm/local-cluster starts slurmd and munged, which needs root)"
  exit 77
fi
for b in munged slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
  command -v "$b" >/dev/null 2>&1 || {
    say "SKIP: '$b' not found (Debian: apt-get install slurm-wlm slurmctld slurmd slurm-client munge)"
    exit 77
  }
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/attnbench-slurm-test-XXXXXX")"
# Its own folder and ports, so a local cluster someone left up (default ports 6817/6818) is not disturbed.
export ATTN_SLURM_DIR="$WORK/cluster" ATTN_SLURM_CTLD_PORT="${ATTN_SLURM_CTLD_PORT:-16817}"
export ATTN_SLURM_D_PORT="${ATTN_SLURM_D_PORT:-16818}"
cleanup() {
  local rc=$?
  say "bringing the cluster down"
  "$ROOT/scripts/slurm/local-cluster" down 2>&1 | indent || true
  if [ "$rc" -eq 0 ]; then
    rm -rf "$WORK"
    say "PASS in $((SECONDS - T0)) s"
  else
    say "kept $WORK (cluster logs in $ATTN_SLURM_DIR/log, job logs in run*/slurm/logs)"
  fi
  exit "$rc"
}
trap cleanup EXIT

say "starting a one-node Slurm in $ATTN_SLURM_DIR (ports $ATTN_SLURM_CTLD_PORT, $ATTN_SLURM_D_PORT)"
up_status=0
up_out="$("$ROOT/scripts/slurm/local-cluster" up 2>"$WORK/up.log")" || up_status=$?
indent <"$WORK/up.log"
[ "$up_status" -eq 0 ] || fail "local-cluster up failed (exit $up_status)"
eval "$up_out"
say "$up_out"
sinfo | indent

# The plan: every point id, and the ids of the shard to be cancelled.
plan_ids() { "$ATTNBENCH" run "$CONFIG" --dry-run "$@" | awk 'NF >= 2 && ($2 == "est." || $2 == "SKIP:") { print $1 }'; }
plan_ids | sort >"$WORK/plan.ids"
plan_ids --shard "$CANCELLED/$N" | sort >"$WORK/shard$CANCELLED.ids"
planned=$(wc -l <"$WORK/plan.ids")
in_shard=$(wc -l <"$WORK/shard$CANCELLED.ids")
say "plan of $(basename "$CONFIG"): $planned points; shard $CANCELLED/$N: $in_shard points"
[ "$planned" -gt 0 ] && [ "$in_shard" -gt 0 ] || fail "empty plan or empty shard $CANCELLED"

# submit ARGS...: runs scripts/slurm/submit, shows its output, sets ARRAY and MERGE.
submit() {
  local out
  out="$("$ROOT/scripts/slurm/submit" --attnbench "$ATTNBENCH" "$@")" || fail "submit $* failed"
  echo "$out" | indent
  ARRAY="$(sed -n 's/^array_job=//p' <<<"$out")"
  MERGE="$(sed -n 's/^merge_job=//p' <<<"$out")"
  [ -n "$ARRAY" ] && [ -n "$MERGE" ] || fail "submit printed no job ids"
}

# wait_job ID: until the job has ended (90 s at most); prints "STATE EXITCODE".
wait_job() {
  local deadline=$((SECONDS + 90)) line state
  while :; do
    line="$(scontrol -o show job "$1" 2>/dev/null || true)"
    state="$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")"
    case "$state" in
      PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | "") ;;
      *)
        echo "$state $(sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' <<<"$line")"
        return
        ;;
    esac
    [ $SECONDS -lt $deadline ] || fail "job $1 still ${state:-unknown} after 90 s"
    sleep 0.5
  done
}

# merged_ids DIR: the ids of DIR/results.jsonl, sorted (one per line, duplicates kept).
merged_ids() { sed 's/.*"id":"\([^"]*\)".*/\1/' "$1/results.jsonl" | sort; }

# --- 1. four array tasks and the merge ------------------------------------------------------------------
run1="$WORK/run1"
say "1. submitting $(basename "$CONFIG") as $N array tasks into $run1"
submit "$CONFIG" "$N" --out "$run1"
result="$(wait_job "$MERGE")"
say "merge job $MERGE ended: $result (state, exit code)"
say "the array's tasks:"
squeue -h -r -t all -j "$ARRAY" -o "%i %T %N" | sort | indent
for i in $(seq 0 $((N - 1))); do
  meta="$run1/shards/$i-of-$N/meta.json"
  [ -f "$meta" ] || fail "task $i wrote no $meta"
  grep -q "\"SLURM_ARRAY_TASK_ID\": \"$i\"" "$meta" || fail "$meta lacks SLURM_ARRAY_TASK_ID $i"
  grep -q "\"SLURM_ARRAY_JOB_ID\": \"$ARRAY\"" "$meta" || fail "$meta lacks SLURM_ARRAY_JOB_ID $ARRAY"
  say "shard $i-of-$N: $(wc -l <"$run1/shards/$i-of-$N/results.jsonl") rows, SLURM_ARRAY_JOB_ID $ARRAY, SLURM_ARRAY_TASK_ID $i"
done
say "merge log:"
indent <"$run1/slurm/logs/merge-$MERGE.out"
[ "$result" = "COMPLETED 0:0" ] || fail "the merge job should complete with exit 0, got $result"
rows=$(wc -l <"$run1/results.jsonl")
say "merged rows: $rows; planned points: $planned"
merged_ids "$run1" | diff - "$WORK/plan.ids" >/dev/null || fail "merged ids differ from the plan's"
grep -q '"complete": true' "$run1/meta.json" || fail "meta.json is not marked complete"
say "OK: 4 tasks, merged rows = plan ($rows), every planned id exactly once, \"complete\": true"

# --- 2. a second submission with task 2 cancelled --------------------------------------------------------
run2="$WORK/run2"
say "2. submitting again into $run2, held; cancelling task ${CANCELLED} while it is pending"
submit "$CONFIG" "$N" --out "$run2" -- --hold
scancel "${ARRAY}_$CANCELLED"
scontrol release "$ARRAY"
scontrol release "$MERGE"
result="$(wait_job "$MERGE")"
say "merge job $MERGE ended: $result"
say "the array's tasks (the cancelled pending task leaves no record):"
squeue -h -r -t all -j "$ARRAY" -o "%i %T %N" | sort | indent
say "merge log:"
indent <"$run2/slurm/logs/merge-$MERGE.out"
[ "$result" = "FAILED 1:0" ] || fail "the merge job should fail with exit 1 (points missing), got $result"
[ ! -e "$run2/shards/$CANCELLED-of-$N" ] || fail "the cancelled task left a shard folder"
awk '$1 == "missing:" { print $2 }' "$run2/slurm/logs/merge-$MERGE.out" | sort >"$WORK/missing.ids"
diff "$WORK/missing.ids" "$WORK/shard$CANCELLED.ids" >/dev/null ||
  fail "the merge's missing ids are not shard $CANCELLED's: $(diff "$WORK/missing.ids" "$WORK/shard$CANCELLED.ids")"
grep -q '"complete": false' "$run2/meta.json" || fail "meta.json is not marked incomplete"
rows=$(wc -l <"$run2/results.jsonl")
[ "$rows" -eq $((planned - in_shard)) ] || fail "merged $rows rows, expected $((planned - in_shard))"
say "OK: merge exit 1, missing = exactly shard $CANCELLED/$N's $in_shard points, $rows rows written, \"complete\": false"

# --- 3. only task 2 again ---------------------------------------------------------------------------------
say "3. resubmitting only task $CANCELLED into $run2 (--array $CANCELLED)"
submit "$CONFIG" "$N" --out "$run2" --array "$CANCELLED"
result="$(wait_job "$MERGE")"
say "merge job $MERGE ended: $result"
squeue -h -r -t all -j "$ARRAY" -o "%i %T %N" | sort | indent
say "merge log:"
indent <"$run2/slurm/logs/merge-$MERGE.out"
[ "$result" = "COMPLETED 0:0" ] || fail "the merge job should complete with exit 0, got $result"
rows=$(wc -l <"$run2/results.jsonl")
merged_ids "$run2" | diff - "$WORK/plan.ids" >/dev/null || fail "merged ids differ from the plan's"
grep -q '"complete": true' "$run2/meta.json" || fail "meta.json is not marked complete"
say "OK: merged rows = plan ($rows), every planned id exactly once, \"complete\": true"
