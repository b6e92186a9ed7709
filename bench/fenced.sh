#!/usr/bin/env bash
# fenced.sh measures FENCED against the plain command through one lockproxy
# on one redis-server backend (and one lock node, unused by these commands):
# redis-benchmark's requests per second and p50/p99 latency of SET and GET,
# plain and as FENCED resource fence SET/GET, with one command per round
# trip (-P 1) and pipelines of 16 (-P 16), CLIENTS clients, interleaved
# over ROUNDS rounds so that a machine shared with other work slows both
# alike.
#
# Environment (defaults in brackets):
#   ROUNDS [3]          interleaved rounds
#   REQUESTS [20000]    requests of one redis-benchmark run
#   CLIENTS [1]         redis-benchmark -c
#   OUT                 also write the report to this file
set -euo pipefail

ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-20000}
CLIENTS=${CLIENTS:-1}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-fenced.XXXXXX)
pids=()

log() { printf 'fenced: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

log "building lockproxy"
build_lockproxy "$tmp/lockproxy"

start_redis backend
start_redis node
freeport proxy
echo "shutdown_timeout: 5s" >"$tmp/lockproxy.yaml"
lockproxy_server "$tmp/lockproxy" "$proxy" "$tmp/lockproxy.log" -config "$tmp/lockproxy.yaml" \
	-backend "127.0.0.1:$backend" -lock-nodes "127.0.0.1:$node" -set metrics.listen=
redis-cli -p "$proxy" SET bench:key xxx >/dev/null

report_to_out

# run P CMD...: one redis-benchmark run; prints "rps p50 p99".
run() {
	local p=$1
	shift
	redis-benchmark -h 127.0.0.1 -p "$proxy" -n "$REQUESTS" -c "$CLIENTS" -P "$p" --csv "$@" 2>/dev/null |
		awk -F, 'NR == 2 {for (i = 1; i <= NF; i++) gsub(/"/, "", $i); print $2, $5, $7}'
}

echo "#### FENCED against the plain command: $CLIENTS client(s), $REQUESTS requests per run, median of $ROUNDS interleaved rounds" | report
echo | report
echo "| command | pipeline | plain req/s | FENCED req/s | FENCED/plain | plain p50 ms | FENCED p50 ms | plain p99 ms | FENCED p99 ms |" | report
echo "|---|---|---|---|---|---|---|---|---|" | report
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for p in 1 16; do
	for cmd in SET GET; do
		args=(SET bench:key xxx)
		[[ $cmd == GET ]] && args=(GET bench:key)
		: >"$tmp/plain" && : >"$tmp/fenced"
		for r in $(seq "$ROUNDS"); do
			if ((r % 2)); then
				run "$p" "${args[@]}" >>"$tmp/plain"
				run "$p" FENCED bench:r 1 "${args[@]}" >>"$tmp/fenced"
			else
				run "$p" FENCED bench:r 1 "${args[@]}" >>"$tmp/fenced"
				run "$p" "${args[@]}" >>"$tmp/plain"
			fi
		done
		col() { awk -v c="$2" '{print $c}' "$1" | median; }
		pr=$(col "$tmp/plain" 1) fr=$(col "$tmp/fenced" 1)
		ratio=$(awk -v a="$pr" -v b="$fr" 'BEGIN {printf "%.2f", b / a}')
		echo "| $cmd | $p | $pr | $fr | $ratio | $(col "$tmp/plain" 2) | $(col "$tmp/fenced" 2) | $(col "$tmp/plain" 3) | $(col "$tmp/fenced" 3) |" | report
	done
done
