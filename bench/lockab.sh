#!/usr/bin/env bash
# lockab.sh is the interleaved A/B of the lock path: a lockproxy built from
# BASE (A) against one built from the working tree (B), each with its own
# lock.key_prefix on the same three lock-node redis-servers, and redsync
# beside each in every run. A round runs, for each side in turn (the first
# side alternating from round to round), lockbench's contended scenario
# (8 clients, one resource, 1 ms holds, LOCK ... WAIT against redsync's
# default loop) and its uncontended one with 1 and with 50 clients, each
# with the CPU of the proxy and the nodes per operation and the nodes'
# commands per operation (INFO commandstats, -node-stats): the counts do
# not depend on the machine's load, the rates do.
#
# Environment (defaults in brackets):
#   BASE [eb83e5f]      the revision to compare the working tree with
#   ROUNDS [3]          interleaved rounds
#   DURATION [2s]       one lockbench run (contended and uncontended alike)
#   ONLY                "contended" or "uncontended": that part alone
#   NODE_TIMEOUT        both proxies' lock.node_timeout (default: theirs,
#                       50ms); on a machine so loaded that a proxy misses it
#                       on every node at once, an UNLOCK fails with
#                       NOQUORUM and its lock stays until its ttl, which
#                       stalls a contended run: give it more there
#   OUT                 also write the report to this file
# lockbench's own reports go to stderr as it runs; the report on stdout is
# one table per scenario, one row per round and side.
set -euo pipefail

BASE=${BASE:-eb83e5f}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-2s}
ONLY=${ONLY:-}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-lockab.XXXXXX)
pids=()

