#!/usr/bin/env bash
# bench/cluster.sh: lockproxy in front of a 3-master Redis Cluster next to
# lockproxy in front of one Redis, in one run.
#
#   bash bench/cluster.sh
#
# redis-benchmark -c 50 -P 16 -t set,get -r 100000 against four targets, in
# interleaved rounds: one redis-server directly (direct), the same through
# lockproxy (lockproxy→redis), a cluster of 3 masters (no replicas) directly
# with redis-benchmark --cluster (direct cluster), and the same cluster
# through lockproxy with backend.cluster (lockproxy→cluster). One markdown
# table per test: median requests/s, min–max, and the ratio to
# lockproxy→redis.
#
# Everything listens on 127.0.0.1 on free ports; every process started here
# is stopped on exit. The report goes to stdout (and to $OUT when set);
# progress goes to stderr.
#
# Environment (defaults in brackets):
#   ROUNDS [3]     interleaved rounds
#   NP [500000]    requests per redis-benchmark test
#   CLIENTS [50]   redis-benchmark -c
#   PIPELINE [16]  redis-benchmark -P
#   OUT            also write the report to this file
set -euo pipefail

ROUNDS=${ROUNDS:-3}
NP=${NP:-500000}
CLIENTS=${CLIENTS:-50}
PIPELINE=${PIPELINE:-16}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-cluster-bench.XXXXXX)
pids=()

log() { printf 'bench: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

for bin in redis-server redis-cli redis-benchmark go; do
	command -v "$bin" >/dev/null 2>&1 || {
		log "$bin is not on PATH (redis-server, redis-tools and Go are needed)"
		exit 1
	}
done

log "building lockproxy"
(cd "$root" && go build -o "$tmp/lockproxy" .)

# start_redis VAR [ARGS...]: start a redis-server, set VAR to its port.
start_redis() {
	local var=$1 port dir
	shift
	freeport port 20000 12000 bus # a cluster node also takes port+10000
	dir="$tmp/redis-$port"
	mkdir -p "$dir"
	redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
		--daemonize no --protected-mode no --logfile "$dir/redis.log" "$@" &
	pids+=($!)
	waitping "$port" redis-server
	printf -v "$var" '%s' "$port"
}

# start_proxy VAR CONFIG [FLAGS...]: start lockproxy, set VAR to its port.
start_proxy() {
	local var=$1 cfg=$2 port
	shift 2
	freeport port
	"$tmp/lockproxy" -config "$tmp/$cfg" -listen "127.0.0.1:$port" -lock-nodes "$lock_nodes" \
		-log-level warn "$@" >>"$tmp/lockproxy.log" 2>&1 &
	pids+=($!)
	waitping "$port" lockproxy || { tail -5 "$tmp/lockproxy.log" >&2; return 1; }
	printf -v "$var" '%s' "$port"
}

start_redis single
start_redis node1
start_redis node2
start_redis node3
lock_nodes="127.0.0.1:$node1,127.0.0.1:$node2,127.0.0.1:$node3"
cluster=()
for i in 1 2 3; do
	start_redis "c$i" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
	v="c$i"
	cluster+=("127.0.0.1:${!v}")
done
log "creating the cluster ${cluster[*]}"
redis-cli --cluster create "${cluster[@]}" --cluster-replicas 0 --cluster-yes >"$tmp/create.log" 2>&1 || {
	tail -5 "$tmp/create.log" >&2
	exit 1
}
for _ in $(seq 400); do
	ok=0
	for a in "${cluster[@]}"; do
		redis-cli -h 127.0.0.1 -p "${a##*:}" CLUSTER INFO 2>/dev/null | grep -q '^cluster_state:ok' && ok=$((ok + 1))
	done
	((ok == 3)) && break
	sleep 0.05
done
((ok == 3)) || {
	log "the cluster did not reach cluster_state:ok"
	exit 1
}

cat >"$tmp/single.yaml" <<EOF2
shutdown_timeout: 5s
EOF2
seeds=$(
	IFS=,
	echo "${cluster[*]}"
)
cat >"$tmp/cluster.yaml" <<EOF2
shutdown_timeout: 5s
backend:
  addr: ""
  cluster: [$seeds]
EOF2
start_proxy proxy_single single.yaml -backend "127.0.0.1:$single"
start_proxy proxy_cluster cluster.yaml
log "redis :$single, cluster ${cluster[*]}, lockproxy→redis :$proxy_single, lockproxy→cluster :$proxy_cluster"

targets=(direct lockproxy→redis "direct cluster" lockproxy→cluster)
declare -A port_of=([direct]=$single [lockproxy→redis]=$proxy_single ["direct cluster"]=$c1 [lockproxy→cluster]=$proxy_cluster)
declare -A extra_of=(["direct cluster"]=--cluster)

bench() { # TARGET N: redis-benchmark's CSV rows
	# shellcheck disable=SC2086
	redis-benchmark -h 127.0.0.1 -p "${port_of[$1]}" ${extra_of[$1]:-} -c "$CLIENTS" -P "$PIPELINE" \
		-t set,get -r 100000 -n "$2" --csv
}

log "warm-up"
for t in "${targets[@]}"; do
	bench "$t" 100000 >/dev/null
done
rows="$tmp/rows.tsv"
: >"$rows"
for ((r = 1; r <= ROUNDS; r++)); do
	for t in "${targets[@]}"; do
		log "round $r/$ROUNDS: $t"
		bench "$t" "$NP" | awk -F'"' -v t="$t" 'NR > 1 && $2 != "" {printf "%s\t%s\t%s\n", t, $2, $4}' >>"$rows"
	done
done

# median FILE: the median of the numbers in FILE, one a line.
median() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

report="$tmp/report.md"
{
	echo "### lockproxy in front of a Redis Cluster, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr)." \
		"lockproxy $(git -C "$root" describe --always --dirty 2>/dev/null || echo '(no git)'), $(redis-server --version | awk '{print $1, $2, $3}'), $(go version | awk '{print $3}')."
	echo
	echo "redis-benchmark -c $CLIENTS -P $PIPELINE -t set,get -r 100000 -n $NP, $ROUNDS interleaved rounds; a cluster of 3 masters without replicas."
	for test in SET GET; do
		echo
		echo "| $test | median req/s | min–max | ratio to lockproxy→redis |"
		echo "|---|---:|---:|---:|"
		awk -F'\t' -v t="lockproxy→redis" -v x="$test" '$1 == t && $2 == x {print $3}' "$rows" >"$tmp/base"
		base=$(median "$tmp/base")
		for t in "${targets[@]}"; do
			awk -F'\t' -v t="$t" -v x="$test" '$1 == t && $2 == x {print $3}' "$rows" >"$tmp/v"
			m=$(median "$tmp/v")
			lo=$(sort -g "$tmp/v" | head -1)
			hi=$(sort -g "$tmp/v" | tail -1)
			awk -v t="$t" -v m="$m" -v lo="$lo" -v hi="$hi" -v b="$base" \
				'BEGIN {printf "| %s | %.0f | %.0f–%.0f | %.2fx |\n", t, m, lo, hi, m / b}'
		done
	done
	echo
	echo "lockproxy warnings logged: $(grep -c -i 'warn' "$tmp/lockproxy.log" || true)"
} >"$report"
cat "$report"
if [[ -n "${OUT:-}" ]]; then
	cp "$report" "$OUT"
fi
