#!/bin/sh
# `tycho check-config --role ROLE` exits 2 with the field in its one-line error for every
# malformed file in tests/data/config/ and prints "FILE: ok" with exit 0 for every example in
# configs/, configs/cluster/ and configs/store/; and for every one of those files the daemon
# that ROLE names, run as `DAEMON --config FILE --check-config`, exits with the same code and
# prints the very same line (both use the daemon's one settings table).
set -u
B="$TYCHO_BUILD_DIR"
tycho="$B/src/cli/tycho"
[ -x "$tycho" ] || { echo "no $tycho"; exit 77; }
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

# The daemon of a role, as a command line prefix ("" when that daemon is not built).
daemon_of() {
    case "$1" in
        conductor) d="$B/src/conductor/tycho-conductor" ;;
        prefill) d="$B/src/prefill/tycho-prefill" ;;
        decode) d="$B/src/decode/tycho-decode" ;;
        store) d="$B/src/store/tycho-store" ;;
        serve) echo "$tycho serve"; return ;;
        *) echo ""; return ;;
    esac
    [ -x "$d" ] && echo "$d" || echo ""
}

# check FILE WANT_RC: both checks must agree with each other and exit WANT_RC.
check() {
    f=$1 want=$2
    role=$(sed -n 's/^# role: //p' "$f")
    [ -n "$role" ] || { fail "$f: no '# role:' header"; return; }
    out=$("$tycho" check-config --role "$role" --config "$f" 2>&1)
    rc=$?
    [ "$rc" -eq "$want" ] || { fail "$f: tycho check-config exit $rc (want $want): $out"; return; }
    d=$(daemon_of "$role")
    if [ -z "$d" ]; then
        fail "$f: no daemon built for role $role"; return
    fi
    dout=$($d --config "$f" --check-config 2>&1)
    drc=$?
    [ "$drc" -eq "$rc" ] && [ "$dout" = "$out" ] ||
        { fail "$f: $d exit $drc: '$dout' but tycho check-config exit $rc: '$out'"; return; }
    [ "$want" -ne 0 ] || [ "$out" = "$f: ok" ] || { fail "$f: $out"; return; }
    echo "ok   $role $(basename "$f"): $out"
}

for f in "$TYCHO_SOURCE_DIR"/tests/data/config/*.yaml; do
    check "$f" 2
    field=$(sed -n 's/^# expect: line [0-9]*, field *//p' "$f")
    case "$out" in
        *"$f"*) ;;
        *) fail "$f: file not named: $out" ;;
    esac
    if [ -n "$field" ]; then
        case "$out" in
            *": $field: "*) ;;
            *) fail "$f: field $field not named: $out" ;;
        esac
    fi
done
n=0
for f in "$TYCHO_SOURCE_DIR"/configs/*.yaml "$TYCHO_SOURCE_DIR"/configs/cluster/*.yaml \
         "$TYCHO_SOURCE_DIR"/configs/store/*.yaml; do
    check "$f" 0
    n=$((n + 1))
done
[ "$n" -ge 8 ] || fail "only $n example files"
# every role's examples exist
for role in conductor serve prefill decode store; do
    grep -lq "^# role: $role\$" "$TYCHO_SOURCE_DIR"/configs/*.yaml \
        "$TYCHO_SOURCE_DIR"/configs/cluster/*.yaml "$TYCHO_SOURCE_DIR"/configs/store/*.yaml ||
        fail "no example for role $role"
done
# the example of one daemon is not accepted by another's table
out=$("$tycho" check-config --role conductor --config "$TYCHO_SOURCE_DIR/configs/cluster/prefill.yaml" 2>&1)
case "$out" in *": name: unknown key"*) ;; *) fail "prefill.yaml as conductor: $out" ;; esac
# flags and environment go through the same checks
conductor="$TYCHO_SOURCE_DIR/configs/conductor.yaml"
out=$(TYCHO_LISTEN_PORT=70000 "$tycho" check-config --role conductor --config "$conductor" 2>&1)
[ $? -eq 2 ] && case "$out" in "TYCHO_LISTEN_PORT: listen_port: "*) true ;; *) false ;; esac ||
    fail "env override: $out"
out=$("$tycho" check-config --role conductor --config "$conductor" \
      --limits.max-body-bytes=2K --dump-config 2>&1)
case "$out" in *"max_body_bytes: 2K"*) ;; *) fail "flag override: $out" ;; esac
out=$("$tycho" check-config --role serve --config "$TYCHO_SOURCE_DIR/configs/serve.yaml" \
      --engine.threads=3 --dump-config 2>&1)
case "$out" in *"threads: 3"*) ;; *) fail "serve engine flag: $out" ;; esac
# tycho serve's short flags land in its engine section
out=$("$tycho" serve --config "$TYCHO_SOURCE_DIR/configs/serve.yaml" --threads 0 --check-config 2>&1)
[ $? -eq 2 ] && case "$out" in *"engine.threads: "*) true ;; *) false ;; esac ||
    fail "serve --threads 0: $out"
# the engine's backend: --backend lands in engine.backend; an unknown one is refused by name
out=$("$tycho" serve --config "$TYCHO_SOURCE_DIR/configs/serve.yaml" --backend cuda --device 1 \
      --dump-config 2>&1)
case "$out" in *"backend: cuda"*"cuda_device: 1"*) ;; *) fail "serve --backend cuda: $out" ;; esac
out=$("$tycho" serve --config "$TYCHO_SOURCE_DIR/configs/serve.yaml" --backend tpu --check-config 2>&1)
[ $? -eq 2 ] && case "$out" in *"engine.backend: "*) true ;; *) false ;; esac ||
    fail "serve --backend tpu: $out"
[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
