package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The throughput cases re-execute the test binary as their child.
	if isChild() {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}
