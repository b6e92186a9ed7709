#!/usr/bin/env bash
# bench/cluster.sh: lockproxy in front of a 3-master Redis Cluster next to
# lockproxy in front of one Redis, in one run.
#
#   bash bench/cluster.sh
#
# redis-benchmark -c 50 -r 100000 -t set, then -t get, without pipelining
# (-P 1) and with -P 16, against four targets, in interleaved rounds: one
# redis-server directly (direct), the same through lockproxy
# (lockproxy→redis), a cluster of 3 masters (no replicas) directly with
# redis-benchmark --cluster (direct cluster), and the same cluster through
# lockproxy with backend.cluster (lockproxy→cluster). One markdown table per
# test and pipeline depth: median requests/s, min–max, the ratio to
# lockproxy→redis, redis-benchmark's p50 and p99 latency, the CPU µs per
# command of the target's own processes (the proxy; the redis-server or the
# three masters when direct), and the most client connections any master
# held during the run (INFO clients, less the one that asks). Then where
# the CPU goes: redis-benchmark's, the proxy's and the answering Redis
# processes' CPU per command, how busy the machine was, and the ceiling the
# masters' own cost leaves lockproxy→cluster's ratio.
#
# Then the idle cost: bench/idleconns opens IDLE_CONNS clients to a fresh
# lockproxy→redis and a fresh lockproxy→cluster, each sending one PING and
# staying idle; its VmRSS table for each, and the most connections a
# master held meanwhile.
#
# Everything listens on 127.0.0.1 on free ports; every process started here
# is stopped on exit. The report goes to stdout (and to $OUT when set);
# progress goes to stderr.
#
# Environment (defaults in brackets):
#   ROUNDS [3]         interleaved rounds
#   N [100000]         requests per redis-benchmark test with -P 1
#   NP [500000]        requests per redis-benchmark test with -P 16
#   CLIENTS [50]       redis-benchmark -c
#   PIPELINES [1 16]   the -P values measured
#   IDLE_CONNS [10000] idle clients for the memory measurement; 0 skips it
#   ONE_MASTER         when set, two more targets: a cluster of one master
#                      serving every slot, directly and through lockproxy
#                      (what routing costs without the split over masters)
#   OUT                also write the report to this file
set -euo pipefail

ROUNDS=${ROUNDS:-3}
N=${N:-100000}
NP=${NP:-500000}
CLIENTS=${CLIENTS:-50}
PIPELINES=${PIPELINES:-1 16}
IDLE_CONNS=${IDLE_CONNS:-10000}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-cluster-bench.XXXXXX)
pids=()

