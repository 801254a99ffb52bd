#!/usr/bin/env bash
# `make run`: build kilnd into the checkout (./kilnd, and ./kiln), start
# it in the foreground, make a demo sandbox, and say where the web console is and
# what to type next. Ctrl-C stops kilnd; its sandboxes run on, and the
# next kilnd on the same state directory adopts them.
#
# STATE_DIR (default /var/lib/sandkiln, or $KILN_STATE_DIR) and LISTEN
# (default 127.0.0.1:7777, loopback: the console and the API with the
# token) are kilnd's --state-dir and --listen.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

state=${STATE_DIR:-${KILN_STATE_DIR:-/var/lib/sandkiln}}
listen=${LISTEN:-127.0.0.1:7777}
# ./kiln below finds kilnd's socket in the state directory.
export KILN_STATE_DIR=$state
unset KILN_ADDR
# What the user types: kiln's default state directory needs no flag.
kiln=./kiln
[ "$state" = /var/lib/sandkiln ] || kiln="./kiln --state-dir $state"
[ "$(id -u)" = 0 ] || die "kilnd needs root (its sandboxes are namespaces): run make run as root, or with sudo"
# Each sandbox is in a user namespace of its own, which a chroot or a
# container may refuse even to root; kilnd would start and then fail
# every create with "operation not permitted".
if ! err=$(unshare --user true 2>&1); then
	die "kilnd's sandboxes need user namespaces, and this system refuses them (unshare --user: ${err##*: }): in a chroot or a container? run kilnd on the host or in a virtual machine"
fi

# A second kilnd on the same state directory would fight the first for
# its socket and its sandboxes; and the build below would replace the
# binary the running one starts its sandboxes' agents from.
if [ -x ./kiln ] && ./kiln version >/dev/null 2>&1; then
	die "a kilnd already answers on $state/kilnd.sock: stop it first (or use it: ./kiln sandbox ls)"
fi

# ./kilnd and ./kiln, statically linked (the Makefile says why). The
# first build compiles every package, and go build is silent meanwhile.
[ -x ./kilnd ] || say "building ./kilnd and ./kiln: the first build compiles every package, a few minutes on a small machine, and says nothing until it is done"
make --no-print-directory build

say "starting ./kilnd --state-dir $state --listen $listen (its log follows)"
./kilnd --state-dir "$state" --listen "$listen" &
kilnd=$!
# Ctrl-C reaches kilnd too (the same process group); TERM sent to this
# script alone is passed on. Either way the script waits for kilnd's end.
trap 'kill -TERM "$kilnd" 2>/dev/null || true' INT TERM
# And a script that stops early (the demo could not be made) stops kilnd
# with it, rather than leave it running, out of sight, on the port.
stop_kilnd() {
	if kill -0 "$kilnd" 2>/dev/null; then
		say "stopping kilnd"
		kill -TERM "$kilnd" 2>/dev/null || true
		wait "$kilnd" || true
	fi
}
trap stop_kilnd EXIT

# Ready when its socket answers; gone if it stopped (a port in use, not
# root), in which case its log above says why.
for _ in $(seq 300); do
	if ! kill -0 "$kilnd" 2>/dev/null; then
		wait "$kilnd" && rc=0 || rc=$?
		die "kilnd stopped (exit $rc) before it answered; its log above says why"
	fi
	./kiln version >/dev/null 2>&1 && break
	sleep 0.1
done
./kiln version >/dev/null 2>&1 || die "kilnd did not answer on $state/kilnd.sock within 30 s"

# The demo sandbox, by name: made once, found again by the next run
# (sandboxes outlive kilnd). One no longer running is made anew.
if st=$(./kiln sandbox inspect demo 2>/dev/null | sed -n 's/^ *"state": *"\([a-z_]*\)".*/\1/p' | sed -n 1p) && [ -n "$st" ]; then
	if [ "$st" != running ]; then
		say "the demo sandbox is $st: making it anew"
		./kiln sandbox rm demo >/dev/null
		./kiln sandbox create --name demo >/dev/null || die "the demo sandbox could not be made; kilnd's log above says why"
	fi
else
	./kiln sandbox create --name demo >/dev/null || die "the demo sandbox could not be made; kilnd's log above says why"
fi

gvisor="gVisor sandboxes: not available here (make run RUNSC=1 builds runsc, about two minutes)"
if ./kilnd --runtimes | grep -q '^gvisor  *available'; then
	gvisor="gVisor sandboxes: available ($kiln sandbox create --runtime gvisor)"
fi

cat <<EOF

kilnd is running (pid $kilnd): state in $state, API on $state/kilnd.sock and http://$listen/.

  Web console:  http://$listen/
  Token:        $(cat "$state/token")
                (the console asks for it: paste it there; it is kilnd's file $state/token)

A sandbox named demo is ready. In another terminal, in $ROOT:

$(printf '  %-30s # %s\n' \
	"$kiln sandbox ls" "the sandboxes: demo" \
	"$kiln exec demo -- uname -a" "a command in the demo sandbox" \
	"$kiln run --rm -- echo hi" "a sandbox for one command, removed after")

  $gvisor
  SDKs over TCP: export KILN_ADDR=$listen KILN_TOKEN=\$(cat $state/token)

Ctrl-C stops kilnd; its sandboxes run on ($kiln sandbox rm demo removes the demo),
and the next make run adopts them.

EOF

# Until kilnd ends: a trapped signal interrupts wait, so wait again.
while kill -0 "$kilnd" 2>/dev/null; do
	wait "$kilnd" || true
done
wait "$kilnd" && rc=0 || rc=$?
exit "$rc"
