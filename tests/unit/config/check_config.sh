#!/bin/sh
# `tycho check-config` exits 2 with the field in its one-line error for every malformed file in
# tests/data/config/, and prints "FILE: ok" with exit 0 for every example in configs/.
set -u
tycho="$TYCHO_BUILD_DIR/src/cli/tycho"
[ -x "$tycho" ] || { echo "no $tycho"; exit 77; }
fails=0
for f in "$TYCHO_SOURCE_DIR"/tests/data/config/*.yaml; do
    role=$(sed -n 's/^# role: //p' "$f")
    field=$(sed -n 's/^# expect: line [0-9]*, field *//p' "$f")
    err=$("$tycho" check-config --role "$role" --config "$f" 2>&1 >/dev/null)
    rc=$?
    if [ "$rc" -ne 2 ]; then
        echo "FAIL $f: exit $rc (want 2): $err"; fails=$((fails + 1)); continue
    fi
    case "$err" in
        *"$f"*) ;;
        *) echo "FAIL $f: file not named: $err"; fails=$((fails + 1)); continue ;;
    esac
    if [ -n "$field" ]; then
        case "$err" in
            *": $field: "*) ;;
            *) echo "FAIL $f: field $field not named: $err"; fails=$((fails + 1)); continue ;;
        esac
    fi
    echo "ok   $(basename "$f"): $err"
done
for f in "$TYCHO_SOURCE_DIR"/configs/*.yaml; do
    role=$(sed -n 's/^# role: //p' "$f")
    out=$("$tycho" check-config --role "$role" --config "$f" 2>&1)
    rc=$?
    if [ "$rc" -ne 0 ] || [ "$out" != "$f: ok" ]; then
        echo "FAIL $f: exit $rc: $out"; fails=$((fails + 1))
    else
        echo "ok   $out"
    fi
done
# flags and environment go through the same checks
out=$(TYCHO_LISTEN_PORT=0 "$tycho" check-config --role conductor \
      --config "$TYCHO_SOURCE_DIR/configs/conductor.yaml" 2>&1)
[ $? -eq 2 ] && case "$out" in "TYCHO_LISTEN_PORT: listen_port: "*) true ;; *) false ;; esac ||
    { echo "FAIL env override: $out"; fails=$((fails + 1)); }
out=$("$tycho" check-config --role conductor --config "$TYCHO_SOURCE_DIR/configs/conductor.yaml" \
      --limits.max-body-bytes=2K --dump-config 2>&1)
case "$out" in *"max_body_bytes: 2K"*) ;; *) echo "FAIL flag override: $out"; fails=$((fails + 1)) ;; esac
# the daemons' own check mode: every conductor-role malformed file makes tycho-conductor exit 2
daemon="$TYCHO_BUILD_DIR/src/conductor/cluster/tycho-conductor"
if [ -x "$daemon" ]; then
    for f in "$TYCHO_SOURCE_DIR"/tests/data/config/*.yaml; do
        [ "$(sed -n 's/^# role: //p' "$f")" = conductor ] || continue
        err=$("$daemon" --config "$f" --check-config 2>&1 >/dev/null)
        rc=$?
        [ "$rc" -eq 2 ] && case "$err" in *"$f"*) true ;; *) false ;; esac ||
            { echo "FAIL tycho-conductor $f: exit $rc: $err"; fails=$((fails + 1)); continue; }
        echo "ok   tycho-conductor $(basename "$f"): exit 2"
    done
    out=$("$daemon" --config "$TYCHO_SOURCE_DIR/configs/cluster/conductor.yaml" --check-config 2>&1)
    [ $? -eq 0 ] || { echo "FAIL tycho-conductor good config: $out"; fails=$((fails + 1)); }
fi
[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
