package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/guest/confine"
)

// The filter's own cost: this binary re-executed to time system calls in a
// loop, with the sandbox's seccomp filter on its thread or without it.
const (
	childSyscalls = "syscalls"
	filterEnv     = "SANDKILN_BENCH_FILTER"
	syscallRuns   = 1_000_000
)

// filterCost is what a system call costs without and with the filter: one
// the filter allows whatever its arguments (which the kernel answers from
// its cache, without running the filter), and one it allows by argument
// value (the filter runs every time).
type filterCost struct {
	plain, filtered [2]time.Duration // per call: getppid, personality query
}

// syscallsMain times the calls and prints their costs in nanoseconds.
func syscallsMain() int {
	runtime.LockOSThread()
	if os.Getenv(filterEnv) != "" {
		if err := confine.LoadFilter(); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			return 1
		}
	}
	t := time.Now()
	for range syscallRuns {
		unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	}
	getppid := time.Since(t)
	t = time.Now()
	for range syscallRuns {
		unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	}
	personality := time.Since(t)
	fmt.Println(getppid.Nanoseconds()/syscallRuns, personality.Nanoseconds()/syscallRuns)
	return 0
}

// measureFilter runs the timing child reps times each way, interleaved,
// and keeps the medians.
func measureFilter(ctx context.Context, reps int) (filterCost, error) {
	var runs [2][2][]time.Duration // [filtered][call]
	for range reps {
		for f := range 2 {
			cmd := exec.CommandContext(ctx, os.Args[0])
			cmd.Env = append(os.Environ(), childEnv+"="+childSyscalls, "GORACE=atexit_sleep_ms=0")
			if f == 1 {
				cmd.Env = append(cmd.Env, filterEnv+"=1")
			}
			out, err := cmd.Output()
			if err != nil {
				return filterCost{}, fmt.Errorf("filter cost: %w", err)
			}
			fields := strings.Fields(string(out))
			if len(fields) != 2 {
				return filterCost{}, fmt.Errorf("filter cost: the child printed %q", out)
			}
			for c, v := range fields {
				ns, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return filterCost{}, fmt.Errorf("filter cost: the child printed %q", out)
				}
				runs[f][c] = append(runs[f][c], time.Duration(ns))
			}
		}
	}
	var fc filterCost
	for c := range 2 {
		fc.plain[c], fc.filtered[c] = pct(runs[0][c], 50), pct(runs[1][c], 50)
	}
	return fc, nil
}
