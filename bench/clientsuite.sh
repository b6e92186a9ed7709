#!/usr/bin/env bash
# bench/clientsuite.sh: a client library's own test suite (go-redis v9's
# Ginkgo suite) run three ways, and the difference.
#
#   bash bench/clientsuite.sh                      # the whole suite, ~10 min
#   FOCUS='ZUnion|SInter' bash bench/clientsuite.sh
#
# The ways: directly against one redis-server (direct), through lockproxy in
# front of another fresh redis-server (lockproxy→redis), and through
# lockproxy in front of a 3-master Redis Cluster without replicas
# (lockproxy→cluster). Each way gets servers of its own, started on free
# loopback ports; every process started here is stopped on exit.
#
# The suite is the one published with the go-redis module this repository
# depends on (go.mod; the Go module proxy serves it with its _test.go
# files), built once with `go test -c`. It runs as go-redis's CI runs it
# against an external server: RE_CLUSTER=true (start no servers of its
# own; the endpoint comes from REDIS_ENDPOINTS_CONFIG_PATH) and
# REDIS_VERSION set to the installed redis-server's major.minor, so the
# specs of newer versions skip. The specs of other topologies (Cluster,
# Ring, Sentinel, TLS, universal clients), which dial go-redis's fixed
# ports, are left out with -ginkgo.skip-file. Specs that need Redis Stack
# modules fail in every way and so drop out of the comparison.
#
# The report (stdout, and $OUT when set): the number of specs passed,
# failed and skipped each way, then each spec that passed directly but not
# through a proxy, with the first line of its failure, and any that passed
# only through a proxy. KEEP=1 keeps the work folder (the JSON reports and
# the servers' logs).
#
# Environment (defaults in brackets):
#   FOCUS        a -ginkgo.focus regexp, to run a subset while iterating
#   WAYS [direct proxy cluster]   the ways to run
#   SPEC_TIMEOUT [20m]            -ginkgo.timeout of one way
#   OUT          also write the report to this file
#   KEEP         keep the work folder
set -euo pipefail

WAYS=${WAYS:-direct proxy cluster}
SPEC_TIMEOUT=${SPEC_TIMEOUT:-20m}
FOCUS=${FOCUS:-}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/lockproxy-clientsuite.XXXXXX)
pids=()

log() { printf 'clientsuite: %s\n' "$*" >&2; }

# shellcheck source=bench/procs.sh
source "$root/bench/procs.sh"

stop_on_exit # the processes in pids and the folder tmp
if [[ -n "${KEEP:-}" ]]; then
	trap 'rc=$?; trap - EXIT INT TERM; stop_reverse "${pids[@]}"; log "kept $tmp"; exit $rc' EXIT
fi

require "redis-server, redis-tools, Go and python3" redis-server redis-cli go python3

# --- the suite ----------------------------------------------------------------

mod=github.com/redis/go-redis/v9
ver=$(cd "$root" && go list -m -f '{{.Version}}' "$mod")
# The copy and its test binary are kept between runs, in a folder named by
# the version (the build cache does not help a copy in a new folder).
cache=${XDG_CACHE_HOME:-$HOME/.cache}/lockproxy-clientsuite/go-redis-$ver
if [[ ! -x "$cache/goredis.test" ]]; then
	log "downloading $mod@$ver"
	src=$(cd "$root" && go mod download -json "$mod@$ver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
	rm -rf "$cache"
	mkdir -p "$cache"
	cp -R "$src" "$cache/go-redis"
	chmod -R u+w "$cache/go-redis"
	log "building its test binary"
	(cd "$cache/go-redis" && go test -c -o "$cache/goredis.test.new" . && mv "$cache/goredis.test.new" "$cache/goredis.test")
fi
redis_version=$(redis-server --version | sed -n 's/.*v=\([0-9]*\.[0-9]*\).*/\1/p')

log "building lockproxy $(cd "$root" && git describe --always --dirty 2>/dev/null || echo '')"
build_lockproxy "$tmp/lockproxy"

# --- processes ------------------------------------------------------------------

# start_redis VAR [ARGS...]: start a fresh redis-server, set VAR to its port.
start_redis() {
	local var=$1 port
	shift
	# A cluster node also takes port+10000: below 32768, where the kernel
	# picks no client ports, so that no connection takes it meanwhile.
	freeport port 20000 2700 bus
	# Redis's own default protected mode, as the suite expects of a server.
	redis_server "$port" --protected-mode yes "$@"
	printf -v "$var" '%s' "$port"
}

# start_proxy VAR CONFIG [FLAGS...]: start lockproxy, set VAR to its port.
start_proxy() {
	local var=$1 cfg=$2 port
	shift 2
	freeport port
	lockproxy_server "$tmp/lockproxy" "$port" "$tmp/lockproxy-$port.log" -config "$tmp/$cfg" "$@"
	printf -v "$var" '%s' "$port"
}

# start_cluster VAR: a 3-master cluster without replicas; VAR is set to
# its seed addresses, comma-separated.
start_cluster() {
	start_cluster_nodes
	printf -v "$1" '%s' "$(
		IFS=,
		echo "${cluster[*]}"
	)"
}

