#!/bin/sh
# The Conductor's HTTP front, this build (NEW_BUILD) against another (OLD_BUILD, e.g. the
# session start's e56d1c0), interleaved in rounds on the same machine, with the raw loopback
# limit measured in the same run (docs/benchmarks.md, "The HTTP front's output path"):
#
#  1. loopback: bench/serve/loopback.c moves FRAME-byte frames over STREAMS loopback
#     connections, one write() per frame: what a front making one write per streamed token can
#     reach here (measured just before each front run).
#  2. front: bench/serve/front_backend.c, ty_api over a backend that computes nothing (a decode
#     step every STEP_MS for every stream, late turns delivering the steps due), linked against
#     each build's libraries; `tycho bench serve --count-only` (NEW_BUILD's) with STREAMS
#     concurrent streams of OUT tokens. Streamed tokens/s, and the front's CPU per token.
#  3. cluster streams: tycho-conductor of each build with one tycho-prefill and one tycho-decode
#     (max_batch_size STREAMS) of OLD_BUILD in both runs, so only the Conductor differs;
#     STREAMS concurrent streams: tokens/s (bound by the decode node here) and the Conductor's
#     CPU per token.
#  4. own time: the same cluster, one request at a time (16-token prompts, 4 tokens): the
#     Conductor's own time per request = the client's mean TTFT minus the nodes' window as
#     the Conductor times it (tycho_request_ttft_seconds: submit to the first TokenChunk's
#     arrival, which holds the decode node's page reservation, the prefill, the KV transfer
#     and the first decode step, and the Conductor's relay between them); the part both
#     builds time themselves (vllm:time_to_first_token_seconds minus that window); and, where
#     the build exports it, tycho_conductor_own_seconds{stage} (admit + relay + first_token).
#
# usage: bench/serve/front.sh NEW_BUILD OLD_BUILD [MODEL] [ROUNDS]
# env: STREAMS (256), OUT (128 tokens), PROMPTS (1024 front, 512 cluster), STEP_MS (2),
#      OWN_REQUESTS (1000), FRAME (190 bytes: one completion chunk of " tok")
set -eu
# The daemons prove a cluster secret to each other (docs/arch/security.md): a throwaway one
# unless the caller gives one.
if [ -z "${TYCHO_CLUSTER_SECRET_FILE:-}" ]; then
    TYCHO_CLUSTER_SECRET_FILE=$(mktemp -d)/cluster.secret
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TYCHO_CLUSTER_SECRET_FILE")
fi
export TYCHO_CLUSTER_SECRET_FILE
[ $# -ge 2 ] || { sed -n 2,25p "$0" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
NEW="$(cd "$1" && pwd)"
OLD="$(cd "$2" && pwd)"
MODEL="${3:-${TYCHO_TEST_DATA:-$ROOT/../shared}/models/stories260K/stories260K.gguf}"
ROUNDS="${4:-3}"
STREAMS="${STREAMS:-256}"
OUT="${OUT:-128}"
STEP_MS="${STEP_MS:-2}"
OWN_REQUESTS="${OWN_REQUESTS:-1000}"
FRAME="${FRAME:-190}"
PORT=18420
BENCH="$NEW/src/cli/tycho"
RES=$(mktemp -d)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] && echo "front.sh: results kept in $RES" >&2 || rm -rf "$RES"
}
trap cleanup EXIT

cpu_s() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; }
wait_http() {
    i=0
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        i=$((i + 1))
        [ "$i" -lt 400 ] || { echo "front.sh: no server on $PORT ($1)" >&2; exit 1; }
        sleep 0.05
    done
}
stop_all() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    PIDS=""
}

# front_backend linked against a build's libraries (the objects tycho-conductor links, its
# main.c swapped for ours); OLD_API: that build takes events through ty_api_backend_event.
# the Conductor's build folder (src/conductor/cluster before the re-cut of the tree)
conductor_dir() { # build_dir
    if [ -d "$1/src/conductor/CMakeFiles/tycho-conductor.dir" ]; then echo "$1/src/conductor"
    else echo "$1/src/conductor/cluster"; fi
}

build_front() { # build_dir out
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt")
    def=
    grep -q ty_api_backend_event "$src/include/tycho/api.h" && def=-DTY_FRONT_OLD
    cc -O2 -g -I"$src/include" $def -c "$ROOT/bench/serve/front_backend.c" -o "$2.o"
    cdir=$(conductor_dir "$1")
    link=$(sed "s|\"CMakeFiles/tycho-conductor.dir/main.c.o\"|$2.o|; s|-o tycho-conductor|-o $2|" \
        "$cdir/CMakeFiles/tycho-conductor.dir/link.txt")
    (cd "$cdir" && eval "$link")
}

