package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

var (
	soakFor  = flag.Duration("soak", 5*time.Second, "how long TestSoak keeps starting processes and watchers")
	soakSeed = flag.Uint64("soak.seed", 0, "TestSoak's random seed; 0 picks one (the test logs it)")
)

// The soak's shape. Each sandbox keeps soakProcs processes running: as one
// finishes (every watcher of it has seen its exit) the next starts.
const (
	soakSandboxes = 3
	soakProcs     = 8 // processes at once per sandbox
	soakWatchers  = 4 // watchers per process: 1 to this many
	// soakFillers small processes a second per sandbox nobody watches
	// while they run: they fill the agents' tombstone tables, so that a
	// long soak reaches the tombstone bound.
	soakFillers = 4
	// soakLate is how long after its start a process may get a late
	// watcher, reading it from 0 or mid-stream once it is over: by then,
	// past the agent's grace period, it is usually a tombstone.
	soakLate = process.DefaultGrace + 10*time.Second
	// soakDrain bounds how long the processes and watchers in flight when
	// the soak ends may take to finish. It is not a timing assertion: a
	// slow process writes for about a second; only a hang reaches it.
	soakDrain = 3 * time.Minute
	// soakSettle bounds the wait for descriptors, goroutines and heap to
	// come back once the sandboxes are deleted.
	soakSettle = time.Minute
	// soakHeapSlack is how far above its baseline the live heap may stay:
	// what the runtime and the libraries keep (maps grown once, caches).
	// A few kilobytes kept per attach, over the hundreds of attaches of
	// even the short soak, would be more.
	soakHeapSlack = 1 << 20
)