cat >"$tmp/single.yaml" <<EOF
metrics:
  listen: ""
lock:
  nodes: [embedded, embedded, embedded]
EOF

# --- the runs --------------------------------------------------------------------

# start_way WAY: fresh servers for WAY; sets target to the port to test.
start_way() {
	case $1 in
	direct)
		start_redis target
		;;
	proxy)
		start_redis p
		start_proxy target single.yaml -backend "127.0.0.1:$p"
		;;
	cluster)
		start_cluster seeds
		cat >"$tmp/cluster.yaml" <<EOF
metrics:
  listen: ""
backend:
  addr: ""
  cluster: [$seeds]
lock:
  nodes: [embedded, embedded, embedded]
EOF
		start_proxy target cluster.yaml
		;;
	*)
		log "unknown way $1 (direct, proxy, cluster)"
		exit 2
		;;
	esac
}

# The specs' locations, for naming the spec that crashes the suite.
(cd "$cache/go-redis" && RE_CLUSTER=true REDIS_VERSION="$redis_version" "$cache/goredis.test" \
	-test.run '^TestGinkgoSuite$' -ginkgo.dry-run -ginkgo.json-report "$tmp/dry.json" >/dev/null 2>&1) || true

# crasher OUT: the file:line of the It whose goroutine panicked outside
# Ginkgo's reach (an Expect in a goroutine of its own), which ends the
# whole test binary: the innermost _test.go frame of the panicking
# goroutine, mapped to the It that encloses it.
crasher() {
	python3 - "$tmp/dry.json" "$1" <<'PY'
import json, os, re, sys
its = {}
for s in json.load(open(sys.argv[1]))[0]["SpecReports"]:
    loc = s["LeafNodeLocation"]
    its.setdefault(os.path.basename(loc["FileName"]), []).append(loc["LineNumber"])
text = open(sys.argv[2], errors="replace").read()
text = text[text.rfind("panic: ") :]
for m in re.finditer(r"/go-redis/(\w+_test\.go):(\d+)", text):
    f, line = m.group(1), int(m.group(2))
    best = max((l for l in its.get(f, []) if l <= line), default=None)
    if best is not None:
        print("%s:%d" % (f, best))
        break
PY
}