run_front() { # name new|old
    "$RES/front-$2" "$MODEL" "$PORT" "$STEP_MS" 2>"$RES/$1-front.log" &
    pid=$!; PIDS="$pid"
    wait_http "$RES/$1-front.log"
    c0=$(cpu_s "$pid")
    "$BENCH" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "${PROMPTS:-1024}" \
        --request-rate inf --max-concurrency "$STREAMS" --random-input-len 16 \
        --random-output-len "$OUT" --random-vocab 512 --seed 1 --count-only \
        --json "$RES/$1-front.json" >/dev/null
    echo "$(cpu_s "$pid") $c0" >"$RES/$1-front.cpu"
    stop_all
}

start_cluster() { # conductor_build
    d="$RES/cluster"; rm -rf "$d"; mkdir -p "$d"
    "$(conductor_dir "$1")/tycho-conductor" --model_path="$MODEL" --listen_port="$PORT" \
        --rpc_port=0 --port_file="$d/c.ports" >"$d/c.log" 2>&1 &
    CPID=$!; PIDS="$CPID"
    i=0; until [ -s "$d/c.ports" ]; do i=$((i + 1)); [ $i -lt 400 ] || exit 1; sleep 0.05; done
    rpc=$(cut -d' ' -f2 "$d/c.ports")
    "$OLD/src/prefill/tycho-prefill" --model_path="$MODEL" --name=p0 \
        --conductor_address="127.0.0.1:$rpc" --port_file="$d/p.ports" >"$d/p.log" 2>&1 &
    PIDS="$PIDS $!"
    "$OLD/src/decode/tycho-decode" --model_path="$MODEL" --name=d0 \
        --conductor_address="127.0.0.1:$rpc" --port_file="$d/d.ports" \
        --max_batch_size="$STREAMS" >"$d/d.log" 2>&1 &
    DPID=$!; PIDS="$PIDS $DPID"
    i=0; until [ -s "$d/p.ports" ] && [ -s "$d/d.ports" ]; do
        i=$((i + 1)); [ $i -lt 400 ] || exit 1; sleep 0.05
    done
    wait_http "$d/c.log"
    sleep 1 # both nodes registered and heartbeating
}

run_cluster() { # name conductor_build
    start_cluster "$2"
    c0=$(cpu_s "$CPID"); d0=$(cpu_s "$DPID")
    "$BENCH" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "${PROMPTS:-512}" \
        --request-rate inf --max-concurrency "$STREAMS" --random-input-len 16 \
        --random-output-len "$OUT" --random-vocab 512 --seed 1 --count-only \
        --json "$RES/$1-cluster.json" >/dev/null
    echo "$(cpu_s "$CPID") $c0 $(cpu_s "$DPID") $d0" >"$RES/$1-cluster.cpu"
    curl -s "http://127.0.0.1:$PORT/metrics" >"$RES/$1-own.m0"
    "$BENCH" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts "$OWN_REQUESTS" \
        --request-rate inf --max-concurrency 1 --random-input-len 16 --random-output-len 4 \
        --random-vocab 512 --seed 2 --json "$RES/$1-own.json" >/dev/null
    curl -s "http://127.0.0.1:$PORT/metrics" >"$RES/$1-own.m1"
    stop_all
}

cc -O2 -o "$RES/loopback" "$ROOT/bench/serve/loopback.c" -lpthread
build_front "$NEW" "$RES/front-new"
build_front "$OLD" "$RES/front-old"
echo "# $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $MODEL; $STREAMS streams of $OUT" \
    "tokens; new: $NEW ($(git -C "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' \
    "$NEW/CMakeCache.txt")" describe --always --dirty)), old: $OLD ($(git -C "$(sed -n \
    's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$OLD/CMakeCache.txt")" describe --always --dirty))"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    order="new old"; [ $((r % 2)) = 1 ] || order="old new" # neither always first
    for b in $order; do
        if [ $b = new ]; then dir=$NEW; else dir=$OLD; fi
        echo "front.sh: round $r, $b" >&2
        "$RES/loopback" "$STREAMS" "$FRAME" 1 2000 >"$RES/r$r-$b-loopback.txt"
        run_front "r$r-$b" "$b"
        run_cluster "r$r-$b" "$dir"
    done
    r=$((r + 1))
done
python3 - "$RES" "$ROUNDS" <<'EOF'
import json, os, re, sys
res, rounds = sys.argv[1], int(sys.argv[2])

def metrics(path):
    out = {}
    for line in open(path):
        m = re.match(r'^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$', line.strip())
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out

