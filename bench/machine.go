package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// machine describes where a report's figures were taken; they mean little
// without it.
type machine struct {
	cpu        string
	cores      int
	gomaxprocs int
	memory     string
	kernel     string
	goVersion  string
}

func probeMachine() machine {
	m := machine{
		cpu:        "unknown",
		cores:      runtime.NumCPU(),
		gomaxprocs: runtime.GOMAXPROCS(0),
		memory:     "unknown",
		kernel:     "unknown",
		goVersion:  runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
	}
	if v, ok := procField("/proc/cpuinfo", "model name"); ok {
		m.cpu = v
	}
	if v, ok := procField("/proc/meminfo", "MemTotal"); ok {
		if kb, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64); err == nil {
			m.memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.kernel = strings.Join([]string{unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]),
			unix.ByteSliceToString(u.Version[:]), unix.ByteSliceToString(u.Machine[:])}, " ")
	}
	return m
}

// procField returns the value of the first "key: value" line for key.
func procField(path, key string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// cpuTimes is the system's CPU time so far, from /proc/stat's first line,
// in clock ticks: all of it, and what the hypervisor gave other guests
// while this one wanted to run (steal). ok is false where it cannot be
// read.
type cpuTimes struct {
	total, steal, idle int64
	ok                 bool
}

func readCPUTimes() cpuTimes {
	line, _, _ := strings.Cut(readTrimmed("/proc/stat"), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return cpuTimes{}
		}
		// guest and guest_nice (10th and 11th) are already in user and nice.
		if i < 8 {
			t.total += n
		}
		if i == 7 {
			t.steal = n
		}
		if i == 3 || i == 4 { // idle, iowait
			t.idle += n
		}
	}
	t.ok = true
	return t
}

// stealText is the share of the CPU stolen between two readings.
func stealText(from, to cpuTimes) string {
	if !from.ok || !to.ok || to.total <= from.total {
		return "unknown"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(to.steal-from.steal)/float64(to.total-from.total))
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// awaitIdle waits until the host's CPUs have been idle (at least 90% of
// their time) over a whole window of idleWindow, or ctx ends, or
// idleMost has gone by: what ran before a timed case (a sandbox made
// ahead finishing its start, runsc's processes ending) is done before it
// starts.
func awaitIdle(ctx context.Context) {
	deadline := time.Now().Add(idleMost)
	last := readCPUTimes()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(idleWindow):
		}
		now := readCPUTimes()
		if !now.ok || !last.ok {
			return
		}
		if total := now.total - last.total; total > 0 && float64(now.idle-last.idle) >= 0.9*float64(total) {
			return
		}
		last = now
	}
}

const (
	idleWindow = 50 * time.Millisecond
	idleMost   = 5 * time.Second
)