# run WAY: run the suite against fresh servers of WAY; its JSON report is
# $tmp/WAY.json, its output $tmp/WAY.out. A spec that crashes the test
# binary is listed in $tmp/WAY.crashed and skipped in a new run on fresh
# servers (what it changed would stay behind otherwise).
run() {
	local way=$1 rc focus=() skips=() n0 c
	: >"$tmp/$way.crashed"
	[[ -z "$FOCUS" ]] || focus=(-ginkgo.focus "$FOCUS")
	for _ in 1 2 3 4 5 6; do
		n0=${#pids[@]}
		start_way "$way"
		printf '{"db": {"endpoints": ["redis://127.0.0.1:%s"]}}\n' "$target" >"$tmp/$way.endpoints.json"
		skips=()
		while read -r c; do
			[[ -z "$c" ]] || skips+=(-ginkgo.skip-file "$c")
		done <"$tmp/$way.crashed"
		log "$way: running the suite against :$target"
		rm -f "$tmp/$way.json"
		rc=0
		(cd "$cache/go-redis" && RE_CLUSTER=true REDIS_VERSION="$redis_version" \
			REDIS_ENDPOINTS_CONFIG_PATH="$tmp/$way.endpoints.json" \
			"$cache/goredis.test" -test.run '^TestGinkgoSuite$' -test.timeout 0 \
			-ginkgo.no-color -ginkgo.seed 1 -ginkgo.timeout "$SPEC_TIMEOUT" -ginkgo.json-report "$tmp/$way.json" \
			-ginkgo.skip-file 'osscluster_test|ring_test|sentinel_test|tls_test|tls_cluster_test|universal_test' \
			"${skips[@]}" "${focus[@]}" >"$tmp/$way.out" 2>&1) || rc=$?
		stop_reverse "${pids[@]:n0}"
		pids=("${pids[@]:0:n0}")
		log "$way: $(grep -E '^(Ran|SUCCESS|FAIL)' "$tmp/$way.out" | tr '\n' ' ') (exit $rc)"
		[[ ! -s "$tmp/$way.json" ]] || return 0
		c=$(crasher "$tmp/$way.out")
		if [[ -z "$c" ]]; then
			log "$way: no report, and no spec to blame; see $tmp/$way.out"
			return 0
		fi
		log "$way: $c crashed the suite; again on fresh servers without it"
		echo "$c" >>"$tmp/$way.crashed"
	done
}

for way in $WAYS; do
	run "$way"
done

# --- the report --------------------------------------------------------------------

python3 - "$tmp" $WAYS <<'EOF' | tee "${OUT:-/dev/null}"
import json, os, re, sys

tmp, ways = sys.argv[1], sys.argv[2:]
names = {"direct": "direct", "proxy": "lockproxy→redis", "cluster": "lockproxy→cluster"}

msgs = {}

def specs(way):
    msgs[way] = {}
    path = os.path.join(tmp, way + ".json")
    if not os.path.exists(path):
        return {}
    out = {}
    for s in json.load(open(path))[0]["SpecReports"]:
        if s["LeafNodeType"] != "It":
            continue
        loc = s["LeafNodeLocation"]
        name = " ".join(s.get("ContainerHierarchyTexts") or []) + " " + s["LeafNodeText"]
        key = "%s:%d %s" % (os.path.basename(loc["FileName"]), loc["LineNumber"], name.strip())
        if key in out:  # the same spec run again, as for RESP2 and RESP3
            key += " (%d)" % sum(1 for k in out if k.split(" (")[0] == key)
        msg = ""
        if s.get("Failure"):
            msg = (s["Failure"].get("Message") or "").strip().replace("\n", " ")
            msg = " ".join(msg.split())[:240]
        out[key] = (s["State"], msg)
        # For comparing failures: the servers' ports differ between ways.
        msgs[way][key] = re.sub(r"127\.0\.0\.1:\d+|:\d{4,5}\b|0x[0-9a-f]+", "ADDR", msg)
    crashed = os.path.join(tmp, way + ".crashed")
    for loc in open(crashed).read().split() if os.path.exists(crashed) else []:
        for key in out:
            if key.startswith(loc + " "):
                out[key] = ("crashed", "an Expect in a goroutine of its own failed, which ends the test binary")
    return out

res = {w: specs(w) for w in ways}
print("| way | passed | failed | skipped |")
print("| --- | ---: | ---: | ---: |")
for w in ways:
    st = [v[0] for v in res[w].values()]
    failed = sum(1 for x in st if x not in ("passed", "skipped", "pending"))
    print("| %s | %d | %d | %d |" % (names[w], st.count("passed"), failed, st.count("skipped")))
if "direct" not in res:
    sys.exit(0)
base = res["direct"]
for w in ways:
    if w == "direct":
        continue
    lost = sorted(k for k, v in base.items() if v[0] == "passed" and res[w].get(k, ("",))[0] != "passed")
    won = sorted(k for k, v in res[w].items() if v[0] == "passed" and base.get(k, ("",))[0] != "passed")
    print()
    other = sum(1 for k in base if base[k][0] != res[w].get(k, ("",))[0] or msgs["direct"][k] != msgs[w].get(k))
    print("## %s: %d of the %d specs passed directly do not pass" % (names[w], len(lost), sum(1 for v in base.values() if v[0] == "passed")))
    print("(specs whose state or failure message is not the one they have directly: %d)" % other)
    for k in lost:
        st, msg = res[w].get(k, ("not run", ""))
        print("- %s — %s: %s" % (k, st, msg))
    if won:
        print()
        print("## %s: %d specs pass only here" % (names[w], len(won)))
        for k in won:
            print("- %s (direct: %s: %s)" % (k, base.get(k, ("not run", ""))[0], base.get(k, ("", ""))[1]))
EOF
