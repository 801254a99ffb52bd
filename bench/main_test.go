package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/internal/agent"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

func TestMain(m *testing.M) {
	// The throughput cases re-execute the test binary as their child.
	if isChild() {
		os.Exit(childMain())
	}
	if sandbox.IsAgent() {
		os.Exit(agent.Main())
	}
	goleak.VerifyTestMain(m)
}
