#!/usr/bin/env bash
# Queues and ledgers against the raw log (issue 52): every workload at
# iodepth 1, 16 and 256 on a local 3-node cluster of real daemons
# (--embedded), rounds alternated so the host's drift falls on all alike,
# and the medians. Then the acceptance's ratios, in the same run: queue
# produce and consume + ack against appends at iodepth 256, ledger adds
# against appends at numjobs 4 x iodepth 256 (one ledger per job).
# Usage: bench/queue-vs-append.sh [rounds] [seconds a run]   (default: 3 4)
# Environment: QUIRE_BENCH (default target/release/quire-bench);
# BEFORE=path/quire-bench adds rows for another build (append, produce
# and consume only, as a build before `rw=ledger` has no ledger rows).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-4}
exe=${QUIRE_BENCH:-target/release/quire-bench}
[ -x "$exe" ] || { echo "$exe is missing: cargo build --release --bins" >&2; exit 2; }
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/quire-queues.XXXXXX")
trap 'rm -rf "$dir"' EXIT
. bench/lib.sh

rows="$dir/rows"
: >"$rows"
run() { # label rw exe depth jobs [more quire-bench options]
  local r label=$1
  shift
  if r=$(bench_cluster_rw "$@"); then
    echo "$label $r" >>"$rows"
    echo "  $label: $r"
  else
    echo "  $label: failed" >&2
  fi
}
for round in $(seq "$rounds"); do
  echo "round $round (ops/s, daemons' us/op, client us/op, p50 us, p99 us)"
  for depth in 1 16 256; do
    for rw in append produce consume ledger; do
      # A consume job is given a count, filled exactly: it can never
      # run dry, and it ends early if it is faster than the fill rate.
      more=()
      [ "$rw" = consume ] && more=(--time_based=0 --number_ios=$((secs * 100000)))
      run "$rw@$depth" "$rw" "$exe" "$depth" 1 "${more[@]}"
      if [ -n "${BEFORE:-}" ] && [ "$rw" != ledger ]; then
        # A build before issue 52 fills a consume job's queue with
        # 20,000 messages whatever its runtime: it stops there.
        extra=()
        [ "$rw" = consume ] && extra=(--time_based=0 --number_ios=20000)
        run "before:$rw@$depth" "$rw" "$BEFORE" "$depth" 1 "${extra[@]}"
      fi
    done
  done
  run "append@4x256" append "$exe" 256 4
  run "ledger@4x256" ledger "$exe" 256 4
done
python3 - "$rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, *cols = line.split()
    rows.setdefault(label, []).append(list(map(float, cols)))
med = {k: [statistics.median(c) for c in zip(*v)] for k, v in rows.items()}
print("\n| workload | ops/s | daemons' CPU/op (us) | client CPU/op (us) | p50 (us) | p99 (us) | rounds |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for k in rows:
    m = med[k]
    print("| %s | %d | %.1f | %.1f | %d | %d | %d |" % (k, m[0], m[1], m[2], m[3], m[4], len(rows[k])))
def ratio(a, b):
    # Per round (the two ran minutes apart in the same round), then the
    # median of those: the host's drift between rounds cancels out.
    if a in rows and b in rows:
        rs = [x[0] / y[0] for x, y in zip(rows[a], rows[b])]
        print("%s / %s: %.2fx (median of rounds %s)"
              % (a, b, statistics.median(rs), " ".join("%.2f" % r for r in rs)))
print()
ratio("produce@256", "append@256")
ratio("consume@256", "append@256")
ratio("ledger@4x256", "append@4x256")
PY
