#!/bin/sh
# Every `tycho` command and every daemon answers --help on stdout with its usage and exits 0
# (an operator's first step; a script that probes a binary with --help must not see a failure).
# usage: check_help.sh BUILD_DIR
B=${1:?usage: check_help.sh BUILD_DIR}
TYCHO=$B/src/cli/tycho
fail=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
check() { # name, command...
    name=$1
    shift
    "$@" --help >"$out" 2>/dev/null
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "FAIL: $name --help exited $rc"
        fail=1
    elif ! grep -qi "usage" "$out"; then
        echo "FAIL: $name --help printed no usage on stdout"
        fail=1
    else
        echo "ok: $name --help"
    fi
}
check tycho "$TYCHO"
cmds=$("$TYCHO" --help | awk '/^commands:/ {on = 1; next} on && /^  [a-z]/ {print $1}')
[ -n "$cmds" ] || { echo "FAIL: tycho --help lists no commands"; exit 1; }
for c in $cmds; do
    check "tycho $c" "$TYCHO" "$c"
done
for d in conductor prefill decode store; do
    check "tycho-$d" "$B/src/$d/tycho-$d"
done
exit $fail