log() { printf 'bench: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

require "redis-server, redis-tools and Go" redis-server redis-cli redis-benchmark go

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "building lockproxy and idleconns"
build_lockproxy "$tmp/lockproxy"
(cd "$root/bench" && go build -o "$tmp/idleconns" ./idleconns)
declare -A pid_of # port -> process id

# start_redis VAR [ARGS...]: start a redis-server, set VAR to its port.
start_redis() {
	local var=$1 port
	shift
	# A cluster node also takes port+10000: below 32768, where the kernel
	# picks no client ports, so that no connection takes it meanwhile.
	freeport port 20000 2700 bus
	redis_server "$port" "$@"
	pid_of[$port]=$redis_pid
	printf -v "$var" '%s' "$port"
}

# start_proxy VAR CONFIG [FLAGS...]: start lockproxy, set VAR to its port.
start_proxy() {
	local var=$1 cfg=$2 port
	shift 2
	freeport port
	lockproxy_server "$tmp/lockproxy" "$port" "$tmp/lockproxy.log" -config "$tmp/$cfg" -lock-nodes "$lock_nodes" "$@"
	pid_of[$port]=$lockproxy_pid
	printf -v "$var" '%s' "$port"
}

start_redis single
start_redis node1
start_redis node2
start_redis node3
lock_nodes="127.0.0.1:$node1,127.0.0.1:$node2,127.0.0.1:$node3"
start_cluster_nodes

cat >"$tmp/single.yaml" <<EOF2
shutdown_timeout: 5s
limits:
  max_clients: 20000
EOF2
seeds=$(
	IFS=,
	echo "${cluster[*]}"
)
cat >"$tmp/cluster.yaml" <<EOF2
shutdown_timeout: 5s
limits:
  max_clients: 20000
backend:
  addr: ""
  cluster: [$seeds]
EOF2
start_proxy proxy_single single.yaml -backend "127.0.0.1:$single"
start_proxy proxy_cluster cluster.yaml
if [[ -n "${ONE_MASTER:-}" ]]; then
	start_redis one --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
	redis-cli -h 127.0.0.1 -p "$one" CLUSTER ADDSLOTSRANGE 0 16383 >/dev/null
	for _ in $(seq 400); do
		redis-cli -h 127.0.0.1 -p "$one" CLUSTER INFO | grep -q '^cluster_state:ok' && break
		sleep 0.05
	done
	sed "s/cluster: \[.*\]/cluster: [127.0.0.1:$one]/" "$tmp/cluster.yaml" >"$tmp/one.yaml"
	start_proxy proxy_one one.yaml
	log "one-master cluster :$one, lockproxy→1-master cluster :$proxy_one"
fi
log "redis :$single, cluster ${cluster[*]}, lockproxy→redis :$proxy_single, lockproxy→cluster :$proxy_cluster"

targets=(direct lockproxy→redis "direct cluster" lockproxy→cluster)
declare -A port_of=([direct]=$single [lockproxy→redis]=$proxy_single ["direct cluster"]=$c1 [lockproxy→cluster]=$proxy_cluster)
declare -A extra_of=(["direct cluster"]=--cluster)
# The processes whose CPU a target costs: its own (the proxy, or the Redis
# answering directly), and the Redis processes that answer (the backend).
declare -A cpu_of=([direct]="${pid_of[$single]}" [lockproxy→redis]="${pid_of[$proxy_single]}"
	["direct cluster"]="${pid_of[$c1]} ${pid_of[$c2]} ${pid_of[$c3]}" [lockproxy→cluster]="${pid_of[$proxy_cluster]}")
declare -A redis_of=([direct]="${pid_of[$single]}" [lockproxy→redis]="${pid_of[$single]}"
	["direct cluster"]="${pid_of[$c1]} ${pid_of[$c2]} ${pid_of[$c3]}" [lockproxy→cluster]="${pid_of[$c1]} ${pid_of[$c2]} ${pid_of[$c3]}")
masters=("$c1" "$c2" "$c3")
if [[ -n "${ONE_MASTER:-}" ]]; then
	targets+=("direct 1-master cluster" "lockproxy→1-master cluster")
	port_of["direct 1-master cluster"]=$one
	port_of["lockproxy→1-master cluster"]=$proxy_one
	cpu_of["direct 1-master cluster"]=${pid_of[$one]}
	cpu_of["lockproxy→1-master cluster"]=${pid_of[$proxy_one]}
	redis_of["direct 1-master cluster"]=${pid_of[$one]}
	redis_of["lockproxy→1-master cluster"]=${pid_of[$one]}
fi

# sample_conns FILE: until killed, append the largest connected_clients of
# the masters (less this connection) to FILE every 0.2 s.
sample_conns() {
	local port most n
	while :; do
		most=0
		for port in "${masters[@]}"; do
			n=$(redis-cli -h 127.0.0.1 -p "$port" INFO clients 2>/dev/null | tr -d '\r' | awk -F: '$1 == "connected_clients" {print $2 - 1}')
			((${n:-0} > most)) && most=$n
		done
		echo "$most" >>"$1"
		sleep 0.2
	done
}

# bench TARGET TEST P N: one redis-benchmark run; appends a row to $rows:
# target, test, P, rps, p50, p99, CPU µs/cmd of the target's own processes,
# most connections on a master, then CPU µs/cmd of redis-benchmark, of the
# proxy (0 when direct) and of the Redis processes that answer, and the
# share of the machine's CPUs busy during the run (%).
bench() {
	local t=$1 test=$2 P=$3 n=$4 before after rbefore rafter busy0 total0 busy1 total1 csv sampler conns="$tmp/conns"
	: >"$conns"
	sample_conns "$conns" &
	sampler=$!
	# shellcheck disable=SC2086
	before=$(ticks ${cpu_of[$t]})
	# shellcheck disable=SC2086
	rbefore=$(ticks ${redis_of[$t]})
	read -r busy0 total0 < <(machineticks)
	# The subshell's children's times are redis-benchmark's.
	# shellcheck disable=SC2086
	csv=$(
		redis-benchmark -h 127.0.0.1 -p "${port_of[$t]}" ${extra_of[$t]:-} -c "$CLIENTS" -P "$P" \
			-t "$test" -r 100000 -n "$n" --csv
		times >"$tmp/times"
	)
	# shellcheck disable=SC2086
	after=$(ticks ${cpu_of[$t]})
	# shellcheck disable=SC2086
	rafter=$(ticks ${redis_of[$t]})
	read -r busy1 total1 < <(machineticks)
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	[[ -n "${rows:-}" ]] || return 0
	# times: "0m0.001s 0m0.002s" for the shell, then the same for its children.
	local bench_s proxy_ticks=0
	bench_s=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, k, /[ms]/); print u[1] * 60 + u[2] + k[1] * 60 + k[2] }' "$tmp/times")
	if [[ $t == lockproxy* ]]; then proxy_ticks=$((after - before)); fi
	awk -F'"' -v t="$t" -v P="$P" -v n="$n" -v dt="$((after - before))" -v hz="$hz" -v c="$(sort -g "$conns" | tail -1)" \
		-v bs="$bench_s" -v pt="$proxy_ticks" -v rt="$((rafter - rbefore))" -v b="$((busy1 - busy0))" -v tt="$((total1 - total0))" \
		'NR > 1 && ($2 == "SET" || $2 == "GET") {printf "%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%.2f\t%.2f\t%.2f\t%.0f\n", t, $2, P, $4, $10, $14, dt / hz * 1e6 / n, c, bs * 1e6 / n, pt / hz * 1e6 / n, rt / hz * 1e6 / n, (tt > 0 ? 100 * b / tt : 0)}' <<<"$csv" >>"$rows"
}

