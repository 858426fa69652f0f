#!/usr/bin/env bash
# What a change of leader costs a client, measured from outside (issue 54):
# a `quire up` cluster, `quire append` in a loop (a new process per
# record, as a shell script would), and per trial one of
#
#   isolate   nftables drops UDP between the leader's replication port and
#             both followers' (its NIC dead; host and serial cables alive):
#             it steps down by check-quorum, a follower is elected;
#   transfer  `quire leader` hands the leadership to another voter.
#
# Each trial reports the time from the cut (or the transfer's request) to
# the first append asked after it and confirmed (isolate), or to the
# first append asked after the transfer's answer and confirmed, and the
# longest any append waited in the trial (transfer). Between trials the
# cut heals and the cluster settles (the preferred leader takes the
# group back). At the end every confirmed record is read back: each once.
#
#   bench/leader-change.sh [isolate|transfer] [TRIALS (20)]
#
# Needs root (nftables) and release binaries (QUIRE, default
# target/release/quire). Network: loopback only.
set -euo pipefail
mode=${1:-isolate}
trials=${2:-20}
quire=${QUIRE:-target/release/quire}
case $mode in isolate | transfer) ;; *)
  echo "usage: $0 [isolate|transfer] [TRIALS]" >&2
  exit 2
  ;;
