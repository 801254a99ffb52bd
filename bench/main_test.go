package main

import (
	"os"
	"testing"

	"github.com/sandkiln/sandkiln/internal/roles"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The throughput cases re-execute the test binary as their child.
	if isChild() {
		os.Exit(childMain())
	}
	roles.PlayIfReexecuted()
	goleak.VerifyTestMain(m)
}
