# The README's commands. `make test` is what CI runs.
GO ?= go
STATICCHECK = $(GO) tool -modfile=tools/go.mod staticcheck

.PHONY: test check bench fuzz

# The whole test suite: formatting, vet, staticcheck, every test under the
# race detector, and each benchmark once so it keeps working.
test: check
	$(GO) test -race -count=1 ./...
	$(GO) test -run='^$$' -bench=. -benchtime=1x ./...

check:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

# The engine's figures beside their baselines, written to bench/results/.
bench:
	$(GO) run ./bench -out bench/results

# A short run of every fuzz target.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			$(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=20s $$pkg || exit 1; \
		done; \
	done
