#!/bin/sh
# The node daemons link neither the API front, nor the scheduler, nor the KV pool's master:
# no symbol defined by libty_api.a, libty_sched.a or the store library's master.c is defined in
# tycho-prefill or tycho-decode. Usage: check_node_links.sh BUILD_DIR
set -eu
b=${1:?usage: check_node_links.sh BUILD_DIR}
command -v nm >/dev/null 2>&1 || { echo "skip: no nm"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# defined global symbols of an archive, or of one member of it ("lib.a:member")
defs() { nm -g --defined-only "$@" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u; }
member_defs() {
  nm -g --defined-only -A "$1" 2>/dev/null | awk -v m="$2" -F'[: ]+' \
    '$2 == m && NF >= 4 { print $NF }' | sort -u
}
defs "$b/src/api/libty_api.a" > "$tmp/api"
defs "$b/src/sched/libty_sched.a" > "$tmp/sched"
member_defs "$b/src/store/libty_store.a" master.c.o > "$tmp/master"
for f in api sched master; do
  [ -s "$tmp/$f" ] || { echo "FAIL: no symbols found for $f (library moved?)"; exit 1; }
done
cat "$tmp/api" "$tmp/sched" "$tmp/master" | sort -u > "$tmp/banned"
rc=0
for d in prefill decode; do
  bin="$b/src/$d/tycho-$d"
  [ -x "$bin" ] || { echo "FAIL: $bin not built"; exit 1; }
  defs "$bin" > "$tmp/$d"
  [ -s "$tmp/$d" ] || { echo "FAIL: no symbols in $bin (stripped?)"; exit 1; }
  comm -12 "$tmp/banned" "$tmp/$d" > "$tmp/$d.bad"
  if [ -s "$tmp/$d.bad" ]; then
    echo "FAIL: tycho-$d links $(wc -l < "$tmp/$d.bad") symbols of the API front, the scheduler or the store master:"
    head -20 "$tmp/$d.bad"
    rc=1
  else
    echo "ok: tycho-$d: none of $(wc -l < "$tmp/banned") API/scheduler/store-master symbols among its $(wc -l < "$tmp/$d")"
  fi
done
# the check itself sees a library that is linked: tycho-conductor links the scheduler
defs "$b/src/conductor/tycho-conductor" | comm -12 "$tmp/sched" - | grep -q . ||
  { echo "FAIL: the check finds no scheduler symbol in tycho-conductor either"; rc=1; }
exit $rc
