#!/usr/bin/env bash
# Leader churn under load and whole-host pauses: two local clusters (two
# builds of quire, A and B) side by side under one load: CPU hogs, fsync
# writers and, every EVERY_S seconds, a SIGSTOP of all six daemons for
# PAUSE_MS (what a paused VM does). Prints each cluster's terms before and
# after. Writes only under a temp dir in /tmp; stops everything it started.
# usage: bench/stall_churn.sh BIN_A BIN_B SECONDS BUSY DD EVERY_S PAUSE_MS OUT
#   BIN_A, BIN_B: directories holding a quire binary (target/debug of two
#   checkouts); e.g. bench/stall_churn.sh ../old/target/debug target/debug
#   300 8 2 20 300 churn.txt
set -u
bin_a=$1; bin_b=$2; secs=$3; busy=$4; ddn=$5; every=$6; pause_ms=$7; out=$8
root=$(mktemp -d /tmp/quire-churn.XXXX)
declare -A upd
for v in old new; do
  bin=$bin_a; [ $v = new ] && bin=$bin_b
  $bin/quire up --dir $root/$v > $root/$v.log 2>&1 &
  upd[$v]=$!
done
for v in old new; do for i in $(seq 1 300); do grep -q "try:" $root/$v.log && break; sleep 0.2; done; done
term() { # dir -> terms of the 3 nodes
  for a in $(grep -ho 'admin_listen = "[^"]*"' $1/node*/node.toml | sed 's/.*"\(.*\)"/\1/'); do
    curl -s -m 2 http://$a/status | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["groups"][0]["term"], end=" ")' 2>/dev/null || echo -n "? "
  done
}
s_old=$(term $root/old); s_new=$(term $root/new)
pids=()
for k in $(seq 1 $busy); do ( while :; do :; done ) & pids+=($!); done
for k in $(seq 1 $ddn); do ( while :; do dd if=/dev/zero of=$root/big$k bs=1M count=1024 conv=fsync status=none; rm -f $root/big$k; done ) & pids+=($!); done
pauses=0
end=$((SECONDS + secs))
while [ $SECONDS -lt $end ]; do
  sleep $every
  if [ "$pause_ms" -gt 0 ]; then
    d=$(pgrep -f "quire daemon --config $root/" | tr '\n' ' ')
    kill -STOP $d; sleep $(python3 -c "print($pause_ms/1000)"); kill -CONT $d
    pauses=$((pauses+1))
  fi
done
for p in "${pids[@]}"; do kill $p 2>/dev/null; done
e_old=$(term $root/old); e_new=$(term $root/new)
{
echo "== $(date +%T) secs=$secs busy=$busy dd=$ddn pause=${pause_ms}ms every ${every}s x$pauses"
echo "A: start [$s_old] end [$e_old]  stall lines: $(grep -h 'stalled' $root/old/node*/quired.log | wc -l)"
echo "B: start [$s_new] end [$e_new]  stall lines: $(grep -h 'stalled' $root/new/node*/quired.log | wc -l)"
} | tee -a $out
for v in old new; do kill -INT ${upd[$v]}; done; wait
rm -rf "$root"
