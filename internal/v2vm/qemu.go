package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// report is what the guest said on the results port.
type report struct {
	Output   string   // all of it
	Binaries []result // each test binary's exit, in order
	Done     bool     // it reached its end
	// Booted and Ran are the guest's uptime when it started the tests,
	// and how long they took.
	Booted, Ran time.Duration
	// ConsoleTail is the end of the kernel's console, for a guest that
	// never said it was done.
	ConsoleTail string
}

type result struct {
	Name   string
	Status int
}

// boot runs the kernel with initrd under QEMU's TCG (this host's KVM does
// not run guests) until the guest powers off or cfg.Timeout passes.
func boot(ctx context.Context, cache string, k kernel, initrd string, cfg config) (report, error) {
	results, console := filepath.Join(cache, "results.log"), filepath.Join(cache, "console.log")
	for _, p := range []string{results, console} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return report{}, err
		}
	}
	// microvm under TCG needs the PIT and a TSC it is told about, or it
	// hangs calibrating in about half the boots.
	args := []string{
		"-accel", "tcg", "-M", "microvm,pit=on", "-cpu", "max", "-smp", strconv.Itoa(cfg.CPUs), "-m", "2048",
		"-kernel", k.Image, "-initrd", initrd,
		"-append", "console=ttyS0 cgroup_no_v1=all panic=-1 tsc_early_khz=2400000 tsc=reliable",
		"-display", "none", "-monitor", "none", "-no-reboot",
		"-serial", "file:" + console,
		"-device", "virtio-serial-device",
		"-chardev", "file,id=results,path=" + results,
		"-device", "virtserialport,chardev=results,name=" + resultsPort,
		"-fsdev", "local,id=host,path=/,security_model=none,readonly=on",
		"-device", "virtio-9p-device,fsdev=host,mount_tag=host",
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	var rep report
	if b, rerr := os.ReadFile(results); rerr == nil {
		rep = parseReport(string(b))
	}
	if !rep.Done {
		rep.ConsoleTail = tail(console, 40)
		if ctx.Err() != nil {
			rep.ConsoleTail += fmt.Sprintf("\n(killed after %v)", cfg.Timeout)
		}
		if err != nil {
			rep.ConsoleTail += fmt.Sprintf("\n(qemu: %v: %s)", err, strings.TrimSpace(string(out)))
		}
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("qemu: %w: %s", err, out)
	}
	return rep, nil
}

// parseReport reads the guest's report: the test binaries' output with
// "v2vm-up UPTIME", "v2vm-exit NAME STATUS" after each binary and
// "v2vm-end UPTIME" last.
func parseReport(s string) report {
	rep := report{Output: s}
	var up float64
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// The guest's own lines start at the line's start; a test's
		// output, indented, cannot end the report.
		if !strings.HasPrefix(sc.Text(), "v2vm-") {
			continue
		}
		f := strings.Fields(sc.Text())
		switch {
		case f[0] == "v2vm-up" && len(f) == 2:
			up, _ = strconv.ParseFloat(f[1], 64)
			rep.Booted = seconds(up)
		case f[0] == "v2vm-exit" && len(f) == 3:
			n, err := strconv.Atoi(f[2])
			if err != nil {
				n = -1
			}
			rep.Binaries = append(rep.Binaries, result{f[1], n})
		case f[0] == "v2vm-end" && len(f) == 2:
			end, _ := strconv.ParseFloat(f[1], 64)
			rep.Ran = seconds(end - up)
			rep.Done = true
		}
	}
	return rep
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
