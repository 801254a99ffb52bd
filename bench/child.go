package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// The writing child is this binary re-executed with these variables set, so
// the baselines and the engine run the very same workload.
const (
	childEnv   = "SANDKILN_BENCH_CHILD"
	childWrite = "write"
	childRead  = "read" // reads stdin to its end in 256 KiB reads and prints the count
	bytesEnv   = "SANDKILN_BENCH_BYTES"
	writeEnv   = "SANDKILN_BENCH_WRITE" // bytes per write call (default writeSize)
	lineEnv    = "SANDKILN_BENCH_LINE"  // bytes per line, newline included (default: no newlines)
	stampEnv   = "SANDKILN_BENCH_STAMP" // a file to write the child's start time to (Unix ns)
	writeSize  = 64 << 10
)

// shape is what the child writes: write-sized calls of line-sized lines.
type shape struct {
	name  string
	write int // bytes per write call
	line  int // bytes per line, newline included; 0: no newlines
}

// bytes is the child's total for a requested size: whole writes of whole
// lines.
func (s shape) bytes(size int64) int64 {
	if s.line > 0 {
		return size / int64(s.line) * int64(s.line)
	}
	return size
}

func (s shape) environ(size int64, stamp string) []string {
	env := append(childEnviron(s.bytes(size)), writeEnv+"="+strconv.Itoa(s.write), lineEnv+"="+strconv.Itoa(s.line))
	if stamp != "" {
		env = append(env, stampEnv+"="+stamp)
	}
	return env
}

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
	switch os.Getenv(childEnv) {
	case childSyscalls:
		return syscallsMain()
	case childHTTP:
		return httpChildMain()
	case childAgent:
		return agentChildMain()
	case childRead:
		n, err := discard(os.Stdin, make([]byte, 256<<10))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench child: read after %d bytes: %v\n", n, err)
			return 1
		}
		fmt.Println(n)
		return 0
	}
	if mode := os.Getenv(childEnv); mode != childWrite {
		fmt.Fprintf(os.Stderr, "bench child: %s=%q: unknown mode\n", childEnv, mode)
		return 2
	}
	size, err := strconv.ParseInt(os.Getenv(bytesEnv), 10, 64)
	if err != nil || size < 0 {
		fmt.Fprintf(os.Stderr, "bench child: %s=%q: not a byte count\n", bytesEnv, os.Getenv(bytesEnv))
		return 2
	}
	write, line := writeSize, 0
	if v := os.Getenv(writeEnv); v != "" {
		write, err = strconv.Atoi(v)
	}
	if v := os.Getenv(lineEnv); v != "" && err == nil {
		line, err = strconv.Atoi(v)
	}
	if err != nil || write < 1 || line < 0 || line > write {
		fmt.Fprintf(os.Stderr, "bench child: %s=%q, %s=%q: want 1 ≤ line ≤ write\n", writeEnv, os.Getenv(writeEnv), lineEnv, os.Getenv(lineEnv))
		return 2
	}
	if path := os.Getenv(stampEnv); path != "" {
		if err := os.WriteFile(path, strconv.AppendInt(nil, time.Now().UnixNano(), 10), 0o600); err != nil {
			fmt.Fprintf(os.Stderr, "bench child: %v\n", err)
			return 1
		}
	}
	if line > 0 {
		write = write / line * line
	}
	buf := make([]byte, write)
	for i := range buf {
		buf[i] = byte('a' + i%26)
		if line > 0 && i%line == line-1 {
			buf[i] = '\n'
		}
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
