#!/usr/bin/env bash
# bench/run.sh: lockproxy against what users would pick instead, in one run.
#
#   bash bench/run.sh
#
# 1. Forwarding: redis-benchmark -c 50 -t set,get -r 100000 against direct
#    Redis, twemproxy (nutcracker, one server, redis: true) and lockproxy
#    (shipped defaults; with a thread per CPU; with arrival_order: false),
#    all in front of the same redis-server; without pipelining and with
#    -P 16; in interleaved rounds, SET and GET each in a run of its own. A
#    markdown table: medians, min–max, p50/p99, each target's own CPU time
#    per command, and the ratios to direct Redis and to twemproxy; and a
#    second one of where the CPU goes: redis-benchmark, the proxy and the
#    backend redis-server per command, how busy the machine was, and the
#    ceiling those sums put on the requests per second.
# 2. Lock path: bench/lockbench, lockproxy vs redsync on the same three lock
#    nodes, uncontended and contended, with the CPU time per operation of
#    the benchmark's clients, the proxy and the nodes; the uncontended runs
#    also through bench/lockfloor, a minimal Redlock proxy on the same
#    libraries and the same number of threads, as a reference.
# 3. Memory: bench/idleconns, 10,000 idle clients on a freshly started
#    lockproxy, VmRSS.
#
# Everything listens on 127.0.0.1 on free ports; every process started here
# is stopped on exit. Missing redis-server, redis-tools or nutcracker are
# installed with apt-get (run as root). The report goes to stdout (and to
# $OUT when set); progress goes to stderr.
#
# Environment (defaults in brackets):
#   ROUNDS [5]          interleaved rounds of every comparison
#   N [200000]          requests per redis-benchmark test without pipelining
#   NP [1000000]        requests per redis-benchmark test with -P 16
#   CLIENTS [50]        redis-benchmark -c
#   LOCK_DURATION [3s]  one lockbench run (each of 5 scenarios per round)
#   IDLE_CONNS [10000]  idle connections for the memory measurement
#   SKIP                space-separated parts to skip: forward lock memory
#   OUT                 also write the report to this file
set -euo pipefail

ROUNDS=${ROUNDS:-5}
N=${N:-200000}
NP=${NP:-1000000}
CLIENTS=${CLIENTS:-50}
LOCK_DURATION=${LOCK_DURATION:-3s}
IDLE_CONNS=${IDLE_CONNS:-10000}
SKIP=${SKIP:-}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-bench.XXXXXX)
pids=()

