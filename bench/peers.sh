#!/usr/bin/env bash
# bench/peers.sh: lockproxy's forwarding next to the proxies a user would
# pick instead, in one run, in interleaved rounds.
#
#   PREDIXY=/path/to/predixy bash bench/peers.sh
#
# redis-benchmark -c 50 -r 100000 -t set, then -t get, without pipelining
# (-P 1) and with -P 16, against seven targets:
#   direct               one redis-server
#   twemproxy→redis      nutcracker in front of it (redis: true, one server
#                        connection)
#   predixy→redis        predixy in front of it (StandaloneServerPool, 2
#                        worker threads)
#   lockproxy→redis      lockproxy in front of it (shipped defaults)
#   floor→redis          bench/forwardfloor in front of it: a forwarding
#                        event loop in Go, one thread (a reference, not a
#                        proxy: see its doc comment)
#   direct cluster       a cluster of 3 masters, redis-benchmark --cluster
#   predixy→cluster      predixy in front of it (ClusterServerPool, 2 worker
#                        threads)
#   lockproxy→cluster    lockproxy in front of it (backend.cluster)
# The order of the targets rotates every round. For every run: requests/s,
# redis-benchmark's p50 and p99, and for the proxy and for the Redis
# processes behind it: CPU µs per command (user + system, /proc/PID/stat),
# system calls and context switches per command (perf stat's
# raw_syscalls:sys_enter and context-switches events, attached to the
# process for the run). Then the ratios the forwarding targets are stated
# in: lockproxy against twemproxy and predixy, each in front of the same
# backend, and the proxies' CPU per command.
#
# predixy is not part of this repository: build it from its sources
# (github.com/joyieldInc/predixy) and point PREDIXY at the binary. twemproxy
# is Debian's nutcracker. Everything listens on 127.0.0.1 on free ports;
# every process started here is stopped on exit. The report goes to stdout
# (and to $OUT when set); progress goes to stderr.
#
# Environment (defaults in brackets):
#   PREDIXY            the predixy binary (required)
#   ROUNDS [3]         interleaved rounds
#   N [100000]         requests per redis-benchmark test with -P 1
#   NP [500000]        requests per redis-benchmark test with -P 16
#   CLIENTS [50]       redis-benchmark -c
#   PIPELINES [1 16]   the -P values measured
#   TARGETS            a subset of the targets above, space-separated
#                      (names as above; the ratios need their peers)
#   SYSCALLS [1]       0: no perf stat (no system call or switch counts)
#   PLACE [free]       where the processes run (taskset), the same for every
#                      target: free (the kernel's choice), together (each
#                      proxy and the Redis processes behind it on CPU 1,
#                      redis-benchmark on CPU 0) or apart (the proxies on
#                      CPU 0, the Redis processes on CPU 1, redis-benchmark
#                      free). At -P 1 the kernel's choice decides the result:
#                      a proxy on the same CPU as the Redis behind it forwards
#                      about 1.6x what it does on the other (bench/README.md,
#                      "Where the kernel puts the processes").
#   OUT                also write the report to this file
set -euo pipefail

ROUNDS=${ROUNDS:-3}
N=${N:-100000}
NP=${NP:-500000}
CLIENTS=${CLIENTS:-50}
PIPELINES=${PIPELINES:-1 16}
SYSCALLS=${SYSCALLS:-1}
PLACE=${PLACE:-free}

log() { printf 'bench: %s\n' "$*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-peers-bench.XXXXXX)
pids=()

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

if [[ -z "${PREDIXY:-}" || ! -x "${PREDIXY:-}" ]]; then
	log "PREDIXY must name the predixy binary (build it from github.com/joyieldInc/predixy; see bench/README.md)"
	exit 1
fi
require "redis-server, redis-tools, nutcracker and Go" redis-server redis-cli redis-benchmark nutcracker go
case $PLACE in
free) ;;
together | apart)
	if (($(nproc) < 2)) || ! command -v taskset >/dev/null; then
		log "PLACE=$PLACE needs 2 CPUs and taskset (util-linux)"
		exit 1
	fi
	;;
*)
	log "PLACE must be free, together or apart"
	exit 1
	;;
