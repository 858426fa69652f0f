# Shared by the cluster benchmark scripts (sourced, not run): one
# quire-bench run against an embedded cluster, and fio's fdatasync
# latency on the same disk. The caller sets `dir` (a scratch directory
# on the disk under test) and `secs` (seconds a run).

# One quire-bench cluster append run:
#   bench_cluster EXE IODEPTH NUMJOBS [more quire-bench options]
# prints "appends/s daemon_cpu_us_per_op client_cpu_us_per_op p50_us p99_us".
bench_cluster() {
  local exe=$1 depth=$2 jobs=$3
  shift 3
  "$exe" --name=a --ioengine=cluster --embedded --directory="$dir" --rw=append --bs=1k \
    --iodepth="$depth" --numjobs="$jobs" --group_reporting --runtime="$secs" --time_based \
    --output-format=json "$@" 2>/dev/null |
    python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
w = j["write"]
p = w["clat_ns"]["percentile"]
print("%d %.2f %.2f %d %d" % (w["iops"], j["cpu_us_per_op"], j["client_cpu_us_per_op"],
      p["50.000000"] // 1000, p["99.000000"] // 1000))'
}

# fio's p50 of a 4 KiB write + fdatasync (psync), in µs, with $1 jobs at
# once (3: as the three replicas of a local cluster fsync one disk), for
# $2 seconds (default: secs).
fio_p50() {
  fio --name=lat --directory="$dir" --ioengine=psync --rw=write --bs=4k --fdatasync=1 \
    --size=64m --runtime="${2:-$secs}" --time_based --numjobs="${1:-1}" --group_reporting \
    --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
print(j["sync"]["lat_ns"]["percentile"]["50.000000"] // 1000)'
  rm -f "$dir"/lat.*
}

# Medians of whitespace-separated columns on stdin, one row a run:
#   median_cols NAME  prints "NAME m1 m2 ...".
median_cols() {
  python3 -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
print(sys.argv[1], " ".join("%g" % statistics.median(c) for c in zip(*rows)))' "$1"
}
