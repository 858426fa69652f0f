#!/usr/bin/env bash
# quire-bench's udp engine against iperf3 -u on loopback, in the same run,
# alternating run by run, for each MTU given: quire at --udp_mtu=M with
# 64 KiB messages, iperf3 with datagrams of the size quire puts on the
# wire (M - 48 bytes of IP/UDP header, rounded down to 100 for 9000:
# -l 8900 is what issue 19 asks about; -l 1452 for 1500). Both sides of
# both tools run on the two cores (iperf3 pinned -A 0 / -A 1, quire's two
# threads left to the scheduler). Prints each run, then medians and the
# median of the per-run ratios, and the CPU each spends per 64 KiB
# delivered (user + system of the whole process, both ends).
# A cell MTU:LEN pairs quire at --udp_mtu=MTU with iperf3 -l LEN (issue 19
# asks for the default MTU 1500 against -l 8900: `1500:8900`).
# BASELINE=PATH also runs another quire-bench binary (the tree before a
# change) in every run, right after this one, and prints its figures too.
# Usage: bench/udp-vs-iperf3.sh [runs] [seconds] [cell...]
#   (default: 3 4 1500:8900 9000 1500)
# Run it alone on the machine (flock it against builds): a compile in
# parallel takes a core from one tool and not the other.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
secs=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
if [ $# -gt 0 ]; then mtus=("$@"); else mtus=(1500:8900 9000 1500); fi
baseline=${BASELINE:-}
command -v iperf3 >/dev/null || { echo "iperf3 is missing: apt-get install -y iperf3" >&2; exit 2; }
cargo build --release --bin quire-bench >&2
port=$(( 5201 + $$ % 1000 ))
TIMEFORMAT='%U %S'

# One iperf3 run: "goodput_bytes_per_s cpu_s" (cpu of server and client).
iperf3_run() {
  local len=$1 out cpu
  cpu=$( { time (
      # iperf3 can hang in its UDP setup (a server waiting for a client
      # that gave up): each end has a time limit, as in transport_bench.
      timeout $(( secs + 10 )) iperf3 -s -1 -p "$port" -A 1 >/dev/null 2>&1 &
      server=$!
      # The server needs a moment to listen: retry while refused (bounded).
      for _ in $(seq 50); do
        if timeout $(( secs + 10 )) iperf3 -c 127.0.0.1 -p "$port" -u -b 0 -l "$len" -t "$secs" -A 0 -J >"$tmp/iperf3.json" 2>/dev/null; then
          break
        fi
        sleep 0.05
      done
      wait "$server" || true
    ) ; } 2>&1 )
  out=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/8)' "$tmp/iperf3.json")
  echo "$out $(awk '{print $1 + $2}' <<<"$cpu")"
}

# One quire-bench run: "goodput_bytes_per_s cpu_s ops".
quire_run() {
  local mtu=$1 bin=${2:-target/release/quire-bench} cpu
  cpu=$( { time "$bin" --name=udp --ioengine=udp --bs=64k --iodepth=64 \
             --udp_mtu="$mtu" --runtime="$secs" --time_based --output-format=json >"$tmp/quire.json" ; } 2>&1 )
  python3 -c '
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(w["bw_bytes"], sys.argv[2], w["total_ios"])' "$tmp/quire.json" "$(awk '{print $1 + $2}' <<<"$cpu")"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for cell in "${mtus[@]}"; do
  mtu=${cell%%:*}
  len=$(( mtu - 48 ))
  [ "$mtu" -lt 9000 ] || len=$(( len / 100 * 100 ))
  [ "$cell" = "$mtu" ] || len=${cell#*:}
  rows=()
  brows=()
  for i in $(seq "$runs"); do
    read -r ib icpu < <(iperf3_run "$len")
    read -r qb qcpu qops < <(quire_run "$mtu")
    if [ -n "$baseline" ]; then
      read -r bb bcpu bops < <(quire_run "$mtu" "$baseline")
      python3 -c '
import sys
i, q, qcpu, ops, run = map(float, sys.argv[1:])
print(f"  baseline run {run:.0f}: {q/(1<<20):.0f} MiB/s, ratio {q/i:.2f}, CPU per 64 KiB {qcpu/ops*1e6:.0f} us")' "$ib" "$bb" "$bcpu" "$bops" "$i"
      brows+=("$ib $bb $icpu $bcpu $bops")
    fi
    python3 -c '
import sys
i, icpu, q, qcpu, ops, secs, mtu, ln, run = map(float, sys.argv[1:])
mib = 1 << 20
print(f"mtu {mtu:.0f} run {run:.0f}: iperf3 -l {ln:.0f} {i/mib:.0f} MiB/s, quire-bench {q/mib:.0f} MiB/s, "
      f"ratio {q/i:.2f}; CPU per 64 KiB delivered: iperf3 {icpu/(i*secs/65536)*1e6:.0f} us, "
      f"quire {qcpu/ops*1e6:.0f} us")' "$ib" "$icpu" "$qb" "$qcpu" "$qops" "$secs" "$mtu" "$len" "$i"
    rows+=("$ib $qb $icpu $qcpu $qops")
  done
  printf '%s\n' "${rows[@]}" | python3 -c '
import sys, statistics as s
secs, mtu, ln = map(float, sys.argv[1:4])
rows = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
mib = 1 << 20
i = s.median(r[0] for r in rows); q = s.median(r[1] for r in rows)
ratio = s.median(r[1] / r[0] for r in rows)
icpu = s.median(r[2] / (r[0] * secs / 65536) * 1e6 for r in rows)
qcpu = s.median(r[3] / r[4] * 1e6 for r in rows)
print(f"mtu {mtu:.0f}, median of {len(rows)}: iperf3 -l {ln:.0f} {i/mib:.0f} MiB/s, quire-bench {q/mib:.0f} MiB/s, "
      f"median ratio {ratio:.2f}; CPU per 64 KiB: iperf3 {icpu:.0f} us, quire {qcpu:.0f} us")' "$secs" "$mtu" "$len" ""
  if [ -n "$baseline" ]; then
    printf '%s\n' "${brows[@]}" | python3 -c '
import sys, statistics as s
secs, mtu, ln = map(float, sys.argv[1:4])
rows = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
mib = 1 << 20
q = s.median(r[1] for r in rows)
ratio = s.median(r[1] / r[0] for r in rows)
qcpu = s.median(r[3] / r[4] * 1e6 for r in rows)
print(f"baseline mtu {mtu:.0f}, median of {len(rows)}: quire-bench {q/mib:.0f} MiB/s, "
      f"median ratio to iperf3 -l {ln:.0f} {ratio:.2f}; CPU per 64 KiB {qcpu:.0f} us")' "$secs" "$mtu" "$len"
  fi
done
