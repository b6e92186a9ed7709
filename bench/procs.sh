# Helpers shared by the bench/*.sh scripts and compat/run.sh: free loopback
# ports, starting redis-servers, building lockproxy, waiting for PING,
# making a cluster, stopping processes, reading how busy the CPUs and the
# processes are, writing the report. Source it after defining log, root,
# tmp and pids.

used=" " # ports handed out by freeport

# freeport VAR [BASE SPAN [bus]]: set VAR to a port on 127.0.0.1 that
# nothing listens on and that freeport has not handed out yet, in
# [BASE, BASE+SPAN) (default 20000 and 12000: below the ephemeral range, so
# client sockets never take it meanwhile). With "bus" (a Redis Cluster
# node), port+10000 must be free too and is taken as well.
freeport() {
	local var=$1 base=${2:-20000} span=${3:-12000} bus=${4:-} p
	while :; do
		p=$((base + RANDOM % span))
		[[ "$used" == *" $p "* ]] && continue
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
		if [[ -n "$bus" ]]; then
			[[ "$used" == *" $((p + 10000)) "* ]] && continue
			(exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null && continue
			used+="$((p + 10000)) "
		fi
		used+="$p "
		printf -v "$var" '%s' "$p"
		return
	done
}

# waitping PORT NAME: wait until PING on PORT answers PONG.
waitping() {
	for _ in $(seq 200); do
		[[ "$(redis-cli -h 127.0.0.1 -p "$1" PING 2>/dev/null)" == PONG ]] && return 0
		sleep 0.05
	done
	log "$2 on port $1 did not answer PING"
	return 1
}

# start_cluster_nodes: start three redis-servers in cluster mode with the
# script's own start_redis VAR ARGS... (their ports in c1, c2 and c3, their
# addresses in the array cluster) and make them a cluster of three masters.
start_cluster_nodes() {
	local i v
	cluster=()
	for i in 1 2 3; do
		start_redis "c$i" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
		v="c$i"
		cluster+=("127.0.0.1:${!v}")
	done
	log "creating the cluster ${cluster[*]}"
	create_cluster "$tmp/create.log" "${cluster[@]}"
}

# create_cluster LOG ADDR...: make a cluster of the nodes at ADDR... (cluster
# mode on, empty), every one a master, with redis-cli --cluster create
# (its output in LOG), and wait until each reports cluster_state:ok.
create_cluster() {
	local out=$1 a ok
	shift
	redis-cli --cluster create "$@" --cluster-replicas 0 --cluster-yes >"$out" 2>&1 || {
		tail -5 "$out" >&2
		return 1
	}
	for _ in $(seq 400); do
		ok=0
		for a in "$@"; do
			redis-cli -h "${a%:*}" -p "${a##*:}" CLUSTER INFO 2>/dev/null | grep -q '^cluster_state:ok' && ok=$((ok + 1))
		done
		((ok == $#)) && return 0
		sleep 0.05
	done
	log "the cluster did not reach cluster_state:ok"
	return 1
}

# stop PID...: SIGTERM to each, then wait up to 5 s for each and SIGKILL
# what is left.
stop() {
	local pid
	for pid in "$@"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "$@"; do
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.05
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
}

# stop_reverse PID...: stop in reverse order of start, so that proxies stop
# before the servers behind them.
stop_reverse() {
	local rev=() i
	for ((i = $#; i >= 1; i--)); do
		rev+=("${!i}")
	done
	((${#rev[@]} == 0)) || stop "${rev[@]}"
}

# stop_on_exit: when the script exits (also on Ctrl-C or SIGTERM), stop the
# processes in the caller's pids array in reverse order and delete its tmp
# folder.
stop_on_exit() {
	trap _stop_on_exit EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

_stop_on_exit() {
	local rc=$?
	trap - EXIT INT TERM
	stop_reverse "${pids[@]}"
	rm -rf "$tmp"
	exit "$rc"
}

# machineticks: busy and total time of all CPUs so far, in clock ticks
# (/proc/stat; busy is all but idle and iowait).
machineticks() { awk 'NR == 1 { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat; }

# ticks PID...: user+system clock ticks of the processes so far, together
# (/proc/PID/stat; hz ticks make a second).
ticks() {
	local pid t=0 f
	for pid in "$@"; do
		f=$(cut -d')' -f2- "/proc/$pid/stat")
		t=$((t + $(awk '{print $12 + $13}' <<<"$f")))
	done
	echo "$t"
}
hz=$(getconf CLK_TCK)

# median: the median of the numbers on stdin (blanks between them; of an
# even count, the mean of the middle two), or "-" if there are none.
median() {
	tr -s ' \t' '\n\n' | awk NF | sort -g |
		awk '{v[NR] = $1} END {if (NR == 0) print "-"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# require WHAT BIN...: exit unless every BIN is on PATH; WHAT names what
# provides them.
require() {
	local bin
	for bin in "${@:2}"; do
		command -v "$bin" >/dev/null 2>&1 || {
			log "$bin is not on PATH ($1 are needed)"
			exit 1
		}
	done
}

# redis_server PORT [ARGS...]: start a redis-server on 127.0.0.1:PORT
# without persistence (folder and log in $tmp/redis-PORT, ARGS added to its
# options), add it to pids, set redis_pid to its process id and wait until
# it answers PING.
redis_server() {
	local port=$1 dir="$tmp/redis-$1"
	shift
	mkdir -p "$dir"
	redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
		--daemonize no --protected-mode no --logfile "$dir/redis.log" "$@" &
	pids+=($!)
	redis_pid=$!
	waitping "$port" redis-server || {
		tail -5 "$dir/redis.log" >&2
		return 1
	}
}

# start_redis VAR [PIDVAR]: start a redis-server on a free port, set VAR to
# its port (and PIDVAR to its process id).
start_redis() {
	local port
	freeport port
	redis_server "$port"
	[[ -z "${2:-}" ]] || printf -v "$2" '%s' "$redis_pid"
	printf -v "$1" '%s' "$port"
}

# lockproxy_server BINARY PORT LOG [FLAGS...]: start the lockproxy BINARY
# on 127.0.0.1:PORT with FLAGS, logging warnings and worse to LOG, add it
# to pids, set lockproxy_pid to its process id and wait until it answers
# PING (on failure, the end of LOG goes to stderr).
lockproxy_server() {
	local bin=$1 port=$2 out=$3
	shift 3
	"$bin" -listen "127.0.0.1:$port" -log-level warn "$@" >>"$out" 2>&1 &
	pids+=($!)
	lockproxy_pid=$!
	waitping "$port" lockproxy || {
		tail -5 "$out" >&2
		return 1
	}
}

# start_twemproxy VAR PIDVAR SERVER: start twemproxy (nutcracker) on a free
# port in front of the redis-server on port SERVER, with one connection to
# it; set VAR to its port and PIDVAR to its process id.
start_twemproxy() {
	local port stats
	freeport port
	freeport stats
	cat >"$tmp/nutcracker.yml" <<EOF
bench:
  listen: 127.0.0.1:$port
  hash: fnv1a_64
  distribution: ketama
  redis: true
  server_connections: 1
  auto_eject_hosts: false
  servers:
   - 127.0.0.1:$3:1
EOF
	nutcracker -c "$tmp/nutcracker.yml" -s "$stats" -a 127.0.0.1 -p "$tmp/nutcracker.pid" \
		-o "$tmp/nutcracker.log" -v 4 &
	pids+=($!)
	printf -v "$2" '%s' "$!"
	waitping "$port" twemproxy
	printf -v "$1" '%s' "$port"
}

# build_lockproxy BINARY [REVISION]: build lockproxy from the working tree
# (or from the git REVISION, exported into a folder of tmp) into BINARY.
build_lockproxy() {
	if [[ -z "${2:-}" ]]; then
		(cd "$root" && go build -o "$1" .)
		return
	fi
	mkdir "$tmp/base"
	git -C "$root" archive "$2" | tar -x -C "$tmp/base"
	(cd "$tmp/base" && go build -o "$1" .)
}

# report_to_out: empty OUT, when set, for report.
report_to_out() { [[ -z "${OUT:-}" ]] || : >"$OUT"; }

# report: copy stdin to stdout and, when OUT is set, to the end of OUT.
report() { if [[ -n "${OUT:-}" ]]; then tee -a "$OUT"; else cat; fi; }
