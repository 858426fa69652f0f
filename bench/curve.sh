#!/usr/bin/env bash
# The latency/CPU curve a user sizes a deployment with (bench/README.md,
# "Light load"): quire-bench against an embedded 3-node cluster, 1 KiB
# appends at iodepth 1, 4, 16, 64, 256 (numjobs 1) and 256 x NJ, plain
# and TLS, each cell once per round, cells alternated; fio's fdatasync
# p50 on the same disk in every round. Prints each run, then a Markdown
# table of medians: appends/s, clat p50 and p99, the daemons' CPU per
# confirmed append (summed over the three), and p50 / fio's p50.
# Usage: bench/curve.sh [rounds] [seconds] [NJ]   (default: 3 5 4)
# Run it alone on the machine (flock it against builds).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-5}
nj=${3:-4}
command -v fio >/dev/null || { echo "fio is missing: apt-get install -y fio" >&2; exit 2; }
cargo build --release --bins >&2
exe=target/release/quire-bench
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/quire-curve.XXXXXX")
trap 'rm -rf "$dir"' EXIT
. bench/lib.sh

cells=()
for tls in plain tls; do
  for d in 1 4 16 64 256; do cells+=("$tls:$d:1"); done
  cells+=("$tls:256:$nj")
done
declare -A runs
for r in $(seq "$rounds"); do
  f=$(fio_p50 1)
  echo "round $r fio psync fdatasync p50: $f us"
  runs[fio]+="$f"$'\n'
  for c in "${cells[@]}"; do
    IFS=: read -r tls depth jobs <<<"$c"
    extra=()
    [ "$tls" = tls ] && extra=(--tls)
    out=$(bench_cluster "$exe" "$depth" "$jobs" "${extra[@]}")
    echo "round $r $tls iodepth $depth numjobs $jobs: $out (appends/s, daemons' us/op, client us/op, p50 us, p99 us)"
    runs[$c]+="$out"$'\n'
  done
done
read -r _ fio_med <<<"$(printf '%s' "${runs[fio]}" | median_cols fio)"
echo
echo "medians of $rounds rounds; fio psync 4 KiB fdatasync p50 $fio_med us"
echo
echo "| client | numjobs x iodepth | appends/s | clat p50 | clat p99 | daemons' CPU per append | p50 / fio fdatasync p50 |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for c in "${cells[@]}"; do
  IFS=: read -r tls depth jobs <<<"$c"
  read -r _ iops cpu _ p50 p99 <<<"$(printf '%s' "${runs[$c]}" | median_cols x)"
  python3 -c 'import sys
tls, jobs, depth, iops, p50, p99, cpu, fio = sys.argv[1:]
print("| %s | %s x %s | %s | %s us | %s us | %s us | %.1fx |" % (tls, jobs, depth,
      format(round(float(iops)), ","), p50, p99, cpu, float(p50) / float(fio)))' \
    "$tls" "$jobs" "$depth" "$iops" "$p50" "$p99" "$cpu" "$fio_med"
done
