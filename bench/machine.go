package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

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

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
