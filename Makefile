# The README's commands. `make test` is what CI runs. `make` alone, or
# `make help`, lists them.
GO ?= go
STATICCHECK = $(GO) tool -modfile=tools/go.mod staticcheck
SDK = sdk/typescript

# Go 1.21 and later fetch the Go that go.mod names, unless GOTOOLCHAIN is
# local (as a go.env or `go env -w` may set it); the environment says auto
# unless it says otherwise itself.
export GOTOOLCHAIN ?= auto
# Go's own install puts it in /usr/local/go/bin, which sudo's PATH leaves
# out; last in PATH, so that any other go comes first.
export PATH := $(PATH):/usr/local/go/bin

.PHONY: help run build sdk-pack test test-deps test-v2 check bench compare fuzz faults soak sdk-test console-test python-test mcp-test

help:
	@echo 'make run        install what kilnd needs (Go, mkfs.ext4), build ./kilnd and ./kiln, start kilnd'
	@echo '                on 127.0.0.1:7777 with a demo sandbox, print the console URL and what to type'
	@echo '                next (as root; Ctrl-C stops it). RUNSC=1 also builds gVisor'"'"'s runsc (2 min)'
	@echo 'make build      build ./kilnd and ./kiln, statically linked'
	@echo 'make test       install what the tests need (scripts/test-deps.sh), then run them all'
	@echo 'make test-v2    the cgroup tests on a pure cgroup v2 kernel, in a VM'
	@echo 'make check      gofmt, go vet and staticcheck'
	@echo 'make sdk-pack   build the TypeScript SDK and pack it into dist/, for npm install'
	@echo 'make sdk-test, console-test, python-test, mcp-test, faults, soak, fuzz, bench, compare:'
	@echo '                parts of make test, and more; each is described in the Makefile'

# Set-up and run in one command on a fresh Debian 12 or 13, as root:
# what is missing is installed and said (scripts/run-deps.sh), kilnd is
# built and started in the foreground (scripts/run.sh). STATE_DIR and
# LISTEN are kilnd's --state-dir and --listen.
run:
	scripts/run-deps.sh
	scripts/run.sh

# kilnd linked statically (CGO_ENABLED=0): each sandbox runs kilnd's
# binary as its agent, and one made from an image has none of the host's
# libraries. Into the checkout, where .gitignore leaves them out.
build:
	CGO_ENABLED=0 $(GO) build -o kilnd ./cmd/kilnd
	CGO_ENABLED=0 $(GO) build -o kiln ./cmd/kiln

# The TypeScript SDK as npm would install it from a registry: built, and
# packed into dist/ for `npm install ./dist/sandkiln-sdk-VERSION.tgz`.
sdk-pack: $(SDK)/node_modules/.package-lock.json
	cd $(SDK) && npm run --silent build
	mkdir -p dist
	@tgz=$$(cd $(SDK) && npm pack --silent --pack-destination ../../dist | tail -n 1) && \
	echo "packed: $(CURDIR)/dist/$$tgz" && \
	echo "install it into a project with: npm install $(CURDIR)/dist/$$tgz" && \
	echo "(on Node 20, add ws: npm install $(CURDIR)/dist/$$tgz ws; Node 22 and later have their own WebSocket)"

# The whole test suite: formatting, vet, staticcheck, every test under the
# race detector (the interop module's too: sandkiln's files and streams
# read by the tools users read them with), and each benchmark once so it
# keeps working. A package's tests may take longer than go test's 10
# minutes on a loaded 2-core machine (the daemon's, with real sandboxes);
# the timeout is a bound against a hang. Four of a package's parallel
# tests run at once however many CPUs there are (go test's default is
# their number): the sandbox, daemon and client tests mostly wait, on
# sandboxes starting, processes and grace periods, not on a CPU. What it
# needs is installed first.
test: test-deps
	$(MAKE) check
	$(GO) test -race -count=1 -timeout=30m -parallel=4 ./...
	cd interop && $(GO) test -race -count=1 -timeout=30m ./...
	$(GO) test -run='^$$' -bench=. -benchtime=1x ./...
	$(MAKE) sdk-test
	$(MAKE) console-test
	$(MAKE) python-test
	$(MAKE) mcp-test

# What the tests need, installed when it is missing (a no-op when all is
# there): Debian's packages, Go, Node.js 20 or later, gVisor's runsc, the
# OpenAPI linter and the AsyncAPI parser. `make test` runs it first; CI on a fresh machine too.
test-deps:
	scripts/test-deps.sh

# The cgroup tests on a pure cgroup v2 kernel, as most users' hosts are
# (this one keeps its controllers on v1): Debian's kernel, downloaded and
# unpacked into .cache/v2vm, booted with cgroup_no_v1=all under QEMU's TCG,
# runs the sandbox package's limit and out-of-memory tests and the daemon's
# lifecycle tests (about two minutes). Needs qemu-system-x86 and
# busybox-static; not part of `make test`, so that stays fast.
test-v2:
	$(GO) run ./internal/v2vm

# The TypeScript SDK: built with tsc, its suite run against a real kilnd on
# Node 20 (with ws), Node 22 (its own WebSocket), Bun and Deno, and its npm
# pack installed into an empty project. Node 22, Bun and Deno come from
# npm, pinned in its lock file.
sdk-test: $(SDK)/node_modules/.package-lock.json
	cd $(SDK) && npm run --silent build && npm run --silent test:all

# Node.js 20 or later first, installed when missing (make sdk-pack after
# make run alone, which needs none).
$(SDK)/node_modules/.package-lock.json: $(SDK)/package-lock.json
	scripts/node-deps.sh
	cd $(SDK) && npm ci --no-audit --no-fund --loglevel=error

