package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

const settleTimeout = 60 * time.Second // for processes to start, end or become tombstones

// memSnapshot is the part of the runtime's statistics the memory figures use.
type memSnapshot struct {
	heap, stack int64
	goroutines  int
	threads     int
}

// snapshot collects twice (the first cycle's finalizers free more on the
// second) and reads live heap and stack bytes.
func snapshot() memSnapshot {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSnapshot{heap: int64(ms.HeapAlloc), stack: int64(ms.StackInuse), goroutines: runtime.NumGoroutine(), threads: osThreads()}
}

// osThreads is this process's thread count, or -1 if it cannot be read.
func osThreads() int {
	v, ok := procField("/proc/self/status", "Threads")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
}

type tombstoneResult struct {
	n       int
	heap    int64 // HeapAlloc growth over the n tombstones
	elapsed time.Duration
}

func (r tombstoneResult) perTombstone() float64 { return float64(r.heap) / float64(r.n) }

// measureTombstones runs n short processes through a table with a tiny
// grace period and measures the heap their tombstones keep.
func measureTombstones(ctx context.Context, cfg config) (tombstoneResult, error) {
	n := cfg.tombstones
	tb := process.NewTable(process.TableConfig{Grace: time.Millisecond, MaxTombstones: n + 100})
	spec := process.Spec{Argv: []string{"true"}}
	// A warm-up tombstone first, so the table's maps and the runtime's
	// one-time allocations are in the baseline.
	if err := runToEnd(ctx, tb, spec); err != nil {
		return tombstoneResult{}, fmt.Errorf("warm-up: %w", err)
	}
	if err := waitCounts(ctx, tb, 0, 1); err != nil {
		return tombstoneResult{}, err
	}
	before := snapshot()
	start := time.Now()
	if err := parallel(ctx, n, func() error { return runToEnd(ctx, tb, spec) }); err != nil {
		return tombstoneResult{}, err
	}
	if err := waitCounts(ctx, tb, 0, n+1); err != nil {
		return tombstoneResult{}, err
	}
	elapsed := time.Since(start)
	after := snapshot()
	runtime.KeepAlive(tb)

	for _, st := range tb.List() {
		if st.Exit == nil || *st.Exit != (process.Exit{}) {
			return tombstoneResult{}, fmt.Errorf("tombstone %s of %v: exit %v, want code 0", st.ID, st.Argv, st.Exit)
		}
	}
	r := tombstoneResult{n: n, heap: after.heap - before.heap, elapsed: elapsed}
	fmt.Fprintf(cfg.progress, "tombstones: %d in %.1f s, %.0f B each\n", n, elapsed.Seconds(), r.perTombstone())
	return r, nil
}

// runToEnd starts spec in tb and waits until its output has drained.
func runToEnd(ctx context.Context, tb *process.Table, spec process.Spec) error {
	id, err := tb.Start(spec)
	if err != nil {
		return err
	}
	p, err := tb.Process(id)
	if errors.Is(err, process.ErrFinished) {
		return nil // already a tombstone
	}
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parallel calls f n times from a few goroutines, so process start-up
// latency overlaps, and returns the first error.
func parallel(ctx context.Context, n int, f func() error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range min(n, 2*runtime.NumCPU()) {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				if err := f(); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// waitCounts polls until the table holds exactly the given numbers of live
// processes and tombstones. Polling is fine here: nothing else is measured
// meanwhile.
func waitCounts(ctx context.Context, tb *process.Table, live, tombs int) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		l, t := tb.Counts()
		if l == live && t == tombs {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v the table has %d live processes and %d tombstones, want %d and %d", settleTimeout, l, t, live, tombs)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

type runningResult struct {
	m          int
	heap       int64 // HeapAlloc growth over the m processes
	stack      int64 // StackInuse growth
	goroutines int   // goroutine count growth
	threads    int   // OS thread count growth
	output     int64 // bytes of output the m processes produced (the ring retains at most this)
	ring       int64 // heap one idle ring holds, measured apart
}

func (r runningResult) per(v int64) float64 { return float64(v) / float64(r.m) }

// measureRunning starts m idle processes with a stdin pipe and measures what
// each costs this process while it runs.
func measureRunning(ctx context.Context, cfg config) (res runningResult, err error) {
	m := cfg.running
	tb := process.NewTable(process.TableConfig{})
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		defer cancel()
		if serr := tb.Shutdown(sctx); serr != nil && err == nil {
			err = fmt.Errorf("shutdown: %w", serr)
		}
	}()
	spec := process.Spec{Argv: []string{"sleep", "1000"}, Stdin: process.StdinPipe}
	ids := make([]string, m+1) // made before the baseline so only the processes are measured
	start := func(i int) error {
		id, err := tb.Start(spec)
		ids[i] = id
		return err
	}
	// One warm-up process first, so one-time allocations (the poller, the
	// child-reaping machinery) are in the baseline.
	if err := start(m); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	if _, err := waitRunning(ctx, tb, ids[m:]); err != nil {
		return res, err
	}
	before := snapshot()
	for i := range m {
		if err := start(i); err != nil {
			return res, fmt.Errorf("process %d of %d: %w", i+1, m, err)
		}
	}
	output, err := waitRunning(ctx, tb, ids[:m])
	if err != nil {
		return res, err
	}
	clear(ids) // the table keeps its own copies; ours are not the processes' cost
	after := snapshot()
	runtime.KeepAlive(tb)

	res = runningResult{
		m:          m,
		heap:       after.heap - before.heap,
		stack:      after.stack - before.stack,
		goroutines: after.goroutines - before.goroutines,
		threads:    after.threads - before.threads,
		output:     output,
		ring:       idleRing(m),
	}
	fmt.Fprintf(cfg.progress, "running: %d idle processes, %.0f B heap, %.0f B stack each\n", m, res.per(res.heap), res.per(res.stack))
	return res, nil
}

// waitRunning waits until every process has started and returns the output
// they produced so far. A process that exits here failed to idle.
func waitRunning(ctx context.Context, tb *process.Table, ids []string) (int64, error) {
	deadline := time.Now().Add(settleTimeout)
	var output int64
	for _, id := range ids {
		for {
			st, err := tb.Status(id)
			if err != nil {
				return 0, err
			}
			if st.State == process.Exited {
				return 0, fmt.Errorf("process %s %v ended (%v) instead of idling", id, st.Argv, st.Exit)
			}
			if st.State == process.Running && st.PID > 0 {
				for _, n := range st.Totals {
					output += n
				}
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return 0, fmt.Errorf("process %s is %q, not running, after waiting: %w", id, st.State, context.Cause(ctx))
			}
			time.Sleep(time.Millisecond)
		}
	}
	return output, nil
}

// idleRing measures the heap of the ring an idle process holds: the ring
// itself and, for each of stdout and stderr, the first block its pump has
// taken to read into.
func idleRing(k int) int64 {
	rings := make([]*ring.Ring, k)
	before := snapshot()
	for i := range rings {
		r := ring.New(ring.Config{Streams: []ring.Stream{ring.Stdout, ring.Stderr}})
		r.Buffer(ring.Stdout)
		r.Buffer(ring.Stderr)
		rings[i] = r
	}
	after := snapshot()
	runtime.KeepAlive(rings)
	return (after.heap - before.heap) / int64(k)
}
