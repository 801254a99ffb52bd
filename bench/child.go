package main

import (
	"fmt"
	"os"
	"strconv"
)

// The writing child is this binary re-executed with these variables set, so
// the baselines and the engine run the very same workload.
const (
	childEnv   = "SANDKILN_BENCH_CHILD"
	childWrite = "write"
	bytesEnv   = "SANDKILN_BENCH_BYTES"
	writeSize  = 64 << 10 // bytes per write call
)

func isChild() bool { return os.Getenv(childEnv) != "" }

// childEnviron is the environment that makes this binary write size bytes.
// A race-enabled build (the test binary under -race) would otherwise sleep a
// second before exiting; other builds ignore GORACE.
func childEnviron(size int64) []string {
	return append(os.Environ(), childEnv+"="+childWrite, bytesEnv+"="+strconv.FormatInt(size, 10), "GORACE=atexit_sleep_ms=0")
}

// childMain writes the requested bytes to stdout in 64 KiB writes from one
// preallocated buffer and returns the exit code.
func childMain() int {
	if mode := os.Getenv(childEnv); mode != childWrite {
		fmt.Fprintf(os.Stderr, "bench child: %s=%q: unknown mode\n", childEnv, mode)
		return 2
	}
	size, err := strconv.ParseInt(os.Getenv(bytesEnv), 10, 64)
	if err != nil || size < 0 {
		fmt.Fprintf(os.Stderr, "bench child: %s=%q: not a byte count\n", bytesEnv, os.Getenv(bytesEnv))
		return 2
	}
	buf := make([]byte, writeSize)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	for size > 0 {
		n := min(size, int64(len(buf)))
		if _, err := os.Stdout.Write(buf[:n]); err != nil {
			fmt.Fprintf(os.Stderr, "bench child: write with %d bytes left: %v\n", size, err)
			return 1
		}
		size -= n
	}
	return 0
}
