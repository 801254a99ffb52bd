// Command v2vm runs the sandbox package's limit and out-of-memory tests and
// the daemon's lifecycle tests on a pure cgroup v2 kernel: Debian's, booted
// under QEMU's TCG with cgroup_no_v1=all, from an initramfs holding the test
// binaries and busybox, the host's system directories shared read-only
// with it over 9p (so that the sandboxes have the /usr, /etc and python3
// of a real host). The guest reports each test binary's output and exit
// status over a virtio-serial port; v2vm prints them, and exits non-zero
// if any test failed or the guest never said it was done.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.Cache, "cache", ".cache/v2vm", "where the kernel package is downloaded and unpacked, and the initramfs built")
	flag.StringVar(&cfg.Kernel, "kernel", "", "Debian kernel package to boot (default: the one linux-image-amd64 depends on)")
	flag.DurationVar(&cfg.Timeout, "timeout", 12*time.Minute, "how long the guest may run before it is killed")
	flag.StringVar(&cfg.Run, "run", "", "only the tests matching this regular expression (default: the v2 set)")
	// One vCPU: with two, a guest whose CPU quota throttled a busy loop
	// froze under TCG (no console line, no test timeout) where one runs it
	// in seconds; and the host's cores are shared.
	flag.IntVar(&cfg.CPUs, "smp", 1, "the guest's CPUs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "v2vm:", err)
		os.Exit(1)
	}
}

type config struct {
	Cache, Kernel, Run string
	Timeout            time.Duration
	CPUs               int
}

func run(ctx context.Context, cfg config) error {
	cache, err := filepath.Abs(cfg.Cache)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	start := time.Now()
	k, err := fetchKernel(ctx, cache, cfg.Kernel)
	if err != nil {
		return err
	}
	initrd := filepath.Join(cache, "initrd.cpio")
	if err := buildInitramfs(ctx, k, initrd, cfg.Run); err != nil {
		return err
	}
	fmt.Printf("v2vm: kernel %s, initramfs built in %v\n", k.Version, time.Since(start).Round(100*time.Millisecond))
	rep, err := boot(ctx, cache, k, initrd, cfg)
	if err != nil {
		return err
	}
	fmt.Print(rep.Output)
	fmt.Printf("v2vm: guest up after %v, tests done after %v\n", rep.Booted.Round(100*time.Millisecond), rep.Ran.Round(100*time.Millisecond))
	if !rep.Done {
		return fmt.Errorf("the guest never reported its end; the console's last lines:\n%s", rep.ConsoleTail)
	}
	var failed []string
	for _, b := range rep.Binaries {
		if b.Status != 0 {
			failed = append(failed, fmt.Sprintf("%s (exit %d)", b.Name, b.Status))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("failed in the guest: %v", failed)
	}
	if len(rep.Binaries) == 0 {
		return errors.New("the guest ran no test binary")
	}
	return nil
}