esac
if ((SYSCALLS)) && ! perf stat -e raw_syscalls:sys_enter,context-switches -o /dev/null true 2>/dev/null; then
	log "perf stat cannot count raw_syscalls:sys_enter here: no system call counts (SYSCALLS=0)"
	SYSCALLS=0
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "building lockproxy and bench/forwardfloor"
build_lockproxy "$tmp/lockproxy"
(cd "$root/bench" && go build -o "$tmp/forwardfloor" ./forwardfloor)

# start_redis VAR [ARGS...]: start a redis-server, set VAR to its port and
# VAR_pid to its process id.
start_redis() {
	local var=$1 port
	shift
	freeport port 20000 2700 bus
	redis_server "$port" "$@"
	printf -v "${var}_pid" '%s' "$redis_pid"
	printf -v "$var" '%s' "$port"
}

# start_proxy VAR CONFIG [FLAGS...]: start lockproxy, set VAR and VAR_pid.
start_proxy() {
	local var=$1 cfg=$2 port
	shift 2
	freeport port
	lockproxy_server "$tmp/lockproxy" "$port" "$tmp/lockproxy.log" -config "$tmp/$cfg" -lock-nodes "$lock_nodes" "$@"
	printf -v "${var}_pid" '%s' "$lockproxy_pid"
	printf -v "$var" '%s' "$port"
}

# start_predixy VAR POOL: start predixy with 2 worker threads in front of
# POOL (its pool block), set VAR and VAR_pid.
start_predixy() {
	local var=$1 pool=$2 port
	freeport port
	cat >"$tmp/$var.conf" <<EOF
Name $var
Bind 127.0.0.1:$port
WorkerThreads 2
ClientTimeout 0
Log $tmp/$var.log
LogVerbSample 0
LogDebugSample 0
LogInfoSample 0
LogNoticeSample 1
LogWarnSample 1
LogErrorSample 1
$pool
EOF
	"$PREDIXY" "$tmp/$var.conf" >>"$tmp/$var.out" 2>&1 &
	pids+=($!)
	printf -v "${var}_pid" '%s' $!
	waitping "$port" predixy || { tail -5 "$tmp/$var.out" "$tmp/$var.log" >&2; return 1; }
	printf -v "$var" '%s' "$port"
}

start_redis single
start_redis node1
start_redis node2
start_redis node3
lock_nodes="127.0.0.1:$node1,127.0.0.1:$node2,127.0.0.1:$node3"
start_cluster_nodes

start_twemproxy twem twem_pid "$single"

start_predixy predixy_single "StandaloneServerPool {
    RefreshMethod fixed
    Hash crc16
    Distribution modula
    Group shard001 {
        + 127.0.0.1:$single
    }
}"
start_predixy predixy_cluster "ClusterServerPool {
    Servers {
$(printf '        + %s\n' "${cluster[@]}")
    }
}"

cat >"$tmp/single.yaml" <<EOF
shutdown_timeout: 5s
EOF
seeds=$(
	IFS=,
	echo "${cluster[*]}"
)
cat >"$tmp/cluster.yaml" <<EOF
shutdown_timeout: 5s
backend:
  addr: ""
  cluster: [$seeds]
EOF
start_proxy lockproxy_single single.yaml -backend "127.0.0.1:$single"
freeport floor
"$tmp/forwardfloor" -listen "127.0.0.1:$floor" -backend "127.0.0.1:$single" -loops 1 >>"$tmp/floor.log" 2>&1 &
pids+=($!)
floor_pid=$!
waitping "$floor" forwardfloor || { tail -5 "$tmp/floor.log" >&2; exit 1; }
start_proxy lockproxy_cluster cluster.yaml