log() { printf 'lockab: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

log "building lockproxy (working tree and $BASE) and lockbench"
build_lockproxy "$tmp/lockproxy-b"
(cd "$root/bench" && go build -o "$tmp/lockbench" ./lockbench)
build_lockproxy "$tmp/lockproxy-a" "$BASE"

# start_proxy SIDE VAR PIDVAR: lockproxy-SIDE with key prefix "SIDE:".
start_proxy() {
	local port
	freeport port
	printf 'shutdown_timeout: 5s\nlock:\n  key_prefix: "%s:"\n' "$1" >"$tmp/$1.yaml"
	[[ -z "${NODE_TIMEOUT:-}" ]] || printf '  node_timeout: %s\n' "$NODE_TIMEOUT" >>"$tmp/$1.yaml"
	lockproxy_server "$tmp/lockproxy-$1" "$port" "$tmp/lockproxy-$1.log" -config "$tmp/$1.yaml" \
		-backend "127.0.0.1:$backend" -lock-nodes "$lock_nodes"
	printf -v "$3" '%s' "$lockproxy_pid"
	printf -v "$2" '%s' "$port"
}

start_redis backend backend_pid
start_redis node1 node1_pid
start_redis node2 node2_pid
start_redis node3 node3_pid
lock_nodes="127.0.0.1:$node1,127.0.0.1:$node2,127.0.0.1:$node3"
node_pids="$node1_pid,$node2_pid,$node3_pid"
start_proxy a proxy_a pid_a
start_proxy b proxy_b pid_b

report_to_out

# bench SIDE ARGS...: one lockbench round against SIDE's proxy; its
# markdown report on stdout.
bench() {
	local side=$1 port pid
	shift
	if [[ $side == a ]]; then port=$proxy_a pid=$pid_a; else port=$proxy_b pid=$pid_b; fi
	"$tmp/lockbench" -proxy "127.0.0.1:$port" -proxy-pid "$pid" -nodes "$lock_nodes" -node-pids "$node_pids" \
		-node-stats -rounds 1 -duration "$DURATION" -contended-duration "$DURATION" -warmup 200ms "$@"
}

# cellof REPORT ROW [COLUMN]: the value in column COLUMN (default 2: the
# proxy's) of the table row that starts with ROW.
cellof() {
	awk -F'|' -v row="$2" -v col="${3:-2}" 'index($0, "| " row) == 1 {v = $(col + 1); gsub(/^ +| +$/, "", v); print v; exit}' <<<"$1"
}

# The scenarios: name, lockbench arguments.
scenarios=()
[[ $ONLY == uncontended ]] || scenarios+=("contended|-only contended")
[[ $ONLY == contended ]] || scenarios+=("uncontended, 1 client|-only uncontended -clients 1" "uncontended, 50 clients|-only uncontended -clients 50")

declare -A rows
for r in $(seq "$ROUNDS"); do
	order="a b"
	((r % 2)) || order="b a"
	for s in "${scenarios[@]}"; do
		name=${s%%|*} args=${s#*|}
		for side in $order; do
			log "round $r, $name, side $side"
			# shellcheck disable=SC2086 # args are words
			rep=$(bench "$side" $args)
			if [[ $name == contended ]]; then
				row="| $r | $side | $(cellof "$rep" "acquisitions/s") | $(cellof "$rep" "acquisitions/s" 3) | $(cellof "$rep" "acquisitions/s" 4) | $(cellof "$rep" "wait p99") | $(cellof "$rep" "handoff gap p50") | $(cellof "$rep" "handoff gap mean") | $(cellof "$rep" "hold mean") | $(cellof "$rep" "fairness") | $(cellof "$rep" "overlapping") | $(cellof "$rep" "CPU µs per operation: lockproxy") | $(cellof "$rep" "CPU µs per operation: the lock nodes") | $(cellof "$rep" "node commands per operation") | $(cellof "$rep" "of those, script calls") | $(cellof "$rep" "nodes' own usec") |"
			else
				row="| $r | $side | $(cellof "$rep" "pairs/s") | $(cellof "$rep" "pairs/s" 3) | $(cellof "$rep" "pairs/s" 4) | $(cellof "$rep" "pair latency p50") | $(cellof "$rep" "CPU µs per operation: lockproxy") | $(cellof "$rep" "CPU µs per operation: the lock nodes") | $(cellof "$rep" "node commands per operation") | $(cellof "$rep" "of those, script calls") | $(cellof "$rep" "nodes' own usec") |"
			fi
			rows[$name]+="$row"$'\n'
		done
	done
done

load=$(cut -d' ' -f1-3 /proc/loadavg)
{
	echo "#### Lock path A/B: $BASE (a) against the working tree (b), $ROUNDS interleaved rounds × $DURATION, lock.node_timeout ${NODE_TIMEOUT:-50ms}, load average at the end $load"
	for s in "${scenarios[@]}"; do
		name=${s%%|*}
		echo
		echo "$name:"
		echo
		if [[ $name == contended ]]; then
			echo "| round | side | proxy acq/s | redsync acq/s | proxy/redsync | wait p99 ms | gap p50 ms | gap mean ms | hold mean ms | fairness | overlaps | proxy CPU µs/acq | nodes CPU µs/acq | node commands/acq | script calls/acq | nodes' usec/acq |"
			echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
		else
			echo "| round | side | proxy pairs/s | redsync pairs/s | proxy/redsync | pair p50 ms | proxy CPU µs/pair | nodes CPU µs/pair | node commands/pair | script calls/pair | nodes' usec/pair |"
			echo "|---|---|---|---|---|---|---|---|---|---|---|"
		fi
		printf '%s' "${rows[$name]}"
	done
	echo
	echo "lockproxy warnings: a $(grep -c . "$tmp/lockproxy-a.log" || true), b $(grep -c . "$tmp/lockproxy-b.log" || true)"
	# The first few of each side's, cut short: a warning is a node timeout,
	# a clock verdict or a loss, which explains a slow round.
	for side in a b; do
		grep . "$tmp/lockproxy-$side.log" | head -3 | cut -c1-240 | sed "s/^/    $side: /" || true
	done
} | report