# The web console: built with Vite into internal/console/dist, which kilnd
# embeds and the repository keeps (so that a clone builds kilnd without
# npm); the build must leave it as committed. Then it is driven in
# headless Chromium (Debian's, by playwright-core) against a real kilnd.
CONSOLE = web/console
console-test: $(CONSOLE)/node_modules/.package-lock.json
	cd $(CONSOLE) && npm run --silent build
	@if [ -n "$$(git status --porcelain -- internal/console/dist)" ]; then \
		echo "internal/console/dist is not what web/console builds: commit the build"; git status --short -- internal/console/dist; exit 1; fi
	cd $(CONSOLE) && npm test

$(CONSOLE)/node_modules/.package-lock.json: $(CONSOLE)/package-lock.json
	cd $(CONSOLE) && npm ci --no-audit --no-fund --loglevel=error

# The Python SDK: installed into a fresh virtual environment of Debian's
# Python, which sees Debian's pytest, mypy, setuptools and websockets (no
# package index is needed, and the package needs none of them to run);
# checked with mypy --strict, the installed package and the examples that
# use it; then its suite run against a real kilnd.
PYSDK = sdk/python
PYVENV = .cache/python-venv
python-test:
	rm -rf $(PYVENV) $(PYSDK)/build $(PYSDK)/src/sandkiln.egg-info
	/usr/bin/python3 -m venv --system-site-packages $(PYVENV)
	$(PYVENV)/bin/python -m pip install --quiet --no-index --disable-pip-version-check --no-build-isolation ./$(PYSDK)
	$(PYVENV)/bin/python -m mypy --strict --cache-dir $(PYVENV)/mypy -p sandkiln
	$(PYVENV)/bin/python -m mypy --strict --cache-dir $(PYVENV)/mypy $(PYSDK)/examples
	cd $(PYSDK) && ../../$(PYVENV)/bin/python -m pytest -q -p no:cacheprovider tests

# kiln mcp (spawned, on stdio) and kilnd's /mcp (over HTTP, with the
# token) driven by the official TypeScript MCP client,
# @modelcontextprotocol/sdk, pinned in its lock file, against a real
# kilnd: the tools listed, a build's 10,000 lines paged by offsets, each
# exactly once, and bad arguments answered as tool errors.
MCP = interop/mcp
mcp-test: $(MCP)/node_modules/.package-lock.json
	cd $(MCP) && npm test

$(MCP)/node_modules/.package-lock.json: $(MCP)/package-lock.json
	cd $(MCP) && npm ci --no-audit --no-fund --loglevel=error

check:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd interop && $(GO) vet ./... && $(GO) tool -modfile=../tools/go.mod staticcheck ./...

# The engine's figures beside their baselines, written to bench/results/;
# kilnd linked statically, as the README runs it. The cluster section runs
# four processes of ./kilnd (three of them a cluster), built first.
bench: build $(SDK)/node_modules/.package-lock.json
	cd $(SDK) && npm run --silent build
	CGO_ENABLED=0 $(GO) run ./bench -kilnd ./kilnd -out bench/results

# sandkiln beside cmd > file, a pipe, supervisord, s6-log, tmux, dtach,
# runc and runsc on the same input, written to bench/results/<date>-compare.md.
# The other tools come from Debian's archive; missing ones are installed
# when apt-get can, else left out of the table and named in it.
COMPARE_TOOLS = supervisord:supervisor s6-log:s6 dtach:dtach tmux:tmux runc:runc runsc:runsc busybox:busybox-static
compare:
	@missing=""; for t in $(COMPARE_TOOLS); do \
		command -v $${t%%:*} >/dev/null 2>&1 || missing="$$missing $${t#*:}"; \
	done; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing:$$missing"; apt-get install -y -qq $$missing >/dev/null || true; \
	fi
	$(GO) run ./bench -only compare -out bench/results

# The fault suite alone (it is also part of `make test`): kilnd killed
# mid-stream, an agent killed, the capture directory full, read-only or a
# link, limits hit, stalled watchers, clients gone mid-write, a delete on a
# full state directory or of a fork bomb, and more.
faults:
	$(GO) test -race -count=1 -run '^(TestKill9MidStream|TestRestartWithoutLoss|TestAgentKilled|TestCaptureDirectory(Full|ReadOnly|ReplacedByLink)|TestWatcherStallsMidReplay|TestStdinRetryAfterDisconnect|TestStdoutClosedWhileRunning|TestLimitsSpareOtherSandboxes|TestDeleteUnfinished|TestForkBombDeleted)$$' ./internal/daemon/
	$(GO) test -race -count=1 -run '^(TestLimits|TestOutOfMemoryNeverKillsTheAgent)$$' ./internal/sandbox/
	$(GO) test -race -count=1 -run '^(TestOutputClosedButStillRunning|TestStalledReaderBesideFastOne)$$' ./internal/process/
	$(GO) test -race -count=1 -run '^(TestFullDiskEndIsExactAndLossy|TestStartRefused|TestKilledDuringCapture|TestStuckWriterNeverBlocksTheWorkload)$$' ./internal/capture/

# The soak's long form: ten minutes of sandboxes, processes and watchers
# attaching and detaching at random (`make test` runs five seconds of it).
SOAK ?= 10m
soak:
	$(GO) test -race -count=1 -run '^TestSoak$$' -timeout=0 ./internal/daemon/ -soak=$(SOAK) -v

# A short run of every fuzz target.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			$(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=20s $$pkg || exit 1; \
		done; \
	done