// TestSoak is kilnd and its agents under load, for a bounded time: three
// sandboxes, each with eight exec-streams at a time (fast and slow, some
// writing more than the agent's 1 MiB ring holds), each process watched by
// kiln.v1 WebSocket watchers that attach and detach at random, resuming
// where they stopped, from 0 or from the middle; beside them, small
// processes nobody watches, and late watchers of processes long over.
// Every byte a watcher gets is checked against what the process wrote at
// that offset; data and gaps must follow each other without overlap or
// hole from the offset asked for; each stream's end must carry what was
// written, and the exit the process's own. The agents' tombstones must
// stay within their bound throughout. At the end the sandboxes are deleted
// and the test process's descriptors, goroutines and heap must come back
// to where they were before.
//
// The default -soak=5s keeps CI short. The long form, which also fills the
// agents' tombstone tables to their bound:
//
//	go test ./internal/daemon -run TestSoak -soak=10m -timeout=0
//
// A failure names its seed; -soak.seed=N replays the same processes and
// the same watcher choices (the timing is the machine's).
func TestSoak(t *testing.T) {
	seed := *soakSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (repeat with -soak.seed=%d), soak %v", seed, seed, *soakFor)
	k := start(t, "")
	defer k.cleanup()
	// Each spare disk is a descriptor, and they are made in the background
	// from kilnd's start: count from when they are there.
	k.d.SettleDisks()
	base := soakMeasure()
	t.Logf("baseline: %d fds, %d goroutines, heap %s", base.fds, base.goroutines, soakMiB(base.heap))

	s := &soakRun{k: k, token: k.d.Token(), seed: seed, rng: soakRand(seed, 0, 0, 0, 0)}
	for i := range soakSandboxes {
		var info daemon.Info
		k.json("POST", "/sandboxes", map[string]any{}, &info)
		s.sandboxes = append(s.sandboxes, &soakSandbox{n: i, id: info.ID, agent: info.AgentPID, procs: map[string]*soakProc{}})
	}

	// Deferred in this order so that a failure cancels the watchers, waits
	// for them, and only then deletes what is left.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), *soakFor+soakDrain)
	defer cancel()
	s.cancel = cancel

	// freed gets each watched process once all its watchers have seen its
	// exit; it has room for every one in flight, so a send never waits.
	freed := make(chan *soakProc, soakSandboxes*soakProcs)
	inflight := 0
	launch := func(sb *soakSandbox) {
		p := s.launch(sb, true)
		inflight++
		wg.Go(func() {
			var ww sync.WaitGroup
			for i := range p.watchers {
				w := s.watcher(p, i)
				ww.Go(func() {
					if err := w.run(ctx); err != nil && !w.gone(err) {
						s.fail(err)
					}
				})
			}
			ww.Wait()
			freed <- p
		})
	}
	// late starts a watcher of one of sb's processes that has been over
	// for a while, reading it to its exit from 0 or from the middle. By
	// then the process is usually a tombstone, and may have been evicted.
	lateN := 0
	late := func(sb *soakSandbox) {
		old := slices.DeleteFunc(slices.Clone(sb.order), func(p *soakProc) bool { return !p.exited || time.Since(p.launched) < soakLate })
		if len(old) == 0 {
			return
		}
		p := old[s.rng.IntN(len(old))]
		var from [2]int64
		if s.rng.IntN(2) == 0 {
			from = [2]int64{s.rng.Int64N(p.streams[0].size + 1), s.rng.Int64N(p.streams[1].size + 1)}
		}
		lateN++
		w := s.watcher(p, 1000+lateN)
		s.stats.late.Add(1)
		wg.Go(func() {
			if _, err := w.attach(ctx, from, true); err != nil && !w.gone(err) {
				s.fail(err)
			}
		})
	}
	began := time.Now()
	for _, sb := range s.sandboxes {
		for range soakProcs {
			launch(sb)
		}
	}
	stop := time.NewTimer(*soakFor)
	defer stop.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	launching := true
	for launching || inflight > 0 {
		select {
		case p := <-freed:
			inflight--
			if launching && ctx.Err() == nil {
				launch(s.sandboxes[p.sb])
			}
		case <-stop.C:
			launching = false
			s.ending.Store(true)
		case <-tick.C:
			for _, sb := range s.sandboxes {
				s.checkTable(sb)
				if launching {
					for range soakFillers {
						s.launch(sb, false)
					}
					late(sb)
				}
			}
		case <-ctx.Done():
			// The watchers stop at once and say where they were.
			wg.Wait()
			if err := s.failure(); err != nil {
				t.Fatal(err)
			}
			t.Fatalf("%d processes still watched %v after the soak ended (seed %d)", inflight, soakDrain, seed)
		}
	}
	wg.Wait()
	if err := s.failure(); err != nil {
		t.Fatal(err)
	}
	ran := time.Since(began)

	// Every process started is still known to its agent, live or as a
	// tombstone, unless the tombstones reached their bound and the least
	// recently used were evicted; and one that an attach found unknown is
	// gone for good.
	var tombs, peaks []string
	for _, sb := range s.sandboxes {
		listed, n := s.checkTable(sb)
		gone := 0
		for id, why := range sb.gone.Range {
			gone++
			if listed[id.(string)] {
				t.Fatalf("%v: an attach was answered 404, yet the agent lists it: %v", sb.procs[id.(string)], why)
			}
		}
		evictable := n == process.DefaultMaxTombstones || ran > process.DefaultTombstoneTTL
		missing := len(sb.procs) - len(listed)
		if (missing > 0 || gone > 0) && !evictable {
			t.Fatalf("sandbox %d (%s): %d processes missing from the agent's list, %d found unknown by an attach, with %d tombstones kept (bound %d)",
				sb.n, sb.id, missing, gone, n, process.DefaultMaxTombstones)
		}
		tombs = append(tombs, fmt.Sprintf("%d (at most %d; %d evicted, %d of them met by an attach)", n, sb.maxTombs, missing, gone))
		peaks = append(peaks, soakPeakRSS(sb.agent))
	}
	st := &s.stats
	t.Logf("ran %v: %d processes (%d watched; %s stdout, %s stderr written), %d watchers, %d attaches (%d from 0, %d mid-stream, %d resumed, %d late), %d detaches, %d refused as they should",
		ran.Round(time.Millisecond), st.processes.Load(), st.watched.Load(), soakMiB(st.written[0].Load()), soakMiB(st.written[1].Load()),
		st.watchers.Load(), st.attaches.Load(), st.fromZero.Load(), st.fromMid.Load(), st.resumed.Load(), st.late.Load(), st.detaches.Load(), st.refused.Load())
	t.Logf("checked %s in %d frames; %d gaps (%s lost to readers); %d ends, %d exits; %d attaches found their process evicted",
		soakMiB(st.bytes.Load()), st.frames.Load(), st.gaps.Load(), soakMiB(st.gapBytes.Load()), st.ends.Load(), st.exits.Load(), st.gone.Load())
	t.Logf("tombstones per sandbox: %s (bound %d); agents' peak RSS: %s", strings.Join(tombs, ", "), process.DefaultMaxTombstones, strings.Join(peaks, ", "))

	for _, sb := range s.sandboxes {
		if code, b := k.do("DELETE", "/sandboxes/"+sb.id+"?remove_logs=true", s.token, nil); code != http.StatusNoContent {
			t.Fatalf("delete sandbox %d (%s): %d %s", sb.n, sb.id, code, b)
		}
	}
	s.sandboxes = nil // the bookkeeping is the test's, not kilnd's heap
	// Keep-alive connections to kilnd are the client's, not a leak: close
	// them, and kilnd's side of them ends too.
	http.DefaultClient.CloseIdleConnections()
	end := soakSettled(t, base)
	t.Logf("after the delete: %d fds, %d goroutines, heap %s (baseline %d, %d, %s)",
		end.fds, end.goroutines, soakMiB(end.heap), base.fds, base.goroutines, soakMiB(base.heap))
}

