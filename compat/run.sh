#!/usr/bin/env bash
# compat/run.sh: Redis's own test suite against Redis directly and through
# lockproxy, and the tests that pass directly but not through the proxy.
#
#   bash compat/run.sh [-c] [-u UNIT]... SUITE
#
# SUITE is a copy of the redis repository at tag 7.0.15 (at least its
# runtest script and tests/ folder; see compat/README.md). Nothing is
# fetched: the suite is copied into a temporary folder, next to a src/
# folder of links to the installed redis-server, redis-cli and
# redis-benchmark (the suite runs src/redis-cli and src/redis-benchmark),
# or to SUITE/src/ when that has them.
#
# Every unit (all of runtest --list-tests, or those given with -u) runs
# twice, in external mode, with the tags of Redis's own "nodebug" external
# CI job:
#
#   ./runtest --host 127.0.0.1 --port P --tags "-slow -needs:debug" \
#     --durable --single UNIT
#
# once with P a freshly started redis-server, once with P a lockproxy built
# from this checkout in front of another freshly started redis-server (lock
# nodes embedded). The report (stdout, and $OUT when set) lists per unit the
# tests that passed each way and, test by test, those that passed directly
# but not through the proxy; then the totals. Progress goes to stderr.
#
# With -c (cluster mode) both runs add runtest's --cluster-mode (one
# database, the tests tagged cluster:skip left out), and the proxy is in
# front of a fresh Redis Cluster of 3 masters without replicas
# (backend.cluster) instead of one redis-server.
#
# Environment (defaults in brackets):
#   TAGS ["-slow -needs:debug"]  runtest --tags
#   STALL [60]          runtest --timeout: seconds without a finished test
#                       after which runtest gives the unit up
#   UNIT_TIMEOUT [900]  hard bound on one run of one unit, in seconds
#   SKIPTEST            a test left out of both runs (runtest --skiptest: its
#                       name, or a regexp starting with /); for a test that
#                       stalls its unit, to run the tests after it
#   SHARED [auto]       backend.shared_connections of the proxy (the default)
#   KEEP                keep the work folder (logs of every run) when set
#   OUT                 also write the report to this file
set -euo pipefail

TAGS=${TAGS:--slow -needs:debug}
STALL=${STALL:-60}
UNIT_TIMEOUT=${UNIT_TIMEOUT:-900}
SHARED=${SHARED:-auto}
KEEP=${KEEP:-}
OUT=${OUT:-}

root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf 'compat: %s\n' "$*" >&2; }
usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

units=()
cluster=
while getopts "cu:h" opt; do
	case $opt in
	c) cluster=1 ;;
	u) units+=("$OPTARG") ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
