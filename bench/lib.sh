# Shared by the cluster benchmark scripts (sourced, not run): one
# quire-bench run against an embedded cluster, and fio's fdatasync
# latency on the same disk. The caller sets `dir` (a scratch directory
# on the disk under test) and `secs` (seconds a run). A run that fails
# prints its error output and fails the function (bash ignores `set -e`
# inside `$(...)`: callers check the status).

# Prints the JSON file $1 through the python program $2; on a failure,
# the tool's error output ($3) and status.
_bench_report() {
  local json=$1 program=$2 err=$3
  if ! python3 -c "$program" <"$json"; then
    echo "bench: no result; its error output:" >&2
    cat "$err" >&2
    return 1
  fi
}

# One quire-bench cluster append run:
#   bench_cluster EXE IODEPTH NUMJOBS [more quire-bench options]
# prints "appends/s daemon_cpu_us_per_op client_cpu_us_per_op p50_us p99_us".
bench_cluster() {
  local exe=$1 depth=$2 jobs=$3
  shift 3
  "$exe" --name=a --ioengine=cluster --embedded --directory="$dir" --rw=append --bs=1k \
    --iodepth="$depth" --numjobs="$jobs" --group_reporting --runtime="$secs" --time_based \
    --output-format=json "$@" >"$dir/bench.json" 2>"$dir/bench.err" || true
  _bench_report "$dir/bench.json" '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
w = j["write"]
p = w["clat_ns"]["percentile"]
print("%d %.2f %.2f %d %d" % (w["iops"], j["cpu_us_per_op"], j["client_cpu_us_per_op"],
      p["50.000000"] // 1000, p["99.000000"] // 1000))' "$dir/bench.err"
}

# One quire-bench cluster run of any workload:
#   bench_cluster_rw RW EXE IODEPTH NUMJOBS [more quire-bench options]
# prints "ops/s daemon_cpu_us_per_op client_cpu_us_per_op p50_us p99_us"
# (a consume's operation is one message consumed and its ack confirmed;
# an error count above 0 fails it: a run that ran dry is no rate).
bench_cluster_rw() {
  local rw=$1 exe=$2 depth=$3 jobs=$4
  shift 4
  "$exe" --name=a --ioengine=cluster --embedded --directory="$dir" --rw="$rw" --bs=1k \
    --iodepth="$depth" --numjobs="$jobs" --group_reporting --runtime="$secs" --time_based \
    --output-format=json "$@" >"$dir/bench.json" 2>"$dir/bench.err" || true
  _bench_report "$dir/bench.json" '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
w = j["read"] if j["read"]["iops"] > 0 else j["write"]
if j["total_err"]:
    sys.exit("bench: %d errors: %s" % (j["total_err"], j.get("error_message")))
p = w["clat_ns"]["percentile"]
print("%d %.2f %.2f %d %d" % (w["iops"], j["cpu_us_per_op"], j["client_cpu_us_per_op"],
      p["50.000000"] // 1000, p["99.000000"] // 1000))' "$dir/bench.err"
}

# fio's p50 of a 4 KiB write + fdatasync (psync), in µs, with $1 jobs at
# once (3: as the three replicas of a local cluster fsync one disk), for
# $2 seconds (default: secs).
fio_p50() {
  fio --name=lat --directory="$dir" --ioengine=psync --rw=write --bs=4k --fdatasync=1 \
    --size=64m --runtime="${2:-$secs}" --time_based --numjobs="${1:-1}" --group_reporting \
    --output-format=json >"$dir/fio.json" 2>"$dir/fio.err" || true
  rm -f "$dir"/lat.*
  _bench_report "$dir/fio.json" '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
print(j["sync"]["lat_ns"]["percentile"]["50.000000"] // 1000)' "$dir/fio.err"
}

# Medians of whitespace-separated columns on stdin, one row a run:
#   median_cols NAME  prints "NAME m1 m2 ...".
median_cols() {
  python3 -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
print(sys.argv[1], " ".join("%g" % statistics.median(c) for c in zip(*rows)))' "$1"
}
