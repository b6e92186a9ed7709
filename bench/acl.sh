#!/usr/bin/env bash
# acl.sh measures what a user with Redis's ACL rules costs over a
# password-only user, through one lockproxy with both (auth.users and
# auth.acl), in front of one backend redis-server and three lock nodes:
# redis-benchmark GET and SET with -P 1 and -P 16 (CLIENTS clients), and
# the lock path: LOCK of one resource followed by UNLOCK is not something
# redis-benchmark can pair, so it runs LOCKINFO of one resource (a round
# trip to the lock nodes, the resource checked as a key) and LOCK of
# resources it picks at random among RESOURCES (each taken for 1 s, so
# most are free; the first LOCK of a resource asks Redis, ACL DRYRUN, the
# others find the answer cached). Each round runs both users, alternating
# which goes first; the report gives requests/s and the CPU time of the
# proxy and of the backend per request (the steadier figures on a machine
# shared with other work), per round and as medians.
#
# Environment (defaults in brackets):
#   ROUNDS [5]          interleaved rounds
#   N [100000]          requests per run without pipelining
#   NP [400000]         requests per run with -P 16
#   NL [20000]          requests per lock-path run
#   CLIENTS [50]        redis-benchmark -c
#   RESOURCES [1000]    distinct resources of the LOCK run
#   OUT                 also write the report to this file
set -euo pipefail

ROUNDS=${ROUNDS:-5}
N=${N:-100000}
NP=${NP:-400000}
NL=${NL:-20000}
CLIENTS=${CLIENTS:-50}
RESOURCES=${RESOURCES:-1000}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-acl.XXXXXX)
pids=()

log() { printf 'acl: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

log "building lockproxy"
build_lockproxy "$tmp/lockproxy"

start_redis backend backend_pid
start_redis node1 node1_pid
start_redis node2 node2_pid
start_redis node3 node3_pid
cat >"$tmp/lockproxy.yaml" <<EOF
shutdown_timeout: 5s
lock: {node_timeout: 250ms}
auth:
  users: {plain: pp}
  acl:
    - "user ruled on >pr ~bench:* ~key:* %R~shared:* &* +@read +@write -@dangerous +@connection +@lock"
EOF
freeport proxy
"$tmp/lockproxy" -config "$tmp/lockproxy.yaml" -listen "127.0.0.1:$proxy" -backend "127.0.0.1:$backend" \
	-lock-nodes "127.0.0.1:$node1,127.0.0.1:$node2,127.0.0.1:$node3" -log-level warn >>"$tmp/lockproxy.log" 2>&1 &
proxy_pid=$!
pids+=($proxy_pid)
for _ in $(seq 200); do
	[[ "$(redis-cli -p "$proxy" --user plain --pass pp PING 2>/dev/null)" == PONG ]] && break
	sleep 0.05
done

report_to_out


# run USER PASS N ARGS...: requests/s, then the proxy's and the backend's
# CPU µs per request.
run() {
	local user=$1 pass=$2 n=$3 p0 b0 rps
	shift 3
	p0=$(ticks "$proxy_pid")
	b0=$(ticks "$backend_pid")
	redis-benchmark -p "$proxy" --user "$user" -a "$pass" -c "$CLIENTS" -n "$n" -q "$@" >"$tmp/out" 2>&1 || true
	rps=$(tr '\r' '\n' <"$tmp/out" | awk '/requests per second/ {for (i = 1; i <= NF; i++) if ($(i+1) == "requests") print $i}' | tail -1)
	if [[ -z "$rps" ]]; then
		log "$user $*: $(tr '\r' '\n' <"$tmp/out" | grep -v 'rps=' | grep . | tail -2 | tr '\n' ' ')"
		rps=0
	fi
	awk -v r="$rps" -v n="$n" -v p="$(($(ticks "$proxy_pid") - p0))" -v b="$(($(ticks "$backend_pid") - b0))" -v hz="$hz" \
		'BEGIN {printf "%s %.1f %.1f", r, p * 1e6 / hz / n, b * 1e6 / hz / n}'
}

tests=(
	"GET -P 1|$N|-t get -P 1"
	"GET -P 16|$NP|-t get -P 16"
	"SET -P 1|$N|-t set -P 1"
	"SET -P 16|$NP|-t set -P 16"
	"LOCKINFO|$NL|LOCKINFO bench:info"
	"LOCK, $RESOURCES resources|$NL|-r $RESOURCES LOCK bench:__rand_int__ 1000"
)

echo "#### A user with rules (B) against a password-only user (A), $CLIENTS clients, $ROUNDS rounds" | report
echo | report
echo "| test | round | A req/s | B req/s | B/A | A proxy µs/req | B proxy µs/req | A backend µs/req | B backend µs/req |" | report
echo "|---|---|---|---|---|---|---|---|---|" | report
declare -A ratios cpus_a cpus_b bes_a bes_b
for r in $(seq "$ROUNDS"); do
	for t in "${tests[@]}"; do
		IFS='|' read -r name n args <<<"$t"
		order="a b"
		((r % 2)) || order="b a"
		for side in $order; do
			# shellcheck disable=SC2086
			if [[ $side == a ]]; then read -r rps_a cpu_a be_a <<<"$(run plain pp "$n" $args)"; else read -r rps_b cpu_b be_b <<<"$(run ruled pr "$n" $args)"; fi
		done
		ratio=$(awk -v a="$rps_a" -v b="$rps_b" 'BEGIN {if (a > 0 && b > 0) printf "%.3f", b / a; else print "-"}')
		if [[ $ratio != - ]]; then
			ratios[$name]+="$ratio "
			cpus_a[$name]+="$cpu_a "
			cpus_b[$name]+="$cpu_b "
			bes_a[$name]+="$be_a "
			bes_b[$name]+="$be_b "
		fi
		echo "| $name | $r | $rps_a | $rps_b | $ratio | $cpu_a | $cpu_b | $be_a | $be_b |" | report
	done
done
echo | report
echo "Medians over the rounds where both runs completed:" | report
echo | report
echo "| test | B/A req/s | A proxy µs/req | B proxy µs/req | A backend µs/req | B backend µs/req |" | report
echo "|---|---|---|---|---|---|" | report
for t in "${tests[@]}"; do
	IFS='|' read -r name _ _ <<<"$t"
	echo "| $name | $(median <<<"${ratios[$name]:-}") | $(median <<<"${cpus_a[$name]:-}") | $(median <<<"${cpus_b[$name]:-}") | $(median <<<"${bes_a[$name]:-}") | $(median <<<"${bes_b[$name]:-}") |" | report
done
warn=$(grep -c '"level":"warn"\|WARN' "$tmp/lockproxy.log" || true)
echo | report
echo "lockproxy logged $warn warnings." | report
grep '"level":"warn"\|WARN' "$tmp/lockproxy.log" | sort | uniq -c | sort -rn | head -5 >&2 || true