// soakRun is one soak's shared state. Its sandboxes, their processes and
// rng belong to the test's goroutine; a watcher reads its own process's
// spec, which does not change once started.
type soakRun struct {
	k         *kilnd
	token     string
	seed      uint64
	rng       *rand.Rand
	sandboxes []*soakSandbox
	cancel    context.CancelFunc
	// ending is set once the soak's time is up: the watchers in flight
	// then read to the end instead of leaving again.
	ending atomic.Bool

	// mu guards errs: the first failures, the first of them the cause.
	mu   sync.Mutex
	errs []error

	stats soakStats
}

type soakStats struct {
	processes, watched, watchers, late      atomic.Int64
	attaches, fromZero, fromMid, resumed    atomic.Int64
	detaches, frames, bytes, gaps, gapBytes atomic.Int64
	ends, exits, gone, refused              atomic.Int64
	written                                 [2]atomic.Int64
}

type soakSandbox struct {
	n        int
	id       string
	agent    int                  // the agent's pid
	next     int                  // the next process's number
	procs    map[string]*soakProc // by process id
	order    []*soakProc          // as started
	maxTombs int                  // the most tombstones listed
	// gone holds the ids of processes an attach found unknown (evicted
	// tombstones, if all is well) with the error, written by watchers.
	gone sync.Map
}

// fail records a watcher's failure and stops the soak. Watchers stopped
// by an earlier failure have nothing to add; those stopped by the
// deadline say where each was stuck.
func (s *soakRun) fail(err error) {
	s.mu.Lock()
	if len(s.errs) < 10 && (len(s.errs) == 0 || !errors.Is(err, context.Canceled)) {
		s.errs = append(s.errs, err)
	}
	s.mu.Unlock()
	s.cancel()
}

func (s *soakRun) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) == 0 {
		return nil
	}
	return fmt.Errorf("seed %d: %w", s.seed, errors.Join(s.errs...))
}

// watcher makes watcher n of p, its choices drawn from the seed.
func (s *soakRun) watcher(p *soakProc, n int) *soakWatcher {
	s.stats.watchers.Add(1)
	return &soakWatcher{s: s, p: p, n: n, rng: soakRand(s.seed, 2, p.sb, p.n, n)}
}

// soakRand is the random source of one actor of the soak, drawn from the
// seed: kind 0 is the test's own choices, 1 a process's spec, 2 a
// watcher's choices. Each has a stream of its own, so what one draws does
// not depend on how the others were scheduled.
func soakRand(seed uint64, kind, sb, proc, watcher int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(kind)<<60|uint64(sb)<<52|uint64(proc)<<20|uint64(watcher)))
}

// soakStream is one output stream of a soak process: lines of a prefix and
// an eight-digit line number, cut at size bytes. The number makes every
// line different, so a byte delivered at the wrong offset cannot pass.
type soakStream struct {
	name   string // as on the wire
	prefix string
	size   int64
}

func (o *soakStream) width() int64 { return int64(len(o.prefix)) + 9 }

