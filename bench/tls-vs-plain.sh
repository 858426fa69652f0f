#!/usr/bin/env bash
# Issue 22's benchmark: what TLS on the client protocol costs. quire-bench
# against an embedded 3-node cluster (`--ioengine=cluster --embedded`, 1 KiB
# appends, 256 in flight per job, numjobs NJ), plain TCP and TLS
# (`--tls`: the daemons serve TLS 1.3 with quire up's certificates)
# alternating in every round. Prints each run, then the medians:
# appends/s, the daemons' CPU per confirmed append (`cpu_us_per_op`,
# summed over the three), quire-bench's own, clat p50; and the median of
# the per-round TLS/plain ratios.
# Usage: bench/tls-vs-plain.sh [rounds] [seconds] [NJ]   (default: 5 5 4)
# Run it alone on the machine (flock it against builds).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
secs=${2:-5}
nj=${3:-4}
cargo build --release --bins >&2
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/quire-tls.XXXXXX")
trap 'rm -rf "$dir"' EXIT

# One run: "iops cpu_us_per_op client_cpu_us_per_op p50_us".
bench() {
  target/release/quire-bench --name=a --ioengine=cluster --embedded "$@" --directory="$dir" \
    --rw=append --bs=1k --iodepth=256 --numjobs="$nj" --group_reporting --runtime="$secs" \
    --time_based --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
w = j["write"]
print("%d %.2f %.2f %d" % (w["iops"], j["cpu_us_per_op"], j["client_cpu_us_per_op"],
      w["clat_ns"]["percentile"]["50.000000"] // 1000))'
}

plain_runs=""
tls_runs=""
for r in $(seq "$rounds"); do
  p=$(bench)
  echo "round $r plain: $p (appends/s, daemon us/op, client us/op, p50 us)"
  t=$(bench --tls)
  echo "round $r tls:   $t"
  plain_runs+="$p"$'\n'
  tls_runs+="$t"$'\n'
done
python3 - "$plain_runs" "$tls_runs" <<'PY'
import statistics, sys
rows = lambda s: [list(map(float, l.split())) for l in s.splitlines() if l.strip()]
plain, tls = rows(sys.argv[1]), rows(sys.argv[2])
med = lambda rs: [statistics.median(c) for c in zip(*rs)]
print("medians of %d: appends/s, daemon us/op, client us/op, p50 us" % len(plain))
print("plain", " ".join("%g" % v for v in med(plain)))
print("tls  ", " ".join("%g" % v for v in med(tls)))
ratios = [[t / p if p else float("nan") for t, p in zip(tr, pr)] for tr, pr in zip(tls, plain)]
print("tls/plain per round, median", " ".join("%.3f" % v for v in med(ratios)))
PY
