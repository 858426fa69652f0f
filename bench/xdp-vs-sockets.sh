#!/usr/bin/env bash
# quire-bench's udp engine over AF_XDP against the socket path, in the
# same run, alternating run by run: both ends in two network namespaces
# joined by a bridge (--net_backend, root only), the same topology for
# both, so the ratio compares the datagram paths and nothing else. For
# each message size and loss rate: messages/s and CPU per message (user +
# system of the whole process, both ends), each run, then medians and the
# median of the per-run ratios (xdp / sockets).
# Usage: bench/xdp-vs-sockets.sh [runs] [seconds] [bs:loss...]
#   (default: 3 4 1k:0 1k:1 64k:0 64k:1)
# Run it alone on the machine (flock it against builds).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
secs=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
if [ $# -gt 0 ]; then cells=("$@"); else cells=(1k:0 1k:1 64k:0 64k:1); fi
[ "$(id -u)" = 0 ] || { echo "needs root: --net_backend makes network namespaces" >&2; exit 2; }
cargo build --release --bin quire-bench >&2
TIMEFORMAT='%U %S'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One run: "messages_per_s cpu_s ops".
one() {
  local backend=$1 bs=$2 loss=$3 cpu
  cpu=$( { time target/release/quire-bench --name=udp --ioengine=udp --bs="$bs" --iodepth=64 \
             --net_backend="$backend" --loss="$loss" --runtime="$secs" --time_based \
             --output-format=json >"$tmp/out.json" ; } 2>&1 )
  python3 -c '
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(w["iops"], sys.argv[2], w["total_ios"])' "$tmp/out.json" "$(awk '{print $1 + $2}' <<<"$cpu")"
}

for cell in "${cells[@]}"; do
  bs=${cell%%:*}
  loss=${cell#*:}
  rows=()
  for i in $(seq "$runs"); do
    read -r xi xc xo < <(one xdp "$bs" "$loss")
    read -r si sc so < <(one sockets "$bs" "$loss")
    python3 -c '
import sys
xi, xc, xo, si, sc, so, run = map(float, sys.argv[1:8])
print(f"bs {sys.argv[8]} loss {sys.argv[9]}% run {run:.0f}: xdp {xi:.0f} msg/s {xc/xo*1e6:.2f} us/msg; "
      f"sockets {si:.0f} msg/s {sc/so*1e6:.2f} us/msg; ratio {xi/si:.2f}")' \
      "$xi" "$xc" "$xo" "$si" "$sc" "$so" "$i" "$bs" "$loss"
    rows+=("$xi $xc $xo $si $sc $so")
  done
  printf '%s\n' "${rows[@]}" | python3 -c '
import sys, statistics as s
rows = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
xi = s.median(r[0] for r in rows); si = s.median(r[3] for r in rows)
xc = s.median(r[1] / r[2] * 1e6 for r in rows); sc = s.median(r[4] / r[5] * 1e6 for r in rows)
ratio = s.median(r[0] / r[3] for r in rows)
cpu_ratio = s.median((r[1] / r[2]) / (r[4] / r[5]) for r in rows)
print(f"bs {sys.argv[1]} loss {sys.argv[2]}%, median of {len(rows)}: xdp {xi:.0f} msg/s {xc:.2f} us/msg, "
      f"sockets {si:.0f} msg/s {sc:.2f} us/msg; median ratio xdp/sockets: {ratio:.2f} msg/s, "
      f"{cpu_ratio:.2f} CPU per msg")' "$bs" "$loss"
done