log "warm-up"
for t in "${targets[@]}"; do
	for test in set get; do
		bench "$t" "$test" 16 100000
	done
done
rows="$tmp/rows.tsv"
: >"$rows"
for ((r = 1; r <= ROUNDS; r++)); do
	for P in $PIPELINES; do
		n=$N
		((P > 1)) && n=$NP
		for t in "${targets[@]}"; do
			log "round $r/$ROUNDS: -P $P $t"
			for test in set get; do
				bench "$t" "$test" "$P" "$n"
			done
		done
	done
done

# median FILE: the median of the numbers in FILE, one a line.
median() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# col TARGET TEST P COLUMN: the median of COLUMN (4: rps ... 8: conns).
col() {
	awk -F'\t' -v t="$1" -v x="$2" -v P="$3" -v k="$4" '$1 == t && $2 == x && $3 == P {print $k}' "$rows" >"$tmp/v"
	median "$tmp/v"
}

report="$tmp/report.md"
{
	echo "### lockproxy in front of a Redis Cluster, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr)." \
		"lockproxy $(git -C "$root" describe --always --dirty 2>/dev/null || echo '(no git)'), $(redis-server --version | awk '{print $1, $2, $3}'), $(go version | awk '{print $3}')."
	echo
	echo "redis-benchmark -c $CLIENTS -r 100000 -n $N (-P 1) or $NP (-P 16), one test a run; $ROUNDS interleaved rounds; a cluster of 3 masters without replicas. Medians over rounds."
	for P in $PIPELINES; do
		for test in SET GET; do
			echo
			echo "| $test -P $P | req/s | min–max | ratio to lockproxy→redis | p50 ms | p99 ms | CPU µs/cmd | conns per master |"
			echo "|---|---:|---:|---:|---:|---:|---:|---:|"
			base=$(col lockproxy→redis "$test" "$P" 4)
			for t in "${targets[@]}"; do
				m=$(col "$t" "$test" "$P" 4)
				lo=$(sort -g "$tmp/v" | head -1)
				hi=$(sort -g "$tmp/v" | tail -1)
				conns="–"
				[[ "$t" == *cluster && "$t" != *1-master* ]] && conns=$(col "$t" "$test" "$P" 8)
				awk -v t="$t" -v m="$m" -v lo="$lo" -v hi="$hi" -v b="$base" -v p50="$(col "$t" "$test" "$P" 5)" \
					-v p99="$(col "$t" "$test" "$P" 6)" -v cpu="$(col "$t" "$test" "$P" 7)" -v c="$conns" \
					'BEGIN {printf "| %s | %.0f | %.0f–%.0f | %.2fx | %s | %s | %s | %s |\n", t, m, lo, hi, m / b, p50, p99, cpu, c}'
			done
		done
	done
	echo
	echo "Where the CPU goes, µs per command (medians over rounds): redis-benchmark (its times, from bash's times builtin),"
	echo "the proxy, the Redis processes that answer (the one redis-server, or the three masters together), all three;"
	echo "CPUs used is what those three used together (requests/s × all three), machine busy the share of all $(nproc) CPUs busy"
	echo "during the run, any process: where CPUs used is well below $(nproc) × busy, other work on the machine took the rest,"
	echo "and requests/s say more about it than about the target. **Ceiling** (rows of lockproxy in front of a cluster): the"
	echo "ratio to lockproxy→redis that the masters' own CPU per command leaves if the proxy cost no more per command in front"
	echo "of them than in front of one Redis and both got the same CPU: lockproxy→redis's all three divided by its"
	echo "redis-benchmark and proxy plus the row's Redis."
	echo
	echo "| test | target | redis-benchmark | proxy | Redis | all three | CPUs used | machine busy | ceiling |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
	for P in $PIPELINES; do
		for test in SET GET; do
			sb=$(col lockproxy→redis "$test" "$P" 9)
			sp=$(col lockproxy→redis "$test" "$P" 10)
			sr=$(col lockproxy→redis "$test" "$P" 11)
			for t in "${targets[@]}"; do
				awk -v x="$test -P $P" -v t="$t" -v b="$(col "$t" "$test" "$P" 9)" -v p="$(col "$t" "$test" "$P" 10)" \
					-v r="$(col "$t" "$test" "$P" 11)" -v rps="$(col "$t" "$test" "$P" 4)" -v busy="$(col "$t" "$test" "$P" 12)" -v sb="$sb" -v sp="$sp" -v sr="$sr" \
					'BEGIN {
						ceil = "–"
						if (t ~ /^lockproxy→.*cluster$/) ceil = sprintf("%.2fx", (sb + sp + sr) / (sb + sp + r))
						printf "| %s | %s | %.2f | %s | %.2f | %.2f | %.2f | %.0f%% | %s |\n", x, t, b, t ~ /^lockproxy/ ? sprintf("%.2f", p) : "–", r, b + p + r, rps * (b + p + r) / 1e6, busy, ceil
					}'
			done
		done
	done
} >"$report"

