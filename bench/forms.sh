#!/usr/bin/env bash
# forms.sh measures the lock forms against a plain LOCK through one
# lockproxy on three lock-node redis-servers: lockbench -only forms (LOCK,
# MLOCK of 1, 3 and 10 resources; one client and CLIENTS clients; pairs/s
# and the CPU of the proxy and the nodes per pair). With BASE set to a git
# revision it first runs the plain LOCK/UNLOCK scenario (lockbench -only
# plain: pairs/s, and the CPU of the proxy and of the nodes per pair)
# against a lockproxy built from BASE and one built from the working tree,
# interleaved, on the same nodes: the A/B of the plain path. The nodes' CPU
# per pair is the steadier figure on a machine shared with other work.
#
# Environment (defaults in brackets):
#   ROUNDS [3]          interleaved rounds
#   DURATION [2s]       one lockbench run
#   CLIENTS [50]        clients of the many-clients runs
#   BASE                a revision to A/B the plain LOCK path against
#   AB_ONLY             with BASE: stop after the A/B
#   OUT                 also write the report to this file
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-2s}
CLIENTS=${CLIENTS:-50}
BASE=${BASE:-}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-forms.XXXXXX)
pids=()

log() { printf 'forms: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

log "building lockproxy and lockbench"
build_lockproxy "$tmp/lockproxy"
(cd "$root/bench" && go build -o "$tmp/lockbench" ./lockbench)
if [[ -n "$BASE" ]]; then
	build_lockproxy "$tmp/lockproxy-base" "$BASE"
fi

# start_proxy BINARY VAR PIDVAR
start_proxy() {
	local port
	freeport port
	lockproxy_server "$1" "$port" "$tmp/lockproxy.log" -config "$tmp/lockproxy.yaml" -backend "127.0.0.1:$backend" \
		-lock-nodes "$lock_nodes"
	printf -v "$3" '%s' "$lockproxy_pid"
	printf -v "$2" '%s' "$port"
}

# Defaults only (both revisions read the same file).
echo "shutdown_timeout: 5s" >"$tmp/lockproxy.yaml"
start_redis backend backend_pid
start_redis node1 node1_pid
start_redis node2 node2_pid
start_redis node3 node3_pid
lock_nodes="127.0.0.1:$node1,127.0.0.1:$node2,127.0.0.1:$node3"
node_pids="$node1_pid,$node2_pid,$node3_pid"
start_proxy "$tmp/lockproxy" proxy proxy_pid

report_to_out

bench() {
	"$tmp/lockbench" -nodes "$lock_nodes" -rounds 1 -duration "$DURATION" -clients "$CLIENTS" \
		-warmup 0 -node-pids "$node_pids" "$@"
}

if [[ -n "$BASE" ]]; then
	start_proxy "$tmp/lockproxy-base" base base_pid
	log "A/B of the plain LOCK path: $BASE against the working tree, $ROUNDS rounds"
	echo "#### Plain LOCK/UNLOCK, $CLIENTS clients: $BASE (A) against the working tree (B), interleaved" | report
	echo | report
	echo "| round | A pairs/s | B pairs/s | B/A | A proxy µs/pair | B proxy µs/pair | A nodes µs/pair | B nodes µs/pair | B/A nodes |" | report
	echo "|---|---|---|---|---|---|---|---|---|" | report
	for r in $(seq "$ROUNDS"); do
		order="a b"
		((r % 2)) || order="b a" # alternate which side runs first
		for side in $order; do
			if [[ $side == a ]]; then p=$base pid=$base_pid; else p=$proxy pid=$proxy_pid; fi
			# -only plain: the proxy's LOCK+UNLOCK alone, with its and the
			# nodes' CPU per pair.
			row=$(bench -proxy "127.0.0.1:$p" -proxy-pid "$pid" -only plain 2>/dev/null | awk -F'|' '
				/^\| pairs\/s/ {gsub(/ /, "", $3); rate = $3}
				/^\| CPU µs per pair: lockproxy/ {gsub(/ /, "", $3); proxy = $3}
				/^\| CPU µs per pair: the lock nodes/ {gsub(/ /, "", $3); nodes = $3}
				END {print rate, proxy, nodes}')
			read -r "rate_$side" "proxy_$side" "nodes_$side" <<<"$row"
		done
		ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b / a}'; }
		echo "| $r | $rate_a | $rate_b | $(ratio "$rate_a" "$rate_b") | $proxy_a | $proxy_b | $nodes_a | $nodes_b | $(ratio "$nodes_a" "$nodes_b") |" | report
	done
	echo | report
	[[ -z "${AB_ONLY:-}" ]] || exit 0
fi

log "lock forms, $ROUNDS rounds"
"$tmp/lockbench" -proxy "127.0.0.1:$proxy" -nodes "$lock_nodes" -rounds "$ROUNDS" -duration "$DURATION" \
	-clients "$CLIENTS" -proxy-pid "$proxy_pid" -node-pids "$node_pids" -only forms | report