esac
[[ -x $quire ]] || { echo "$quire: build it first (cargo build --release)" >&2; exit 2; }
command -v nft >/dev/null || { echo "nft is not installed" >&2; exit 2; }
work=$(mktemp -d)
table="quire_leader_change_$$"
up_pid=
loop_pid=
cleanup() {
  [[ -n $loop_pid ]] && kill "$loop_pid" 2>/dev/null || true
  nft delete table inet "$table" 2>/dev/null || true
  [[ -n $up_pid ]] && kill -INT "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

now_ns() { date +%s%N; }

"$quire" up --dir "$work/up" >"$work/up.out" 2>&1 &
up_pid=$!
for _ in $(seq 600); do
  grep -q "Ctrl-C stops" "$work/up.out" && break
  kill -0 "$up_pid" 2>/dev/null || { cat "$work/up.out" >&2; exit 1; }
  sleep 0.1 # waiting for a process we do not control
done
addrs=$(grep -o -- '--addr [^ ]*' "$work/up.out" | head -1 | cut -d' ' -f2)
mapfile -t admins < <(grep -oE '^node [0-9]+: client [^,]+, admin http://[0-9.:]+' "$work/up.out" | sed 's|.*http://||')
client=(--addr "$addrs" --token-file "$work/up/client.token" --ca "$work/up/ca.pem")
# Node $1's replication port (group 0: its [udp] base_port).
udp_port() { sed -n 's/^base_port = \([0-9]*\)/\1/p' "$work/up/node$1/node.toml"; }

# The leader of group 0 as node $1 sees it (0: none), or nothing.
view() {
  curl -s --max-time 0.5 "http://${admins[$1 - 1]}/status" |
    jq -r '.groups[0].leader // 0' 2>/dev/null || true
}
# Waits until every node names the same leader for 3 s in a row (the
# appends go on, so commit indexes never stand still); prints it.
settled() {
  local since=0 last=
  for _ in $(seq 600); do
    local a b c
    a=$(view 1) b=$(view 2) c=$(view 3)
    if [[ -n $a && $a != 0 && $a == "$b" && $a == "$c" ]]; then
      [[ $a == "$last" ]] || { last=$a; since=$(now_ns); }
      if (($(now_ns) - since > 3000000000)); then
        echo "$a"
        return
      fi
    else
      last=
    fi
    sleep 0.1 # polling the cluster's status from outside
  done
  echo "the cluster did not settle" >&2
  return 1
}

# The append loop: "START_NS END_NS ok|fail RECORD" per append.
(
  i=0
  while :; do
    i=$((i + 1))
    s=$(now_ns)
    if "$quire" append "${client[@]}" "rec-$i" >/dev/null 2>>"$work/append.err"; then r=ok; else r=fail; fi
    echo "$s $(now_ns) $r rec-$i"
  done
) >"$work/appends.log" &
loop_pid=$!

# Prints the end of the first confirmed append asked at or after $1 (ns),
# waiting for it (30 s at most).
first_ok_after() {
  for _ in $(seq 3000); do
    local e
    e=$(awk -v t="$1" '$1 >= t && $3 == "ok" { print $2; exit }' "$work/appends.log")
    [[ -n $e ]] && { echo "$e"; return; }
    sleep 0.01 # the loop's log is written by another process
  done
  echo "no append confirmed within 30 s" >&2
  return 1
}

results=()
for trial in $(seq "$trials"); do
  leader=$(settled)
  others=()
  for n in 1 2 3; do [[ $n == "$leader" ]] || others+=("$n"); done
  if [[ $mode == isolate ]]; then
    lp=$(udp_port "$leader")
    {
      echo "table inet $table {"
      echo "  chain input { type filter hook input priority -10; policy accept;"
      for o in "${others[@]}"; do
        op=$(udp_port "$o")
        echo "    ip saddr 127.0.0.0/8 udp sport $lp udp dport $op drop"
        echo "    ip saddr 127.0.0.0/8 udp sport $op udp dport $lp drop"
      done
      echo "  }"
      echo "}"
    } | nft -f -
    t0=$(now_ns)
    end=$(first_ok_after "$t0")
    ms=$(((end - t0) / 1000000))
    nft delete table inet "$table"
    results+=("$ms")
    echo "trial $trial: leader $leader isolated: first confirmed append after $ms ms"
  else
    to=${others[0]}
    t0=$(now_ns)
    "$quire" leader --admin "${admins[$leader - 1]}" --admin-token-file "$work/up/admin.token" --to "$to" >/dev/null
    t1=$(now_ns)
    end=$(first_ok_after "$t1")
    ms=$(((end - t0) / 1000000))
    longest=$(awk -v a="$t0" -v b="$end" '$2 >= a && $1 <= b { d = $2 - $1; if (d > m) m = d } END { printf "%d", m / 1000000 }' "$work/appends.log")
    results+=("$ms")
    echo "trial $trial: leader $leader to $to: first confirmed append after the answer $ms ms after the request; longest append $longest ms"
  fi
done
kill "$loop_pid" 2>/dev/null || true
wait "$loop_pid" 2>/dev/null || true
loop_pid=

printf '%s\n' "${results[@]}" | sort -n | awk -v mode="$mode" '
  { v[NR] = $1 }
  END {
    p50 = v[int((NR + 1) / 2)]; i99 = int(NR * 0.99 + 0.999); if (i99 < 1) i99 = 1
    printf "%s: n=%d p50=%d ms p99=%d ms max=%d ms\n", mode, NR, p50, v[i99], v[NR]
  }'

# Every confirmed record read back, once.
settled >/dev/null
from=1
: >"$work/read.txt"
while :; do
  "$quire" read "${client[@]}" --from "$from" --max 4096 --json >"$work/page.json"
  [[ -s $work/page.json ]] || break
  cat "$work/page.json" >>"$work/read.txt"
  from=$(($(tail -1 "$work/page.json" | jq -r .index) + 1))
done
confirmed=$(awk '$3 == "ok" { print $4 }' "$work/appends.log" | sort)
read_back=$(jq -r .data "$work/read.txt" | grep '^rec-' | sort)
twice=$(uniq -d <<<"$read_back" | grep -c . || true)
missing=$(comm -23 <(echo "$confirmed") <(uniq <<<"$read_back") | grep -c . || true)
echo "read back: $(grep -c . <<<"$confirmed") confirmed appends, $missing missing, $twice records twice"
[[ $missing == 0 && $twice == 0 ]]
