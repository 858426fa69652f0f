#!/usr/bin/env bash
# The whole path, issue 20's acceptance: quire-bench against an embedded
# 3-node cluster (`--ioengine=cluster --embedded`, 1 KiB appends, 256 in
# flight per job) at numjobs 1 and NJ, at iodepth 1, and fio's fdatasync
# latency on the same disk (one job, and three at once as the three
# replicas' fsyncs meet on a local cluster's one disk), alternating in
# every round. Prints each run,
# then the medians: appends/s, the daemons' CPU per confirmed append
# (`cpu_us_per_op`, summed over the three), quire-bench's own, clat p50.
# BASELINE=DIR also runs DIR/quire-bench (with its daemons beside it: a
# tree before a change) at numjobs 1 and NJ and iodepth 1 in every round.
# Usage: bench/cluster-throughput.sh [rounds] [seconds] [NJ]
#   (default: 3 5 4)
# Run it alone on the machine (flock it against builds).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-5}
nj=${3:-4}
baseline=${BASELINE:-}
command -v fio >/dev/null || { echo "fio is missing: apt-get install -y fio" >&2; exit 2; }
cargo build --release --bins >&2
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/quire-throughput.XXXXXX")
trap 'rm -rf "$dir"' EXIT

. bench/lib.sh

cells=("this:256:1" "this:256:$nj" "this:1:1")
[ -n "$baseline" ] && cells+=("base:256:1" "base:256:$nj" "base:1:1")
declare -A runs
for r in $(seq "$rounds"); do
  for c in "${cells[@]}"; do
    IFS=: read -r who depth jobs <<<"$c"
    exe=target/release/quire-bench
    [ "$who" = base ] && exe="$baseline/quire-bench"
    out=$(bench_cluster "$exe" "$depth" "$jobs")
    echo "round $r $who depth $depth numjobs $jobs: $out (appends/s, daemon us/op, client us/op, p50 us, p99 us)"
    runs[$c]+="$out"$'\n'
  done
  f=$(fio_p50 1)
  echo "round $r fio psync fdatasync p50: $f us"
  runs[fio]+="$f"$'\n'
  f3=$(fio_p50 3)
  echo "round $r fio psync fdatasync p50, 3 jobs at once: $f3 us"
  runs[fio3]+="$f3"$'\n'
done
echo "medians of $rounds:"
for c in "${cells[@]}" fio fio3; do
  printf '%s\n' "${runs[$c]}" | median_cols "$c"
done