(($# == 1)) || usage
suite=$(cd "$1" && pwd)
if [[ ! -f "$suite/runtest" || ! -f "$suite/tests/test_helper.tcl" ]]; then
	log "$suite has no runtest and tests/test_helper.tcl: point to a copy of the redis repository at 7.0.15"
	exit 2
fi

for bin in redis-server redis-cli go timeout; do
	command -v "$bin" >/dev/null 2>&1 || {
		log "$bin is not on PATH"
		exit 1
	}
done
if ! command -v tclsh8.5 >/dev/null 2>&1 && ! command -v tclsh8.6 >/dev/null 2>&1 &&
	! command -v tclsh8.7 >/dev/null 2>&1; then
	log "runtest needs tclsh 8.5 or newer (Debian: apt-get install tcl)"
	exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lockproxy-compat.XXXXXX")
pids=()

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_reverse "${pids[@]}"
	if [[ -n "$KEEP" ]]; then
		log "work folder kept: $tmp"
	else
		rm -rf "$tmp"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the suite's copy and lockproxy ---------------------------------------

mkdir -p "$tmp/suite/src" "$tmp/runs"
cp -R "$suite/tests" "$tmp/suite/tests"
cp "$suite/runtest" "$tmp/suite/runtest"
mkdir -p "$tmp/suite/tests/tmp"
for bin in redis-server redis-cli redis-benchmark redis-check-aof redis-check-rdb; do
	if [[ -x "$suite/src/$bin" ]]; then
		ln -s "$suite/src/$bin" "$tmp/suite/src/$bin"
	elif command -v "$bin" >/dev/null 2>&1; then
		ln -s "$(command -v "$bin")" "$tmp/suite/src/$bin"
	fi
done
log "redis-server: $("$tmp/suite/src/redis-server" --version)"

version=$(cd "$root" && git describe --always --dirty 2>/dev/null || echo "(not a git checkout)")
log "building lockproxy $version"
(cd "$root" && go build -o "$tmp/lockproxy" .)
cat >"$tmp/lockproxy.yaml" <<EOF
metrics:
  listen: ""
backend:
  shared_connections: $SHARED
lock:
  nodes: [embedded, embedded, embedded]
EOF

modeflags=()
[[ -z "$cluster" ]] || modeflags=(--cluster-mode)
[[ -z "${SKIPTEST:-}" ]] || modeflags+=(--skiptest "$SKIPTEST")

if ((${#units[@]} == 0)); then
	mapfile -t units < <(cd "$tmp/suite" && ./runtest --list-tests)
fi

# --- processes --------------------------------------------------------------

# start_redis DIR: start a fresh redis-server as Redis's external CI job
# does (no save, defaults otherwise); sets redis_port and redis_pid.
start_redis() {
	freeport redis_port 30000 2000 # away from the suite's own ports (21079 and up)
	mkdir -p "$1"
	redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$1" --save '' --appendonly no \
		--daemonize no --logfile "$1/redis.log" &
	redis_pid=$!
	pids+=("$redis_pid")
	waitping "$redis_port" redis-server
}

# start_cluster DIR: start 3 fresh cluster nodes as start_redis does and
# make them a cluster of 3 masters; sets cluster_seeds (comma-separated
# addresses) and cluster_pids.
start_cluster() {
	local i port addrs=()
	cluster_pids=()
	for i in 1 2 3; do
		# A cluster node also takes port+10000 (its bus), below 32768,
		# where the kernel picks no client ports.
		freeport port 20000 2700 bus
		mkdir -p "$1/node$i"
		redis-server --port "$port" --bind 127.0.0.1 --dir "$1/node$i" --save '' --appendonly no \
			--daemonize no --logfile "$1/node$i/redis.log" --cluster-enabled yes \
			--cluster-config-file nodes.conf --cluster-node-timeout 5000 &
		cluster_pids+=($!)
		pids+=($!)
		waitping "$port" redis-server
		addrs+=("127.0.0.1:$port")
	done
	create_cluster "$1/create.log" "${addrs[@]}"
	cluster_seeds=$(
		IFS=,
		echo "${addrs[*]}"
	)
}

# start_proxy DIR BACKEND_PORT: start lockproxy in front of the backend
# (with an empty BACKEND_PORT, in front of the cluster cluster_seeds);
# sets proxy_port and proxy_pid.
start_proxy() {
	local backend=(-backend "127.0.0.1:$2") cfg=$tmp/lockproxy.yaml
	if [[ -z "$2" ]]; then
		cfg=$1/lockproxy.yaml
		printf '%s\n' 'metrics:' '  listen: ""' 'backend:' '  addr: ""' "  cluster: [$cluster_seeds]" \
			"  shared_connections: $SHARED" 'lock:' '  nodes: [embedded, embedded, embedded]' >"$cfg"
		backend=()
	fi
	freeport proxy_port 30000 2000
	"$tmp/lockproxy" -config "$cfg" -listen "127.0.0.1:$proxy_port" \
		"${backend[@]}" -log-level warn >"$1/lockproxy.log" 2>&1 &
	proxy_pid=$!
	pids+=("$proxy_pid")
	waitping "$proxy_port" lockproxy || {
		tail -5 "$1/lockproxy.log" >&2
		return 1
	}
}

forget() {
	local keep=() p q
	for p in "${pids[@]}"; do
		for q in "$@"; do
			[[ "$p" == "$q" ]] && continue 2
		done
		keep+=("$p")
	done
	pids=("${keep[@]}")
}

# run_unit UNIT MODE: run one unit against a fresh server (MODE direct) or
# through a fresh proxy (MODE proxy); writes DIR/ok (names of the tests that
# passed, one a line), DIR/err and DIR/output.
run_unit() {
	local unit=$1 mode=$2 dir port rc=0 started
	dir="$tmp/runs/${unit//\//_}.$mode"
	mkdir -p "$dir"
	if [[ $mode == proxy && -n "$cluster" ]]; then
		start_cluster "$dir/cluster"
		start_proxy "$dir" ""
		port=$proxy_port
	else
		start_redis "$dir/redis"
		port=$redis_port
		if [[ $mode == proxy ]]; then
			start_proxy "$dir" "$redis_port"
			port=$proxy_port
		fi
	fi
	started=$SECONDS
	(cd "$tmp/suite" && TERM=dumb timeout -k 10 "$UNIT_TIMEOUT" ./runtest --host 127.0.0.1 --port "$port" \
		--tags "$TAGS" --durable --timeout "$STALL" "${modeflags[@]}" --single "$unit") >"$dir/output" 2>&1 || rc=$?
	if [[ $mode == proxy ]]; then
		stop "$proxy_pid"
		forget "$proxy_pid"
	fi
	if [[ $mode == proxy && -n "$cluster" ]]; then
		stop "${cluster_pids[@]}"
		forget "${cluster_pids[@]}"
	else
		stop "$redis_pid"
		forget "$redis_pid"
	fi
	sed -n 's/^\[ok\]: \(.*\) ([0-9]* ms)$/\1/p' "$dir/output" | LC_ALL=C sort >"$dir/ok"
	grep -E '^\[(err|exception|TIMEOUT)\]|^\[.*TIMEOUT' "$dir/output" >"$dir/err" || true
	if ((rc == 124 || rc == 137)); then
		echo "[unit timeout] killed after ${UNIT_TIMEOUT}s" >>"$dir/err"
	fi
	log "$(printf '%-40s %-6s %4d ok %3d failed  %4ds' "$unit" "$mode" "$(wc -l <"$dir/ok")" \
		"$(wc -l <"$dir/err")" $((SECONDS - started)))"
}

# --- the runs and the report -------------------------------------------------

report() {
	if [[ -n "$OUT" ]]; then
		tee -a "$OUT"
	else
		cat
	fi
}
[[ -z "$OUT" ]] || : >"$OUT"

total_direct=0 total_proxy=0 total_lost=0
lines=()
for unit in "${units[@]}"; do
	run_unit "$unit" direct
	run_unit "$unit" proxy
	d="$tmp/runs/${unit//\//_}.direct"
	p="$tmp/runs/${unit//\//_}.proxy"
	# comm pairs equal lines one to one, so a name that occurs twice must
	# pass twice.
	LC_ALL=C comm -23 "$d/ok" "$p/ok" >"$p/lost"
	LC_ALL=C comm -13 "$d/ok" "$p/ok" >"$p/gained"
	nd=$(wc -l <"$d/ok") np=$(wc -l <"$p/ok") nl=$(wc -l <"$p/lost")
	total_direct=$((total_direct + nd)) total_proxy=$((total_proxy + np)) total_lost=$((total_lost + nl))
	lines+=("$(printf '| %s | %d | %d | %d |' "$unit" "$nd" "$np" "$nl")")
done

{
	echo "Redis test suite ($("$tmp/suite/src/redis-server" --version | sed 's/ sha=.*//'), tags \"$TAGS\"${cluster:+, --cluster-mode, lockproxy in front of a 3-master cluster}), lockproxy $version"
	echo
	echo "| unit | passed directly | passed through lockproxy | passed directly only |"
	echo "|---|---:|---:|---:|"
	printf '%s\n' "${lines[@]}"
	pct=$(awk -v p="$total_proxy" -v d="$total_direct" 'BEGIN { if (d) printf "%.1f", 100 * p / d; else print "-" }')
	echo "| total | $total_direct | $total_proxy ($pct%) | $total_lost |"
	echo
	echo "Passed directly, not through lockproxy:"
	((total_lost > 0)) || echo "(none)"
	for unit in "${units[@]}"; do
		p="$tmp/runs/${unit//\//_}.proxy"
		while IFS= read -r t; do
			echo "- $unit: $t"
		done <"$p/lost"
	done
	header="
Passed through lockproxy, not directly (timing, or a test that depends on an earlier one):"
	for unit in "${units[@]}"; do
		p="$tmp/runs/${unit//\//_}.proxy"
		while IFS= read -r t; do
			[[ -z "$header" ]] || echo "$header"
			header=
			echo "- $unit: $t"
		done <"$p/gained"
	done
} | report