if ((IDLE_CONNS > 0)); then
	for cfg in single cluster; do
		flags=()
		[[ $cfg == single ]] && flags=(-backend "127.0.0.1:$single")
		start_proxy idle_port "$cfg.yaml" "${flags[@]}"
		idle_pid=${pid_of[$idle_port]}
		log "memory: $IDLE_CONNS idle clients to a fresh lockproxy→$cfg (pid $idle_pid)"
		: >"$tmp/conns"
		sample_conns "$tmp/conns" &
		sampler=$!
		{
			echo
			echo "##### lockproxy→$cfg"
			"$tmp/idleconns" -addr "127.0.0.1:$idle_port" -pid "$idle_pid" -n "$IDLE_CONNS"
		} >>"$report"
		kill "$sampler" 2>/dev/null || true
		wait "$sampler" 2>/dev/null || true
		[[ $cfg == cluster ]] && echo "Most client connections a cluster master held meanwhile: $(sort -g "$tmp/conns" | tail -1)." >>"$report"
		stop "$idle_pid"
	done
fi
echo >>"$report"
echo "lockproxy warnings logged: $(grep -c -i 'warn' "$tmp/lockproxy.log" || true)" >>"$report"
cat "$report"
if [[ -n "${OUT:-}" ]]; then
	cp "$report" "$OUT"
fi
