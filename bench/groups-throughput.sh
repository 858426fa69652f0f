#!/usr/bin/env bash
# Issue 20, item 6: leaders spread over nodes, measured. quire-bench
# against an embedded 3-node cluster with 1, 2 and 4 groups (group g
# prefers node g % 3 + 1), JOBS jobs in all split evenly over the groups
# (1 KiB appends, 256 in flight per job), the group counts alternating in
# every round. Prints each run, then the medians: aggregate appends/s, the
# daemons' CPU per confirmed append (`cpu_us_per_op`, summed over the
# three), quire-bench's own, the slowest group's clat p50.
# Usage: bench/groups-throughput.sh [rounds] [seconds] [JOBS]
#   (default: 3 5 4; JOBS a multiple of 4)
# Run it alone on the machine (flock it against builds).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-5}
total=${3:-4}
cargo build --release --bins >&2
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/quire-groups.XXXXXX")
trap 'rm -rf "$dir"' EXIT

# One run over G groups: "iops cpu_us_per_op client_cpu_us_per_op p50_us".
bench() {
  local groups=$1 args=()
  for g in $(seq 0 $((groups - 1))); do
    args+=(--name="g$g" --group="$g" --numjobs=$((total / groups)))
  done
  target/release/quire-bench --ioengine=cluster --embedded --directory="$dir" --rw=append \
    --bs=1k --iodepth=256 --group_reporting --runtime="$secs" --time_based \
    --output-format=json "${args[@]}" 2>/dev/null |
    python3 -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
# One report per group (its clones merged); one CPU block for the run.
iops = sum(j["write"]["iops"] for j in jobs)
p50 = max(j["write"]["clat_ns"]["percentile"]["50.000000"] for j in jobs) // 1000
j = jobs[0]
print("%d %.2f %.2f %d" % (iops, j["cpu_us_per_op"], j["client_cpu_us_per_op"], p50))'
}

declare -A runs
for r in $(seq "$rounds"); do
  for g in 1 2 4; do
    out=$(bench "$g")
    echo "round $r groups $g ($total jobs): $out (appends/s, daemon us/op, client us/op, p50 us)"
    runs[$g]+="$out"$'\n'
  done
done
echo "medians of $rounds:"
for g in 1 2 4; do
  printf '%s\n' "${runs[$g]}" | python3 -c '
import statistics, sys
name = sys.argv[1]
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
cols = list(zip(*rows))
print("groups", name, " ".join("%g" % statistics.median(c) for c in cols))' "$g"
done