all_targets=(direct twemproxy→redis predixy→redis lockproxy→redis floor→redis "direct cluster" predixy→cluster lockproxy→cluster)
if [[ -n "${TARGETS:-}" ]]; then
	targets=()
	for t in "${all_targets[@]}"; do
		[[ " $TARGETS " == *" $t "* ]] && targets+=("$t")
	done
	((${#targets[@]})) || {
		log "TARGETS names none of: ${all_targets[*]}"
		exit 1
	}
else
	targets=("${all_targets[@]}")
fi
masters="$c1_pid $c2_pid $c3_pid"
declare -A port_of=([direct]=$single [twemproxy→redis]=$twem [predixy→redis]=$predixy_single
	[lockproxy→redis]=$lockproxy_single [floor→redis]=$floor ["direct cluster"]=$c1 [predixy→cluster]=$predixy_cluster
	[lockproxy→cluster]=$lockproxy_cluster)
declare -A extra_of=(["direct cluster"]=--cluster)
# The proxy's process (none when direct) and the Redis processes that answer.
declare -A proxy_of=([twemproxy→redis]=$twem_pid [predixy→redis]=$predixy_single_pid
	[lockproxy→redis]=$lockproxy_single_pid [floor→redis]=$floor_pid [predixy→cluster]=$predixy_cluster_pid
	[lockproxy→cluster]=$lockproxy_cluster_pid)
declare -A redis_of=([direct]=$single_pid [twemproxy→redis]=$single_pid [predixy→redis]=$single_pid
	[lockproxy→redis]=$single_pid [floor→redis]=$single_pid ["direct cluster"]=$masters [predixy→cluster]=$masters
	[lockproxy→cluster]=$masters)
# pin CPU PID...: run every thread of the processes on CPU, now and after.
pin() {
	local cpu=$1 pid
	shift
	for pid in "$@"; do
		taskset -a -p -c "$cpu" "$pid" >/dev/null
	done
}
bench_cpu=() # the command that runs redis-benchmark where PLACE says
case $PLACE in
together)
	# shellcheck disable=SC2086
	pin 1 $single_pid $masters "${proxy_of[@]}"
	bench_cpu=(taskset -c 0)
	;;
apart)
	# shellcheck disable=SC2086
	pin 1 $single_pid $masters
	pin 0 "${proxy_of[@]}"
	;;
esac
log "redis :$single, cluster ${cluster[*]}, twemproxy :$twem, predixy :$predixy_single and :$predixy_cluster," \
	"lockproxy :$lockproxy_single and :$lockproxy_cluster, forwardfloor :$floor"

# perf_start FILE PID...: count the system calls and context switches of
# the processes (all their threads) into FILE until perf_stop; sets perf_pid.
perf_start() {
	local out=$1 list
	shift
	list=$(
		IFS=,
		echo "$*"
	)
	perf_pid=
	((SYSCALLS)) || return 0
	perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$list" -o "$out" &
	perf_pid=$!
}

