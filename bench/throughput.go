package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

const (
	rawReadSize = 256 << 10 // the plain loop's buffer: the ring's largest block
	bigPipe     = 1 << 20   // the size the engine asks for its pipes
	warmMax     = 64 << 20  // bytes of the unmeasured warm-up run of each case
	killTimeout = 10 * time.Second
)

// tcase is one way of running the writing child.
type tcase struct {
	name    string
	engine  bool
	pipe    int // raw: F_SETPIPE_SZ request for the read end; 0 keeps the default
	readers int // engine: attachments following the output
}

// sample is one measured run of a case.
type sample struct {
	workload time.Duration // Start until Wait returned (raw) or Done (engine)
	pipeSize int           // raw: the read end's size as the kernel reports it

	// Engine with readers only.
	readersDone      time.Duration // Start until every reader reached EOF
	minFrac, maxFrac float64       // stdout fraction delivered (not lost), across readers
	delivered, lost  int64         // stdout bytes, summed over readers
}

func (s sample) gbps(size int64) float64 { return float64(size) / s.workload.Seconds() / 1e9 }

type caseResult struct {
	tcase
	samples []sample // one per rep, in rep order
}

type throughputResult struct {
	size    int64
	reps    int
	warm    int64
	pipeMax string // the system's pipe-max-size
	cases   []caseResult
}

func throughputCases(readers []int) []tcase {
	cs := []tcase{
		{name: "raw"},
		{name: "raw, 1 MiB pipe", pipe: bigPipe},
		{name: "engine, no reader", engine: true},
	}
	for _, n := range readers {
		cs = append(cs, tcase{name: fmt.Sprintf("engine, %d %s", n, plural(n, "reader")), engine: true, readers: n})
	}
	return cs
}

// measureThroughput runs every case once unmeasured, then reps times with
// the cases interleaved within each rep, so that a drift of the machine's
// speed affects all cases alike.
func measureThroughput(ctx context.Context, cfg config, exe string) (*throughputResult, error) {
	res := &throughputResult{size: cfg.size, reps: cfg.reps, warm: min(cfg.size, warmMax), pipeMax: readTrimmed("/proc/sys/fs/pipe-max-size")}
	for _, c := range throughputCases(cfg.readers) {
		res.cases = append(res.cases, caseResult{tcase: c})
	}
	buf := make([]byte, rawReadSize)
	for _, c := range res.cases {
		if _, err := runCase(ctx, exe, c.tcase, res.warm, buf); err != nil {
			return nil, fmt.Errorf("warm-up of %q: %w", c.name, err)
		}
	}
	for rep := range cfg.reps {
		for i := range res.cases {
			c := &res.cases[i]
			s, err := runCase(ctx, exe, c.tcase, cfg.size, buf)
			if err != nil {
				return nil, fmt.Errorf("rep %d of %q: %w", rep+1, c.name, err)
			}
			c.samples = append(c.samples, s)
			fmt.Fprintf(cfg.progress, "rep %d/%d  %-22s %6.3f s  %6.3f GB/s%s\n", rep+1, cfg.reps, c.name,
				s.workload.Seconds(), s.gbps(cfg.size), readersNote(c.tcase, s))
		}
	}
	return res, nil
}

func readersNote(c tcase, s sample) string {
	if c.readers == 0 {
		return ""
	}
	return fmt.Sprintf("  readers done %.3f s, delivered %.1f%%–%.1f%%", s.readersDone.Seconds(), 100*s.minFrac, 100*s.maxFrac)
}

func runCase(ctx context.Context, exe string, c tcase, size int64, buf []byte) (sample, error) {
	// Start every run from a collected heap, so one case's garbage is not
	// collected on the next case's time.
	runtime.GC()
	if c.engine {
		return runEngine(ctx, exe, size, c.readers)
	}
	return runRaw(ctx, exe, size, c.pipe, buf)
}

// runRaw is the plain baseline: os/exec, one pipe, a loop reading into
// nothing until end of file.
func runRaw(ctx context.Context, exe string, size int64, pipe int, buf []byte) (sample, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return sample{}, fmt.Errorf("pipe: %w", err)
	}
	defer r.Close()
	var s sample
	if pipe > 0 {
		if _, err := fcntlPipe(r, unix.F_SETPIPE_SZ, pipe); err != nil {
			w.Close()
			return sample{}, fmt.Errorf("raise pipe to %d bytes: %w", pipe, err)
		}
	}
	if s.pipeSize, err = fcntlPipe(r, unix.F_GETPIPE_SZ, 0); err != nil {
		w.Close()
		return sample{}, fmt.Errorf("pipe size: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = childEnviron(size)
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	start := time.Now()
	err = cmd.Start()
	w.Close()
	if err != nil {
		return sample{}, fmt.Errorf("start %s: %w", exe, err)
	}
	var total int64
	for {
		n, err := r.Read(buf)
		total += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return sample{}, fmt.Errorf("read after %d bytes: %w", total, err)
		}
	}
	err = cmd.Wait()
	s.workload = time.Since(start)
	if err != nil {
		return sample{}, fmt.Errorf("child: %w", err)
	}
	if total != size {
		return sample{}, fmt.Errorf("read %d bytes, child wrote %d", total, size)
	}
	return s, nil
}