log() { printf 'bench: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp

skipped() { [[ " $SKIP " == *" $1 "* ]]; }

# --- prerequisites ----------------------------------------------------------

missing=()
for bin in redis-server:redis-server redis-cli:redis-tools redis-benchmark:redis-tools nutcracker:nutcracker; do
	command -v "${bin%%:*}" >/dev/null 2>&1 || missing+=("${bin##*:}")
done
if ((${#missing[@]})); then
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq redis-server redis-tools nutcracker >/dev/null
	# Debian starts the packaged services; this script runs its own.
	if command -v systemctl >/dev/null 2>&1; then
		systemctl stop redis-server nutcracker >/dev/null 2>&1 || true
	fi
fi
command -v go >/dev/null 2>&1 || {
	log "go is not on PATH"
	exit 1
}

# 10,000 idle clients need 10,000 sockets in the client, the proxy and Redis.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "open files limit $(ulimit -n)"

log "building lockproxy, lockbench and idleconns"
build_lockproxy "$tmp/lockproxy"
(cd "$root/bench" && go build -o "$tmp/lockbench" ./lockbench && go build -o "$tmp/idleconns" ./idleconns &&
	go build -o "$tmp/lockfloor" ./lockfloor)

# --- processes ----------------------------------------------------------------

# start_redis VAR [PIDVAR]: start a redis-server, set VAR to its port (and
# PIDVAR to its process id).
start_redis() {
	local port
	freeport port
	redis_server "$port" --maxclients 20000
	[[ -z "${2:-}" ]] || printf -v "$2" '%s' "$redis_pid"
	printf -v "$1" '%s' "$port"
}

# start_proxy VAR PIDVAR [CONFIG]: start lockproxy on the backend and lock
# nodes with CONFIG (default lockproxy.yaml), set VAR to its port and PIDVAR
# to its process id.
start_proxy() {
	local port
	freeport port
	lockproxy_server "$tmp/lockproxy" "$port" "$tmp/lockproxy.log" -config "$tmp/${3:-lockproxy.yaml}" \
		-backend "127.0.0.1:$backend" -lock-nodes "$lock_nodes"
	printf -v "$2" '%s' "$lockproxy_pid"
	printf -v "$1" '%s' "$port"
}

start_redis backend backend_pid
start_redis node1 node1_pid
start_redis node2 node2_pid
start_redis node3 node3_pid
lock_nodes="127.0.0.1:$node1,127.0.0.1:$node2,127.0.0.1:$node3"

start_twemproxy twem twem_pid "$backend"

# The flags give the addresses; the file raises max_clients above the
# memory measurement's 10,000 clients.
cat >"$tmp/lockproxy.yaml" <<EOF
shutdown_timeout: 5s
log:
  level: warn
limits:
  max_clients: 20000
EOF
start_proxy proxy proxy_pid
# The same with a thread per CPU (Go's own default; the shipped default,
# gomaxprocs: 0, leaves one CPU to Redis), for the forwarding comparison.
{
	cat "$tmp/lockproxy.yaml"
	echo "gomaxprocs: $(nproc)"
} >"$tmp/lockproxy-allcpus.yaml"
start_proxy proxyall proxyall_pid lockproxy-allcpus.yaml
# The same with arrival_order: false, to show what keeping different
# clients' commands in their arrival order costs.
{
	cat "$tmp/lockproxy.yaml"
	echo "arrival_order: false"
} >"$tmp/lockproxy-unordered.yaml"
start_proxy proxyun proxyun_pid lockproxy-unordered.yaml

log "backend redis :$backend, lock nodes :$node1 :$node2 :$node3, twemproxy :$twem, lockproxy :$proxy (gomaxprocs $(nproc): :$proxyall, arrival_order false: :$proxyun)"

report="$tmp/report.md"
{
	echo "### lockproxy benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr)." \
		"lockproxy $(git -C "$root" describe --always --dirty 2>/dev/null || echo '(no git)')," \
		"$(redis-server --version | awk '{print $1, $2, $3}'), nutcracker $(nutcracker -V 2>&1 | awk '/nutcracker-/{sub(/.*nutcracker-/, ""); print; exit}'), $(go version | awk '{print $3}')."
} >"$report"

# --- 1. forwarding --------------------------------------------------------------

if ! skipped forward; then
	targets=(direct twemproxy lockproxy lockproxy-allcpus lockproxy-unordered)
	declare -A port_of=([direct]=$backend [twemproxy]=$twem [lockproxy]=$proxy [lockproxy-allcpus]=$proxyall
		[lockproxy-unordered]=$proxyun)
	# Whose CPU time is reported: the proxy's own, or Redis's when direct.
	declare -A pid_of=([direct]=$backend_pid [twemproxy]=$twem_pid [lockproxy]=$proxy_pid [lockproxy-allcpus]=$proxyall_pid
		[lockproxy-unordered]=$proxyun_pid)
	# us TIME HZ: TIME (in 1/HZ s) as µs per request of the test ($n).
	us() { awk -v k="$1" -v hz="$2" -v n="$n" 'BEGIN { printf "%.2f", k * 1e6 / hz / n }'; }
	# awk_median: an awk function, median(s), of the numbers in the
	# space-separated string s; it also sets lo and hi, the least and the
	# largest. Both tables' programs start with it.
	awk_median='
		function median(s, a, n, i, j, x) {
			n = split(s, a, " ")
			for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x }
			lo = a[1]; hi = a[n]
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}'
	rows="$tmp/forward.tsv"
	: >"$rows"
	# Warm-up, not reported: fill the key space, let every target open its
	# connections.
	redis-benchmark -h 127.0.0.1 -p "$backend" -c "$CLIENTS" -t set -r 100000 -n 300000 -P 16 -q >/dev/null
	for t in "${targets[@]}"; do
		redis-benchmark -h 127.0.0.1 -p "${port_of[$t]}" -c "$CLIENTS" -t set,get -r 100000 -n 20000 -q >/dev/null
	done
	for ((r = 1; r <= ROUNDS; r++)); do
		for p in 1 16; do
			n=$N
			((p == 1)) || n=$NP
			# Rotate the order every round so no target always goes first.
			for ((k = 0; k < ${#targets[@]}; k++)); do
				t=${targets[(k + r - 1) % ${#targets[@]}]}
				# One test per run, so that the CPU time read around it is
				# that test's.
				for op in set get; do
					csv="$tmp/rb-$r-$p-$t-$op.csv"
					before=$(ticks "${pid_of[$t]}")
					backend_before=$(ticks "$backend_pid")
					read -r busy_before total_before < <(machineticks)
					# The subshell's children's times are redis-benchmark's.
					(
						redis-benchmark -h 127.0.0.1 -p "${port_of[$t]}" -c "$CLIENTS" -t "$op" -r 100000 \
							-n "$n" -P "$p" --csv >"$csv" 2>"$csv.err" || exit 1
						times >"$csv.times"
					) || {
						log "redis-benchmark against $t failed: $(tail -2 "$csv.err")"
						exit 1
					}
					ticks=$(($(ticks "${pid_of[$t]}") - before))
					backend_ticks=$(($(ticks "$backend_pid") - backend_before))
					read -r busy_after total_after < <(machineticks)
					# times: "0m0.001s 0m0.002s" for the shell, then the same for its children.
					bench_s=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, k, /[ms]/); print u[1] * 60 + u[2] + k[1] * 60 + k[2] }' "$csv.times")
					extra="$(us "$bench_s" 1)	$(us "$backend_ticks" "$hz")	$(awk -v b=$((busy_after - busy_before)) -v t=$((total_after - total_before)) 'BEGIN { x = t > 0 ? 100 * b / t : 0; printf "%.0f", x }')"
					# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
					tr -d '"' <"$csv" | awk -F, -v p="$p" -v t="$t" -v r="$r" -v us="$(us "$ticks" "$hz")" -v extra="$extra" \
						'$1 == "SET" || $1 == "GET" { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", $1, p, t, r, $2, $5, $7, us, extra }' >>"$rows"
				done
				log "forward round $r -P $p $t: $(cat "$tmp/rb-$r-$p-$t-set.csv" "$tmp/rb-$r-$p-$t-get.csv" | tr -d '"' | awk -F, '$1=="SET"||$1=="GET"{printf "%s %.0f/s  ", $1, $2}')"
			done
		done
	done
	{
		echo
		echo "#### Forwarding: redis-benchmark -c $CLIENTS -t set (then -t get) -r 100000 (n=$N, with -P 16 n=$NP), $ROUNDS interleaved rounds"
		echo
		echo "Medians over rounds; throughput as median (min–max). Ratios are of medians in this run."
		echo "CPU µs/cmd: user and system CPU time of the target's own process (redis-server when direct, else the proxy)"
		echo "during the test, from /proc/PID/stat, divided by the requests."
		echo "lockproxy runs with the shipped \`gomaxprocs: 0\` (threads running Go code: $(($(nproc) > 1 ? $(nproc) - 1 : 1)) here, one CPU"
		echo "left to Redis), lockproxy-allcpus with \`gomaxprocs: $(nproc)\` (Go's own default, a thread per CPU),"
		echo "lockproxy-unordered with \`arrival_order: false\`; all three are the same binary and configuration otherwise."
		echo
		echo "| test | target | requests/s | p50 ms | p99 ms | CPU µs/cmd | vs direct | vs twemproxy |"
		echo "|---|---|---|---|---|---|---|---|"
		awk -F'\t' -v targets="${targets[*]}" "$awk_median"'
			{ k = $1 SUBSEP $2 SUBSEP $3; rps[k] = rps[k] " " $5; p50[k] = p50[k] " " $6; p99[k] = p99[k] " " $7; cpu[k] = cpu[k] " " $8 }
			END {
				nt = split(targets, tg, " ")
				split("1 16", ps, " "); split("SET GET", ops, " ")
				for (pi = 1; pi <= 2; pi++) for (oi = 1; oi <= 2; oi++) {
					p = ps[pi]; op = ops[oi]
					for (ti = 1; ti <= nt; ti++) { k = op SUBSEP p SUBSEP tg[ti]; m[tg[ti]] = median(rps[k]); l[tg[ti]] = lo; h[tg[ti]] = hi }
					for (ti = 1; ti <= nt; ti++) {
						t = tg[ti]; k = op SUBSEP p SUBSEP t
						vd = m["direct"] > 0 ? sprintf("%.2fx", m[t] / m["direct"]) : "-"
						vt = m["twemproxy"] > 0 ? sprintf("%.2fx", m[t] / m["twemproxy"]) : "-"
						if (t ~ /^lockproxy/) { vd = "**" vd "**"; vt = "**" vt "**" }
						printf "| %s -P %s | %s | %.0f (%.0f–%.0f) | %.3f | %.3f | %.2f | %s | %s |\n", op, p, t, m[t], l[t], h[t], median(p50[k]), median(p99[k]), median(cpu[k]), vd, vt
					}
				}
			}' "$rows"
		echo
		echo "Where the CPU goes, µs per command (medians over rounds): redis-benchmark (its children's times"
		echo "from bash's times builtin), the proxy, the backend redis-server, and all three; machine busy is the share"
		echo "of all $(nproc) CPUs busy during the test, any process, from /proc/stat. Ceiling: $(nproc) CPUs divided by"
		echo "the sum, the requests/s this path could reach if the machine did nothing else and no CPU ever waited."
		echo
		echo "| test | target | redis-benchmark | proxy | redis-server | all three | machine busy | ceiling requests/s |"
		echo "|---|---|---|---|---|---|---|---|"
		awk -F'\t' -v targets="${targets[*]}" -v cpus="$(nproc)" "$awk_median"'
			{
				k = $1 SUBSEP $2 SUBSEP $3
				px = $3 == "direct" ? 0 : $8
				bn[k] = bn[k] " " $9; pr[k] = pr[k] " " px; be[k] = be[k] " " $10; all[k] = all[k] " " ($9 + px + $10); busy[k] = busy[k] " " $11
			}
			END {
				nt = split(targets, tg, " ")
				split("1 16", ps, " "); split("SET GET", ops, " ")
				for (pi = 1; pi <= 2; pi++) for (oi = 1; oi <= 2; oi++) for (ti = 1; ti <= nt; ti++) {
					t = tg[ti]; k = ops[oi] SUBSEP ps[pi] SUBSEP t
					a = median(all[k]); ceil = a > 0 ? cpus * 1e6 / a : 0
					printf "| %s -P %s | %s | %.2f | %s | %.2f | %.2f | %.0f%% | %.0f |\n", ops[oi], ps[pi], t, median(bn[k]),
						t == "direct" ? "–" : sprintf("%.2f", median(pr[k])), median(be[k]), a, median(busy[k]), ceil
				}
			}' "$rows"
	} >>"$report"
fi

# --- 2. lock path ---------------------------------------------------------------

if ! skipped lock; then
	# The reference proxy runs Go code on as many threads as lockproxy's
	# shipped gomaxprocs: 0 gives it: one fewer than the CPUs, at least one.
	freeport lockfloor
	GOMAXPROCS=$(($(nproc) > 1 ? $(nproc) - 1 : 1)) \
		"$tmp/lockfloor" -listen "127.0.0.1:$lockfloor" -nodes "$lock_nodes" >>"$tmp/lockfloor.log" 2>&1 &
	pids+=($!)
	lockfloor_pid=$!
	waitping "$lockfloor" lockfloor
	log "lock comparison: $ROUNDS rounds of 5 runs of $LOCK_DURATION"
	"$tmp/lockbench" -proxy "127.0.0.1:$proxy" -nodes "$lock_nodes" -rounds "$ROUNDS" \
		-duration "$LOCK_DURATION" -contended-duration "$LOCK_DURATION" \
		-proxy-pid "$proxy_pid" -node-pids "$node1_pid,$node2_pid,$node3_pid" \
		-lockfloor "127.0.0.1:$lockfloor" -lockfloor-pid "$lockfloor_pid" >>"$report"
fi

# --- 3. memory ------------------------------------------------------------------

if ! skipped memory; then
	# A fresh proxy, so that the RSS is not what the benchmarks above left.
	start_proxy mem_proxy mem_pid
	log "memory: $IDLE_CONNS idle connections to a fresh lockproxy (pid $mem_pid)"
	"$tmp/idleconns" -addr "127.0.0.1:$mem_proxy" -pid "$mem_pid" -n "$IDLE_CONNS" >>"$report"
fi

{
	echo
	echo "lockproxy log at warn and above during the run: $(wc -l <"$tmp/lockproxy.log") lines," \
		"$(grep -c 'lock node down' "$tmp/lockproxy.log" || true) of them \"lock node down\" (a lock node missed lock.node_timeout)."
} >>"$report"
if [[ -s "$tmp/lockproxy.log" ]]; then
	log "lockproxy logged $(wc -l <"$tmp/lockproxy.log") lines at warn or above; the last ones:"
	tail -5 "$tmp/lockproxy.log" >&2
fi
cat "$report"
if [[ -n "${OUT:-}" ]]; then
	cp "$report" "$OUT"
fi