def mean_ms(m0, m1, name, label=None):
    s = c = 0.0
    for (k, lab), v in m1.items():
        if label and label not in lab:
            continue
        if k == name + "_sum":
            s += v - m0.get((k, lab), 0)
        elif k == name + "_count":
            c += v - m0.get((k, lab), 0)
    return s / c * 1e3 if c else None

rows, ratios = [], {}
for r in range(1, rounds + 1):
    for b in ("new", "old"):
        p = lambda s: os.path.join(res, "r%d-%s-%s" % (r, b, s))
        lb = [float(x) for x in open(p("loopback.txt")).read().split()]
        fj = json.load(open(p("front.json")))
        fc = [float(x) for x in open(p("front.cpu")).read().split()]
        cj = json.load(open(p("cluster.json")))
        cc = [float(x) for x in open(p("cluster.cpu")).read().split()]
        oj = json.load(open(p("own.json")))
        m0, m1 = metrics(p("own.m0")), metrics(p("own.m1"))
        window = mean_ms(m0, m1, "tycho_request_ttft_seconds")
        api = mean_ms(m0, m1, "vllm:time_to_first_token_seconds")
        st = [mean_ms(m0, m1, "tycho_conductor_own_seconds", 'stage="%s"' % s)
              for s in ("admit", "relay", "first_token")]
        row = {"round": r, "build": b, "loopback_frames_s": lb[0],
               "front_ok": fj["completed"], "front_failed": fj["failed"],
               "front_tok_s": fj["output_throughput"],
               "front_cpu_us_tok": (fc[0] - fc[1]) * 1e6 / fj["total_output_tokens"],
               "front_itl_ms": fj["mean_itl_ms"],
               "cluster_failed": cj["failed"], "cluster_tok_s": cj["output_throughput"],
               "conductor_cpu_us_tok": (cc[0] - cc[1]) * 1e6 / cj["total_output_tokens"],
               "decode_cpu_us_tok": (cc[2] - cc[3]) * 1e6 / cj["total_output_tokens"],
               "own_failed": oj["failed"], "client_ttft_ms": oj["mean_ttft_ms"],
               "window_ms": window, "api_ttft_ms": api,
               "own_ms": oj["mean_ttft_ms"] - window,
               "own_timed_ms": api - window,
               "stages_ms": None if st[0] is None else st}
        rows.append(row)
print("\n| round | build | loopback frames/s (1 write each) | front tok/s | front CPU us/tok |"
      " front / loopback | cluster tok/s | Conductor CPU us/tok | client TTFT ms |"
      " nodes' window ms | Conductor own ms | own, timed by both ms | admit + relay +"
      " first_token ms |")
print("|" + "---|" * 13)
for x in rows:
    st = "-" if x["stages_ms"] is None else "%.3f + %.3f + %.3f = %.3f" % (
        *x["stages_ms"], sum(x["stages_ms"]))
    print("| %d | %s | %.0f | %.0f | %.2f | %.2f | %.0f | %.2f | %.3f | %.3f | %.3f | %.3f | %s |"
          % (x["round"], "this" if x["build"] == "new" else "old", x["loopback_frames_s"],
             x["front_tok_s"], x["front_cpu_us_tok"], x["front_tok_s"] / x["loopback_frames_s"],
             x["cluster_tok_s"], x["conductor_cpu_us_tok"], x["client_ttft_ms"],
             x["window_ms"], x["own_ms"], x["own_timed_ms"], st))
    if x["front_failed"] or x["cluster_failed"] or x["own_failed"]:
        print("# round %d %s: FAILED requests" % (x["round"], x["build"]))
for r in range(1, rounds + 1):
    n, o = [x for x in rows if x["round"] == r]
    q = {"round": r, "front_tok_s": n["front_tok_s"] / o["front_tok_s"],
         "front_cpu_per_tok": n["front_cpu_us_tok"] / o["front_cpu_us_tok"],
         "cluster_tok_s": n["cluster_tok_s"] / o["cluster_tok_s"],
         "conductor_cpu_per_tok": n["conductor_cpu_us_tok"] / o["conductor_cpu_us_tok"],
         "own_ms": n["own_ms"] / o["own_ms"], "own_timed_ms": n["own_timed_ms"] / o["own_timed_ms"]}
    print("# round %d this/old: front tok/s %.2fx, front CPU/tok %.2fx, cluster tok/s %.2fx,"
          " Conductor CPU/tok %.2fx, Conductor own time %.2fx (timed by both: %.2fx)" % (
              r, q["front_tok_s"], q["front_cpu_per_tok"], q["cluster_tok_s"],
              q["conductor_cpu_per_tok"], q["own_ms"], q["own_timed_ms"]))
    print(json.dumps(q))
EOF
