#!/usr/bin/env bash
# The storage path against fio on the same disk, in the same run.
# quire appends 1 KiB records with 256 outstanding through the engine
# operators run, `quire-bench --ioengine=wal` at its default settings;
# fio then writes sequentially with --fdatasync=1 and --bs set to the
# bytes quire put behind each fdatasync, so both pay for the same bytes
# per flush, and the ratio compares quire's bytes on disk per second
# (`disk_bytes_per_s`: headers and padding included, as fio's --bs) with
# fio's. Both write into space already written once: quire into segments
# it lays out before timing (and recycles), fio into a file it lays out
# fully before timing (--overwrite=1); fio's default fallocate layout
# would make every fdatasync also commit unwritten-extent conversions.
# Usage: bench/wal-vs-fio.sh [DIR on the disk under test] [runs] [seconds]
# Environment: FIO_IODEPTH (default 1). ENGINE=wal_bench runs
# examples/wal_bench instead, with BACKEND (auto|io_uring|portable) and
# FLUSH_BYTES_MAX (quire's flush_bytes_max; default 1 MiB), the knobs
# quire-bench does not have.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-$PWD/target/bench-disk}
runs=${2:-5}
secs=${3:-10}
backend=${BACKEND:-auto}
flush_max=${FLUSH_BYTES_MAX:-1048576}
iodepth=${FIO_IODEPTH:-1}
command -v fio >/dev/null || { echo "fio is missing: apt-get install fio" >&2; exit 2; }
mkdir -p "$dir"
engine=${ENGINE:-quire-bench}
if [ "$engine" = wal_bench ]; then
  cargo build --release --example wal_bench >&2
else
  cargo build --release --bin quire-bench >&2
fi
results=()
for i in $(seq "$runs"); do
  if [ "$engine" = wal_bench ]; then
    out=$(target/release/examples/wal_bench "$dir/wal" 1024 256 "$secs" "$backend" "$flush_max" 2>/dev/null)
    bpf=$(sed -n 's/^BYTES_PER_FLUSH=//p' <<<"$out")
    q=$(sed -n 's/^DISK_MBPS=//p' <<<"$out")
  else
    json=$(target/release/quire-bench --name=wal --ioengine=wal --directory="$dir/wal" --rw=append \
      --bs=1k --iodepth=256 --runtime="$secs" --time_based --output-format=json 2>/dev/null)
    read -r bpf q iops <<<"$(python3 -c '
import json, sys
j = json.loads(sys.argv[1])["jobs"][0]
f = j["fsync"][0]
print(f["bytes_per_flush"], f["disk_bytes_per_s"] / 1e6, j["write"]["iops"])' "$json")"
    out="quire-bench --ioengine=wal: $iops appends/s, $q MB/s on disk"$'\n'"bytes per fdatasync: $bpf"
  fi
  bs=$(( (bpf + 4095) / 4096 * 4096 ))
  f=$(fio --name=wal --directory="$dir" --ioengine=io_uring --rw=write --bs="$bs" --iodepth="$iodepth" \
        --fdatasync=1 --direct=1 --overwrite=1 --size=1g --runtime="$secs" --time_based \
        --output-format=json | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/1e6)')
  rm -rf "$dir/wal" "$dir"/wal.*.*
  echo "run $i: $(head -1 <<<"$out")"
  echo "run $i: $(sed -n 2p <<<"$out")"
  echo "run $i: fio --bs=$bs --iodepth=$iodepth --fdatasync=1: $f MB/s; quire/fio = $(python3 -c "print(f'{$q/$f:.3f}')")"
  results+=("$q $f")
done
printf '%s\n' "${results[@]}" | python3 -c '
import sys, statistics as s
rows=[tuple(map(float,l.split())) for l in sys.stdin if l.strip()]
q=s.median(r[0] for r in rows); f=s.median(r[1] for r in rows)
r=s.median(r[0]/r[1] for r in rows)
print(f"median of {len(rows)} runs: quire {q:.1f} MB/s, fio {f:.1f} MB/s, median ratio quire/fio {r:.3f}")'