// line appends line n (counted from 0; seq numbers it n+1) to b.
func (o *soakStream) line(b []byte, n int64) []byte {
	var num [20]byte
	d := strconv.AppendInt(num[:0], n+1, 10)
	b = append(b, o.prefix...)
	for i := len(d); i < 8; i++ {
		b = append(b, '0')
	}
	b = append(b, d...)
	return append(b, '\n')
}

// want appends the n bytes the process wrote from offset off.
func (o *soakStream) want(b []byte, off, n int64) []byte {
	n = min(n, o.size-off)
	var line []byte
	for n > 0 {
		w := o.width()
		line = o.line(line[:0], off/w)
		part := line[off%w:]
		part = part[:min(int64(len(part)), n)]
		b = append(b, part...)
		off += int64(len(part))
		n -= int64(len(part))
	}
	return b
}

// script is the shell that writes the stream to standard output, in one go
// or, with chunks, a run of lines at a time with a pause between.
func (o *soakStream) script(chunks int, pause time.Duration) string {
	if o.size == 0 {
		return "true"
	}
	lines := (o.size + o.width() - 1) / o.width()
	format := o.prefix + "%08.0f"
	if chunks == 0 {
		return fmt.Sprintf("seq -f '%s' 1 %d | head -c %d", format, lines, o.size)
	}
	per := (lines + int64(chunks) - 1) / int64(chunks)
	// head leaving early makes seq fail; the loop stops with it.
	return fmt.Sprintf("i=0; while [ $i -lt %d ]; do seq -f '%s' $((i*%d+1)) $((i*%d+%d)) || exit 0; sleep %.3f; i=$((i+1)); done | head -c %d",
		chunks, format, per, per, per, pause.Seconds(), o.size)
}

// soakProc is one process of the soak and what it must be seen to do.
type soakProc struct {
	sb       int
	sbID     string
	box      *soakSandbox // for gone only
	n        int
	id       string
	streams  [2]soakStream // stdout, stderr
	chunks   int           // 0: writes in one go
	pause    time.Duration // between chunks
	exit     int           // the exit code; -1: killed by SIGKILL
	watchers int           // 0: nobody watches it while it runs
	launched time.Time
	exited   bool // listed as exited, its streams ended
}

func (p *soakProc) String() string {
	pace := "fast"
	if p.chunks > 0 {
		pace = fmt.Sprintf("slow, %d chunks %v apart", p.chunks, p.pause)
	}
	exit := "exit " + strconv.Itoa(p.exit)
	if p.exit < 0 {
		exit = "SIGKILL"
	}
	return fmt.Sprintf("sandbox %d (%s) process %d (%s; stdout %d B, stderr %d B, %s, %s)",
		p.sb, p.sbID, p.n, p.id, p.streams[0].size, p.streams[1].size, pace, exit)
}

// soakSize picks a stream's size: empty, small, medium, or more than the
// ring holds.
func soakSize(rng *rand.Rand) int64 {
	switch r := rng.IntN(20); {
	case r < 3:
		return 0
	case r < 10:
		return 1 + rng.Int64N(8<<10)
	case r < 16:
		return 8<<10 + rng.Int64N(512<<10)
	default:
		return ring.DefaultCapacity + rng.Int64N(2*ring.DefaultCapacity)
	}
}