// fcntlPipe applies a pipe fcntl through SyscallConn, which (unlike Fd)
// leaves the descriptor non-blocking and on the poller as the engine's are.
func fcntlPipe(f *os.File, cmd, arg int) (int, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ferr error
	if err := sc.Control(func(fd uintptr) { n, ferr = unix.FcntlInt(fd, cmd, arg) }); err != nil {
		return 0, err
	}
	return n, ferr
}

// runEngine runs the child through the engine. The workload's time is Start
// until Done (exit observed, pumps drained); readers only follow.
func runEngine(ctx context.Context, exe string, size int64, readers int) (sample, error) {
	start := time.Now()
	p, err := process.Start("bench", process.Spec{Argv: []string{exe}, Env: childEnviron(size)})
	if err != nil {
		return sample{}, err
	}
	results := make([]readerResult, readers)
	var wg sync.WaitGroup
	for i := range readers {
		a, err := p.Attach(ring.Offsets{}, process.AttachOptions{})
		if err != nil {
			cancelRun(p, &wg)
			return sample{}, fmt.Errorf("attach reader %d: %w", i+1, err)
		}
		wg.Go(func() { results[i] = follow(ctx, a, size) })
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		cancelRun(p, &wg)
		return sample{}, ctx.Err()
	}
	s := sample{workload: time.Since(start)}
	wg.Wait()

	exit, err := p.Wait(ctx)
	if err != nil {
		return sample{}, err
	}
	if exit != (process.Exit{}) {
		return sample{}, fmt.Errorf("child ended with %v", exit)
	}
	if st := p.Status(); st.Totals[ring.Stdout] != size || st.Totals[ring.Stderr] != 0 {
		return sample{}, fmt.Errorf("engine counted %d stdout and %d stderr bytes, child wrote %d and 0",
			st.Totals[ring.Stdout], st.Totals[ring.Stderr], size)
	}
	var errs []error
	s.minFrac = 1
	for i, r := range results {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("reader %d of %d: %w", i+1, readers, r.err))
			continue
		}
		s.readersDone = max(s.readersDone, r.done.Sub(start))
		f := float64(r.delivered) / float64(size)
		s.minFrac, s.maxFrac = min(s.minFrac, f), max(s.maxFrac, f)
		s.delivered += r.delivered
		s.lost += r.lost
	}
	if readers == 0 {
		s.minFrac = 0
	}
	return s, errors.Join(errs...)
}

// cancelRun kills an engine run being abandoned and waits for its readers.
func cancelRun(p *process.Process, wg *sync.WaitGroup) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	p.Kill(ctx)
	wg.Wait()
}

type readerResult struct {
	delivered, lost int64 // stdout bytes
	done            time.Time
	err             error
}

// follow reads one attachment to its end and checks that it accounts for
// every byte the child wrote, each exactly once, as delivered or lost.
func follow(ctx context.Context, a *process.Attachment, size int64) readerResult {
	defer a.Close()
	var pos ring.Offsets // next byte expected per stream
	var delivered, lost ring.Offsets
	var ended [ring.NumStreams]bool
	exited := false
	for {
		e, err := a.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return readerResult{err: fmt.Errorf("after %d bytes delivered and %d lost: %w", delivered[ring.Stdout], lost[ring.Stdout], err)}
		}
		if e.Kind != ring.Exit && e.Offset != pos[e.Stream] {
			return readerResult{err: fmt.Errorf("%v %v event at offset %d, expected %d", e.Stream, e.Kind, e.Offset, pos[e.Stream])}
		}
		switch e.Kind {
		case ring.Data:
			pos[e.Stream] += int64(len(e.Data))
			delivered[e.Stream] += int64(len(e.Data))
		case ring.Gap:
			pos[e.Stream] = e.To
			lost[e.Stream] += e.Lost()
		case ring.End:
			ended[e.Stream] = true
		case ring.Exit:
			if e.Exit != (process.Exit{}) {
				return readerResult{err: fmt.Errorf("exit event says %v", e.Exit)}
			}
			exited = true
		}
	}
	r := readerResult{delivered: delivered[ring.Stdout], lost: lost[ring.Stdout], done: time.Now()}
	switch {
	case delivered[ring.Stdout]+lost[ring.Stdout] != size:
		r.err = fmt.Errorf("stdout: %d delivered + %d lost = %d bytes, child wrote %d",
			delivered[ring.Stdout], lost[ring.Stdout], delivered[ring.Stdout]+lost[ring.Stdout], size)
	case delivered[ring.Stderr]+lost[ring.Stderr] != 0:
		r.err = fmt.Errorf("stderr: %d delivered + %d lost, child wrote none", delivered[ring.Stderr], lost[ring.Stderr])
	case !ended[ring.Stdout] || !ended[ring.Stderr]:
		r.err = fmt.Errorf("no end event for stdout (%v) or stderr (%v)", ended[ring.Stdout], ended[ring.Stderr])
	case !exited:
		r.err = errors.New("no exit event before EOF")
	}
	return r
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
