#!/usr/bin/env bash
# What building and running kilnd needs, installed when it is missing:
# Go (any from 1.21 on, which fetches the Go go.mod names) and mkfs.ext4
# for the sandboxes' disk quotas. With RUNSC=1, gVisor's runsc too, for
# sandboxes of the gvisor runtime (built from source, about two minutes,
# so not by default: kilnd runs without it and says so).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

ensure_go

# kilnd runs without it, with no disk quotas, and says so; it is small
# and most Debian systems have it already.
command -v mkfs.ext4 >/dev/null 2>&1 || apt_install e2fsprogs

if [ "${RUNSC:-}" = 1 ]; then
	ensure_runsc
elif ! command -v runsc >/dev/null 2>&1; then
	say "no runsc: sandboxes of the gvisor runtime are not available (make run RUNSC=1 builds it, about two minutes)"
fi