// launch starts sandbox sb's next process, watched or a small one nobody
// watches; its spec depends on the seed, the sandbox and its number only.
func (s *soakRun) launch(sb *soakSandbox, watched bool) *soakProc {
	n := sb.next
	sb.next++
	rng := soakRand(s.seed, 1, sb.n, n, 0)
	p := &soakProc{sb: sb.n, sbID: sb.id, box: sb, n: n}
	if watched {
		p.watchers = 1 + rng.IntN(soakWatchers)
	}
	const letters = "abcdefghijklmnopqrstuvwxyz"
	for i, name := range []string{"stdout", "stderr"} {
		// A prefix of varying length, so that lines of different
		// processes and streams have different widths.
		prefix := []byte(fmt.Sprintf("s%dp%d%c", sb.n, n, name[3]))
		for range rng.IntN(8) {
			prefix = append(prefix, letters[rng.IntN(len(letters))])
		}
		p.streams[i] = soakStream{name: name, prefix: string(prefix) + "-", size: soakSize(rng)}
		if !watched {
			p.streams[i].size = rng.Int64N(2 << 10)
		}
	}
	if watched && rng.IntN(2) == 0 {
		p.chunks = 4 + rng.IntN(20)
		p.pause = time.Duration(10+rng.IntN(40)) * time.Millisecond
	}
	switch r := rng.IntN(20); {
	case r < 10:
		p.exit = 0
	case r < 17:
		p.exit = 1 + rng.IntN(5)
	default:
		p.exit = -1
	}
	last := "exit " + strconv.Itoa(p.exit)
	if p.exit < 0 {
		last = "kill -KILL $$"
	}
	script := fmt.Sprintf("{ %s; } & { %s; } >&2; wait; %s",
		p.streams[0].script(p.chunks, p.pause), p.streams[1].script(p.chunks, p.pause), last)
	var st api.Started
	s.k.json("POST", "/sandboxes/"+sb.id+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", script}}, &st)
	p.id, p.launched = st.ID, time.Now()
	sb.procs[p.id] = p
	sb.order = append(sb.order, p)
	s.stats.processes.Add(1)
	if watched {
		s.stats.watched.Add(1)
	}
	s.stats.written[0].Add(p.streams[0].size)
	s.stats.written[1].Add(p.streams[1].size)
	return p
}

// checkTable lists sb's processes through kilnd and holds them against
// what was started: only known processes, within the tombstone bound,
// and every finished stream at the size written. It returns the ids listed
// and how many of them are tombstones.
func (s *soakRun) checkTable(sb *soakSandbox) (map[string]bool, int) {
	t := s.k.t
	t.Helper()
	var list []api.Process
	s.k.json("GET", "/sandboxes/"+sb.id+"/exec-stream", nil, &list)
	listed := map[string]bool{}
	tombs := 0
	for _, lp := range list {
		p := sb.procs[lp.ID]
		if p == nil {
			t.Fatalf("sandbox %d (%s) lists process %s, which the soak did not start", sb.n, sb.id, lp.ID)
		}
		listed[lp.ID] = true
		// A tombstone keeps no pid and no arguments: only the exit, the
		// totals and a clipped command line.
		if lp.State == api.StateExited && lp.PID == 0 {
			tombs++
			if len(lp.Args) != 0 {
				t.Fatalf("%v: its tombstone keeps %d arguments", p, len(lp.Args))
			}
		}
		if lp.State == api.StateExited {
			if err := soakCheckExit(p, lp.Exit); err != nil {
				t.Fatalf("%v: listed with %v", p, err)
			}
			p.exited = lp.Streams["stdout"].Ended && lp.Streams["stderr"].Ended
		}
		for i := range p.streams {
			o := &p.streams[i]
			ss, ok := lp.Streams[o.name]
			if !ok || ss.TotalBytes > o.size || ss.Ended && ss.TotalBytes != o.size {
				t.Fatalf("%v: listed with %s %+v (present %v), written %d", p, o.name, ss, ok, o.size)
			}
		}
	}
	if tombs > process.DefaultMaxTombstones {
		t.Fatalf("sandbox %d (%s) keeps %d tombstones, bound %d", sb.n, sb.id, tombs, process.DefaultMaxTombstones)
	}
	sb.maxTombs = max(sb.maxTombs, tombs)
	return listed, tombs
}

func soakCheckExit(p *soakProc, e api.Exit) error {
	if p.exit < 0 {
		if e.Signal != "KILL" || e.ExitCode == nil || *e.ExitCode != 137 {
			return fmt.Errorf("%v, want killed by SIGKILL, code 137", e)
		}
		return nil
	}
	if e.ExitCode == nil || *e.ExitCode != p.exit || e.Signal != "" {
		return fmt.Errorf("%v, want exit code %d", e, p.exit)
	}
	return nil
}

// soakWatcher is one client of a process: it attaches and detaches at
// random until it has seen the exit. It belongs to one goroutine.
type soakWatcher struct {
	s   *soakRun
	p   *soakProc
	n   int
	rng *rand.Rand

	reached  [2]int64 // where the last attach left each stream
	known    [2]int64 // the most each stream is known to have produced
	attaches int

	line []byte // scratch for the expected bytes
}

func (w *soakWatcher) run(ctx context.Context) error {
	for {
		if w.rng.IntN(8) == 0 {
			if err := w.refused(ctx); err != nil {
				return err
			}
		}
		done, err := w.attach(ctx, w.pickFrom(), false)
		if err != nil {
			return err
		}
		if done {
			break
		}
		if err := soakPause(ctx, w.rng, 50*time.Millisecond); err != nil {
			return fmt.Errorf("%v: watcher %d: %w", w.p, w.n, err)
		}
	}
	// Now and then, the whole story again once it is over: replayed
	// from what the agent kept.
	if w.rng.IntN(3) == 0 {
		from := [2]int64{}
		if w.rng.IntN(2) == 0 {
			from = w.mid()
		}
		if _, err := w.attach(ctx, from, true); err != nil {
			return err
		}
	}
	return nil
}

// gone reports whether err is an attach answered 404, and notes it: the
// process was evicted, which the end of the soak holds against the
// agent's list.
func (w *soakWatcher) gone(err error) bool {
	if !errors.Is(err, errSoakGone) {
		return false
	}
	w.p.box.gone.Store(w.p.id, err)
	w.s.stats.gone.Add(1)
	return true
}

// refused asks for what cannot be had: an offset past all the process
// will ever write, or a process that does not exist. kilnd must answer
// with the error, and the client's connection, back in its pool, must
// serve the next attach as before.
func (w *soakWatcher) refused(ctx context.Context) error {
	pid, query := w.p.id, fmt.Sprintf("stdout=%d", w.p.streams[0].size+1+w.rng.Int64N(1<<20))
	want, code := http.StatusRequestedRangeNotSatisfiable, api.CodeOutOfRange
	if w.rng.IntN(2) == 0 {
		pid, query = fmt.Sprintf("%08x-%04x-7%03x-8%03x-%012x", w.rng.Uint32(), w.rng.IntN(1<<16), w.rng.IntN(1<<12), w.rng.IntN(1<<12), w.rng.Int64N(1<<48)), ""
		want, code = http.StatusNotFound, api.CodeNotFound
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	url := fmt.Sprintf("ws://%s/sandboxes/%s/exec-stream/%s/logs?%s", w.s.k.addr, w.p.sbID, pid, query)
	c, resp, err := websocket.Dial(dctx, url, &websocket.DialOptions{Subprotocols: []string{api.ProtocolV1, api.TokenProtocolPrefix + w.s.token}})
	if err == nil {
		c.CloseNow()
		return fmt.Errorf("%v: watcher %d: attach to %s?%s accepted, want %d", w.p, w.n, pid, query, want)
	}
	var e api.Error
	var body []byte
	if resp != nil {
		body, _ = io.ReadAll(resp.Body) // what Dial kept of it
	}
	if resp != nil && resp.StatusCode == http.StatusNotFound && pid == w.p.id {
		err = errSoakGone // the offset did not matter: the process was evicted
	}
	if resp == nil || resp.StatusCode != want || json.Unmarshal(body, &e) != nil || e.Error.Code != code {
		return fmt.Errorf("%v: watcher %d: attach to %s?%s: %w (%.300q), want %d %s", w.p, w.n, pid, query, err, body, want, code)
	}
	w.s.stats.refused.Add(1)
	return nil
}

// soakPause waits up to most, or until ctx ends: a random pause is the
// workload, not a wait for anything.
func soakPause(ctx context.Context, rng *rand.Rand, most time.Duration) error {
	t := time.NewTimer(time.Duration(rng.Int64N(int64(most))))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// pickFrom chooses where the next attach starts: where the watcher
// stopped, at 0, or anywhere up to what it knows was produced.
func (w *soakWatcher) pickFrom() [2]int64 {
	if w.attaches == 0 {
		return [2]int64{}
	}
	switch r := w.rng.IntN(20); {
	case r < 4:
		return [2]int64{}
	case r < 9:
		return w.mid()
	}
	return w.reached
}

func (w *soakWatcher) mid() [2]int64 {
	return [2]int64{w.rng.Int64N(w.known[0] + 1), w.rng.Int64N(w.known[1] + 1)}
}

// errSoakGone is an attach answered 404: the agent no longer knows the
// process.
var errSoakGone = errors.New("the process is not known (evicted?)")

// attach reads the process's output from the offsets from, every message
// held to the kiln.v1 contract by the checker and every byte to what the
// process wrote there, until the exit has been seen or the watcher decides
// to leave (never, with toEnd). It reports whether it saw the exit.
func (w *soakWatcher) attach(ctx context.Context, from [2]int64, toEnd bool) (bool, error) {
	w.attaches++
	n := w.attaches
	st := &w.s.stats
	st.attaches.Add(1)
	switch {
	case from == [2]int64{}:
		st.fromZero.Add(1)
	case from == w.reached:
		st.resumed.Add(1)
	default:
		st.fromMid.Add(1)
	}
	where := func() string {
		return fmt.Sprintf("%v: watcher %d, attach %d from stdout=%d stderr=%d", w.p, w.n, n, from[0], from[1])
	}

	// How this attach ends if the exit does not come first: after some
	// messages, after some time, or not at all; by a close handshake or by
	// dropping the connection.
	maxMsgs, leave, slow, handshake := -1, time.Duration(0), w.rng.IntN(5) == 0, w.rng.IntN(2) == 0
	if !toEnd && !w.s.ending.Load() {
		switch r := w.rng.IntN(8); {
		case r == 0: // read to the end
		case r < 4:
			leave = 20*time.Millisecond + time.Duration(w.rng.Int64N(int64(200*time.Millisecond)))
		default:
			maxMsgs = 1 + w.rng.IntN(64)
		}
	}

	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	url := fmt.Sprintf("ws://%s/sandboxes/%s/exec-stream/%s/logs?stdout=%d&stderr=%d", w.s.k.addr, w.p.sbID, w.p.id, from[0], from[1])
	c, resp, err := websocket.Dial(dctx, url, &websocket.DialOptions{Subprotocols: []string{api.ProtocolV1, api.TokenProtocolPrefix + w.s.token}})
	if err != nil {
		code, body := 0, []byte(nil)
		if resp != nil {
			code = resp.StatusCode
			body, _ = io.ReadAll(resp.Body) // what Dial kept of it
		}
		if code == http.StatusNotFound {
			err = errSoakGone
		}
		return false, fmt.Errorf("%s: dial: %d %s: %w", where(), code, bytes.TrimSpace(body), err)
	}
	defer c.CloseNow()
	if c.Subprotocol() != api.ProtocolV1 {
		return false, fmt.Errorf("%s: subprotocol %q", where(), c.Subprotocol())
	}
	// A frame carries one chunk of the ring, never more than the ring.
	c.SetReadLimit(api.FrameHeader + ring.DefaultCapacity)

	rctx := ctx
	if leave > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, leave)
		defer cancel()
	}
	stream := func(name string) *soakStream {
		if i := slices.IndexFunc(w.p.streams[:], func(o soakStream) bool { return o.name == name }); i >= 0 {
			return &w.p.streams[i]
		}
		return nil
	}
	chk := &apitest.Checker{From: map[string]int64{"stdout": from[0], "stderr": from[1]}, Check: func(name string, off int64, data []byte) error {
		o := stream(name)
		if o == nil {
			return fmt.Errorf("a frame of stream %s", name)
		}
		if off+int64(len(data)) > o.size {
			return fmt.Errorf("beyond the %d bytes written", o.size)
		}
		return w.check(o, data, off)
	}}
	defer func() {
		for i := range w.p.streams {
			s := chk.Stream(w.p.streams[i].name)
			w.reached[i] = s.Next
			w.known[i] = max(w.known[i], s.Next)
			st.frames.Add(int64(s.Frames))
			st.bytes.Add(s.Delivered)
			st.gaps.Add(int64(s.Gaps))
			st.gapBytes.Add(s.Lost)
			if s.Ended {
				st.ends.Add(1)
			}
		}
	}()
	for msgs := 1; ; msgs++ {
		typ, err := chk.Next(rctx, c)
		switch {
		case err == nil:
		case err == io.EOF:
			st.exits.Add(1)
			return true, nil
		case ctx.Err() != nil:
			return false, fmt.Errorf("%s: stopped at %v: %w", where(), chk, context.Cause(ctx))
		case rctx.Err() != nil:
			st.detaches.Add(1)
			if chk.Exit != nil {
				st.exits.Add(1)
			}
			return chk.Exit != nil, nil
		default:
			return false, fmt.Errorf("%s: %w", where(), err)
		}
		// What the checker cannot know: what the process wrote.
		switch typ {
		case api.TypeHello:
			if len(chk.Hello.Streams) != 2 {
				return false, fmt.Errorf("%s: hello %+v, want stdout and stderr", where(), chk.Hello.Streams)
			}
			for i := range w.p.streams {
				o := &w.p.streams[i]
				h, ok := chk.Hello.Streams[o.name]
				if !ok || h.Total > o.size {
					return false, fmt.Errorf("%s: hello says %s %+v (present %v), written %d", where(), o.name, h, ok, o.size)
				}
				w.known[i] = max(w.known[i], h.Total)
			}
		case api.TypeGap, api.TypeEnd:
			for i := range w.p.streams {
				o, s := &w.p.streams[i], chk.Stream(w.p.streams[i].name)
				if s.Next > o.size || s.Ended && s.Total != o.size {
					return false, fmt.Errorf("%s: %s at %d (ended %v, at %d), written %d", where(), o.name, s.Next, s.Ended, s.Total, o.size)
				}
			}
		case api.TypeExit:
			if err := soakCheckExit(w.p, *chk.Exit); err != nil {
				return false, fmt.Errorf("%s: %w", where(), err)
			}
		}
		if chk.Exit == nil && maxMsgs > 0 && msgs >= maxMsgs {
			st.detaches.Add(1)
			if handshake {
				c.Close(websocket.StatusNormalClosure, "")
			}
			return false, nil
		}
		if slow {
			if err := soakPause(ctx, w.rng, 3*time.Millisecond); err != nil {
				return false, fmt.Errorf("%s: %w", where(), err)
			}
		}
	}
}

// check compares data, delivered at offset off of o, with what the process
// wrote there, a line at a time.
func (w *soakWatcher) check(o *soakStream, data []byte, off int64) error {
	width := o.width()
	at := off
	for rest := data; len(rest) > 0; {
		w.line = o.line(w.line[:0], at/width)
		want := w.line[at%width:]
		want = want[:min(len(want), len(rest))]
		if !bytes.Equal(rest[:len(want)], want) {
			i := int64(0)
			for rest[i] == want[i] {
				i++
			}
			bad := at + i
			got := data[bad-off:]
			got = got[:min(len(got), 24)]
			return fmt.Errorf("%s offset %d (in a frame at %d of %d bytes): got %q, want %q",
				o.name, bad, off, len(data), got, o.want(nil, bad, int64(len(got))))
		}
		rest = rest[len(want):]
		at += int64(len(want))
	}
	return nil
}

// soakFigures are what must come back after the soak.
type soakFigures struct {
	fds, goroutines int
	heap            uint64
}

func soakMeasure() soakFigures {
	// Twice: what sync.Pools hold survives one collection.
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return soakFigures{fds: len(soakFDs()), goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
}

// soakFDs lists the test process's open descriptors and what they are.
func soakFDs() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		out = append(out, e.Name()+" -> "+target)
	}
	return out
}

// soakSettled waits, within soakSettle, for descriptors and goroutines to
// be back at their baseline and the heap near it; kilnd's side of closed
// connections and the agents' reapers end on their own time.
func soakSettled(t *testing.T, base soakFigures) soakFigures {
	t.Helper()
	deadline := time.Now().Add(soakSettle)
	for {
		now := soakMeasure()
		if now.fds <= base.fds && now.goroutines <= base.goroutines && now.heap <= base.heap+soakHeapSlack {
			return now
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 64<<10) // the first goroutines are enough to see what leaked
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%v after deleting the sandboxes: %d fds (baseline %d), %d goroutines (baseline %d), heap %s (baseline %s, slack %s)\nfds:\n%s\ngoroutines:\n%s",
				soakSettle, now.fds, base.fds, now.goroutines, base.goroutines, soakMiB(now.heap), soakMiB(base.heap), soakMiB(soakHeapSlack),
				strings.Join(soakFDs(), "\n"), buf)
		}
		time.Sleep(10 * time.Millisecond) // polling the condition, bounded by the deadline
	}
}

// soakPeakRSS is an agent's peak resident memory, for the log.
func soakPeakRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "unknown"
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "unknown"
}

func soakMiB[T int64 | uint64 | int](n T) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