# perf_stop PID: stop the perf_start of that perf_pid (none when empty).
perf_stop() {
	[[ -n "$1" ]] || return 0
	kill -INT "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# perf_read FILE: "SYSCALLS SWITCHES" as perf_start counted them in FILE.
perf_read() {
	awk -F, '$3 ~ /raw_syscalls:sys_enter/ {s = $1} $3 ~ /context-switches/ {c = $1} END {print s + 0, c + 0}' "$1"
}

# bench TARGET TEST P N: one redis-benchmark run; appends to $rows: target,
# test, P, rps, p50, p99, then per command: the proxy's CPU µs, system calls
# and context switches, the answering Redis processes' CPU µs and system
# calls; and the share of the machine's CPUs busy during the run (%).
bench() {
	local t=$1 test=$2 P=$3 n=$4 pb=0 pa=0 rb ra busy0 total0 busy1 total1 csv pp="${proxy_of[$t]:-}" rp="${redis_of[$t]}"
	local psys="-" pcs="-" rsys="-" rcs pperf= rperf
	# shellcheck disable=SC2086
	rb=$(ticks $rp)
	[[ -n "$pp" ]] && pb=$(ticks "$pp")
	[[ -n "$pp" ]] && { perf_start "$tmp/perf.proxy" "$pp"; pperf=$perf_pid; }
	# shellcheck disable=SC2086
	perf_start "$tmp/perf.redis" $rp
	rperf=$perf_pid
	((SYSCALLS)) && sleep 0.2 # perf attaches
	read -r busy0 total0 < <(machineticks)
	# shellcheck disable=SC2086
	csv=$("${bench_cpu[@]}" redis-benchmark -h 127.0.0.1 -p "${port_of[$t]}" ${extra_of[$t]:-} -c "$CLIENTS" -P "$P" \
		-t "$test" -r 100000 -n "$n" --csv 2>"$tmp/rb.err") || {
		log "redis-benchmark against $t failed: $(tail -2 "$tmp/rb.err")"
		exit 1
	}
	read -r busy1 total1 < <(machineticks)
	# shellcheck disable=SC2086
	ra=$(ticks $rp)
	[[ -n "$pp" ]] && pa=$(ticks "$pp")
	perf_stop "$pperf"
	perf_stop "$rperf"
	if ((SYSCALLS)); then
		[[ -n "$pp" ]] && read -r psys pcs < <(perf_read "$tmp/perf.proxy")
		read -r rsys rcs < <(perf_read "$tmp/perf.redis")
	fi
	[[ -n "${rows:-}" ]] || return 0
	awk -F'"' -v t="$t" -v P="$P" -v n="$n" -v hz="$hz" -v pt="$((pa - pb))" -v rt="$((ra - rb))" -v direct="${pp:-1}" \
		-v psys="$psys" -v pcs="$pcs" -v rsys="$rsys" -v b="$((busy1 - busy0))" -v tt="$((total1 - total0))" '
		function per(x) { return x == "-" ? "-" : sprintf("%.3f", x / n) }
		NR > 1 && ($2 == "SET" || $2 == "GET") {
			printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%s\t%.0f\n", t, $2, P, $4, $10, $14,
				(direct == 1 ? "-" : sprintf("%.3f", pt / hz * 1e6 / n)), (direct == 1 ? "-" : per(psys)), (direct == 1 ? "-" : per(pcs)),
				rt / hz * 1e6 / n, per(rsys), (tt > 0 ? 100 * b / tt : 0)
		}' <<<"$csv" >>"$rows"
}

log "warm-up"
redis-benchmark -h 127.0.0.1 -p "$single" -c "$CLIENTS" -t set -r 100000 -n 300000 -P 16 -q >/dev/null
redis-benchmark -h 127.0.0.1 -p "$c1" --cluster -c "$CLIENTS" -t set -r 100000 -n 300000 -P 16 -q >/dev/null
for t in "${targets[@]}"; do
	for test in set get; do
		bench "$t" "$test" 16 50000
	done
done
rows="$tmp/rows.tsv"
: >"$rows"
for ((r = 1; r <= ROUNDS; r++)); do
	for P in $PIPELINES; do
		n=$N
		((P > 1)) && n=$NP
		for ((k = 0; k < ${#targets[@]}; k++)); do
			t=${targets[(k + r - 1) % ${#targets[@]}]}
			for test in set get; do
				bench "$t" "$test" "$P" "$n"
			done
			log "round $r/$ROUNDS -P $P $t: $(tail -2 "$rows" | awk -F'\t' '{printf "%s %.0f/s  ", $2, $4}')"
		done
	done
done

# col TARGET TEST P COLUMN: the median of COLUMN over the rounds ("-" if none).
col() {
	awk -F'\t' -v t="$1" -v x="$2" -v P="$3" -v k="$4" '$1 == t && $2 == x && $3 == P && $k != "-" {print $k}' "$rows" |
		sort -g >"$tmp/v"
	median <"$tmp/v"
}

# ratio A B: A / B with two decimals and an x, or "–".
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "–"; else printf "%.2fx", a / b }'; }

report="$tmp/report.md"
{
	echo "### lockproxy next to twemproxy and predixy, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end." \
		"lockproxy $(git -C "$root" describe --always --dirty 2>/dev/null || echo '(no git)'), $(redis-server --version | awk '{print $1, $2, $3}')," \
		"nutcracker $(nutcracker -V 2>&1 | awk '/nutcracker-/{sub(/.*nutcracker-/, ""); print; exit}'), $("$PREDIXY" --version 2>&1 | awk '{print $NF; exit}' || true), $(go version | awk '{print $3}')."
	echo
	echo "redis-benchmark -c $CLIENTS -r 100000 -n $N (-P 1) or $NP (-P 16), one test a run; $ROUNDS interleaved rounds; medians over rounds."
	case $PLACE in
	free) echo "Placement: free (the kernel places every process)." ;;
	together) echo "Placement: together (every proxy and the Redis processes behind it on CPU 1, redis-benchmark on CPU 0)." ;;
	apart) echo "Placement: apart (every proxy on CPU 0, the Redis processes on CPU 1, redis-benchmark free)." ;;
	esac
	echo "Per command: CPU µs (user + system, /proc/PID/stat, clock ticks of $((1000 / hz)) ms), system calls and context switches"
	echo "(perf stat, raw_syscalls:sys_enter and context-switches, all threads) of the proxy and of the Redis processes that answer"
	echo "(the one redis-server, or the three masters together). busy: the share of all $(nproc) CPUs busy during the run, any process."
	for P in $PIPELINES; do
		for test in SET GET; do
			echo
			echo "| $test -P $P | req/s | min–max | vs twemproxy | vs predixy | p50 ms | p99 ms | proxy CPU µs | proxy syscalls | proxy switches | Redis CPU µs | Redis syscalls | busy |"
			echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
			tw=$(col twemproxy→redis "$test" "$P" 4)
			for t in "${targets[@]}"; do
				m=$(col "$t" "$test" "$P" 4)
				lo=$(head -1 "$tmp/v")
				hi=$(tail -1 "$tmp/v")
				vt="–"
				vp="–"
				if [[ $t == *cluster ]]; then
					vp=$(ratio "$m" "$(col predixy→cluster "$test" "$P" 4)")
				else
					vt=$(ratio "$m" "$tw")
					vp=$(ratio "$m" "$(col predixy→redis "$test" "$P" 4)")
				fi
				printf '| %s | %.0f | %.0f–%.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s%% |\n' "$t" "$m" "$lo" "$hi" "$vt" "$vp" \
					"$(col "$t" "$test" "$P" 5)" "$(col "$t" "$test" "$P" 6)" "$(col "$t" "$test" "$P" 7)" "$(col "$t" "$test" "$P" 8)" \
					"$(col "$t" "$test" "$P" 9)" "$(col "$t" "$test" "$P" 10)" "$(col "$t" "$test" "$P" 11)" "$(col "$t" "$test" "$P" 12)"
			done
		done
	done
	echo
	echo "The forwarding targets, lockproxy's medians against its peers' in front of the same backend:"
	echo
	echo "| test | req/s vs twemproxy (→redis) | vs predixy (→redis) | vs predixy (→cluster) | p99 ms lockproxy / twemproxy (→redis) | proxy CPU µs lockproxy / predixy (→redis) | (→cluster) | forwardfloor's CPU µs (→redis) |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	for P in $PIPELINES; do
		for test in SET GET; do
			printf '| %s -P %s | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s |\n' "$test" "$P" \
				"$(ratio "$(col lockproxy→redis "$test" "$P" 4)" "$(col twemproxy→redis "$test" "$P" 4)")" \
				"$(ratio "$(col lockproxy→redis "$test" "$P" 4)" "$(col predixy→redis "$test" "$P" 4)")" \
				"$(ratio "$(col lockproxy→cluster "$test" "$P" 4)" "$(col predixy→cluster "$test" "$P" 4)")" \
				"$(col lockproxy→redis "$test" "$P" 6)" "$(col twemproxy→redis "$test" "$P" 6)" \
				"$(col lockproxy→redis "$test" "$P" 7)" "$(col predixy→redis "$test" "$P" 7)" \
				"$(col lockproxy→cluster "$test" "$P" 7)" "$(col predixy→cluster "$test" "$P" 7)" \
				"$(col floor→redis "$test" "$P" 7)"
		done
	done
	echo
	echo "Targets (#35): req/s ≥ 1.0x twemproxy at -P 1 and ≥ 1.2x at -P 16, ≥ 1.0x predixy in front of one Redis and of the"
	echo "cluster; p99 at -P 1 no worse than twemproxy's; the proxy's CPU µs per command at or below predixy's."
	echo
	echo "lockproxy warnings logged: $(grep -c -i 'warn' "$tmp/lockproxy.log" || true)"
} >"$report"

cat "$report"
if [[ -n "${OUT:-}" ]]; then
	cp "$report" "$OUT"
fi
