#!/usr/bin/env bash
# What `make test` (and `make test-v2`) needs, installed when it is
# missing; `make test` runs it first, and CI on a fresh machine. Every
# check comes before any install: on a machine with everything it installs
# nothing and takes about a second. What cannot be installed stops it,
# named, with how to get it: no test is skipped for want of a tool.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

# What kilnd needs to build and run (Go, mkfs.ext4).
ensure_go

# Each tool the tests run, and the Debian package that has it:
# setsid and stty drive kiln's terminals in its tests; mkfs.ext4 makes the
# sandboxes' disks; chromium (Debian's) drives the web console's test in
# a real browser; the benchmark's own test runs the comparison with tmux,
# supervisord, s6-log, dtach and runc; prometheus ships promtool, which
# checks a scrape of kilnd's metrics; mkfs.xfs makes the XFS state
# directory the snapshot tests share extents on; QEMU boots the pure cgroup v2 kernel
# of make test-v2; fish and zsh run kiln's completion scripts.
tools=(
	make:make setsid:util-linux stty:coreutils mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs python3:python3
	tmux:tmux supervisord:supervisor s6-log:s6 dtach:dtach runc:runc
	chromium:chromium promtool:prometheus qemu-system-x86_64:qemu-system-x86
	fish:fish zsh:zsh
)
# The Python SDK's virtual environment, test runner, type checker, build
# backend, and the WebSocket server its tests hold its own client to.
python=(python3-venv python3-pytest python3-websockets python3-setuptools mypy)

need=()
for t in "${tools[@]}"; do
	command -v "${t%%:*}" >/dev/null 2>&1 || need+=("${t#*:}")
done
# busybox-static makes the root filesystem of the rootfs sandbox test and
# the initramfs of make test-v2's VM.
[ -x /bin/busybox ] || need+=(busybox-static)
for pkg in "${python[@]}"; do
	dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	apt_install "${need[@]}"
fi

# Node.js 20 or later with npm builds and tests the TypeScript SDK and the
# console, drives kiln mcp with the official MCP client, and runs the
# OpenAPI linter and the AsyncAPI parser.
ensure_node

# gVisor's runsc for the gvisor runtime and its tests.
ensure_runsc

# The OpenAPI document's linter, pinned in tools/openapi's lock file (a
# few seconds): the api package's test runs it, and fails without. npm
# writes node_modules/.package-lock.json last, so one newer than the lock
# file is an install of it (the Makefile's rule for the other packages).
if [ ! tools/openapi/node_modules/.package-lock.json -nt tools/openapi/package-lock.json ]; then
	say "npm ci in tools/openapi (the OpenAPI linter)"
	(cd tools/openapi && npm ci --no-audit --no-fund --loglevel=error)
fi

# The AsyncAPI document's parser, pinned in tools/asyncapi's lock file: the
# api package's test validates the WebSockets' document with it, and fails
# without it in CI.
if [ ! tools/asyncapi/node_modules/.package-lock.json -nt tools/asyncapi/package-lock.json ]; then
	say "npm ci in tools/asyncapi (the AsyncAPI parser)"
	(cd tools/asyncapi && npm ci --no-audit --no-fund --loglevel=error)
fi
