package process

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// Defaults for a Table.
const (
	DefaultGrace         = 30 * time.Second
	DefaultTombstoneTTL  = time.Hour
	DefaultMaxTombstones = 1024
	maxCmdline           = 200 // bytes of the command line a tombstone keeps
)

// TableConfig sets a Table's lifecycle bounds. Zero values take the defaults.
type TableConfig struct {
	// Grace is how long a finished process keeps its ring and handles
	// after its output ended and no reader is attached.
	Grace time.Duration
	// TombstoneTTL evicts a tombstone not looked at for this long.
	TombstoneTTL time.Duration
	// MaxTombstones bounds the tombstones kept; the least recently used
	// goes first.
	MaxTombstones int
	// DrainTimeout bounds each process's drain; zero means DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Logs opens the captured log of process id, for its readers to take
	// from it what the ring no longer holds; nil: no log is read.
	Logs func(id string) (*capture.Dir, error)
}

// Table is the set of processes of one sandbox: live ones, and tombstones
// of finished ones that keep only their exit and totals. It owns the grace
// timers; Shutdown stops everything it started.
type Table struct {
	cfg TableConfig

	// mu guards the fields below. Lock order: Table.mu before Process.mu.
	mu     sync.Mutex
	live   map[uuid.UUID]*entry
	tombs  map[uuid.UUID]*tombstone
	lru    tombstone // sentinel of the tombstones' LRU list; lru.next is the newest
	closed bool
	// observe, when set, is told of each process as it starts and once it
	// has finished (exited and drained), under mu: it must not call the
	// table.
	observe func(Status)

	counts tableCounts
}

// Tally is what a table has seen since it was made: processes started,
// and of those that have finished (exited and drained), how they ended
// and what their capture kept.
type Tally struct {
	Started int64
	// ExitedZero, ExitedNonZero and Signaled count finished processes by
	// how they ended; OOMKilled those of Signaled the out-of-memory
	// killer ended.
	ExitedZero, ExitedNonZero, Signaled, OOMKilled int64
	// CaptureWritten and CaptureDropped are the bytes of finished captured
	// processes' output their logs hold, and those they lost.
	CaptureWritten, CaptureDropped int64
}

type tableCounts struct {
	started, exitedZero, exitedNonZero, signaled, oomKilled atomic.Int64
	captureWritten, captureDropped                          atomic.Int64
}

// Tally reports what the table has seen.
func (t *Table) Tally() Tally {
	c := &t.counts
	return Tally{Started: c.started.Load(), ExitedZero: c.exitedZero.Load(), ExitedNonZero: c.exitedNonZero.Load(),
		Signaled: c.signaled.Load(), OOMKilled: c.oomKilled.Load(),
		CaptureWritten: c.captureWritten.Load(), CaptureDropped: c.captureDropped.Load()}
}

// count notes how a finished process ended and what its capture kept.
func (c *tableCounts) count(st Status) {
	switch {
	case st.Exit == nil:
	case st.Exit.Signal != 0:
		c.signaled.Add(1)
		if st.Exit.OOMKilled {
			c.oomKilled.Add(1)
		}
	case st.Exit.Code == 0:
		c.exitedZero.Add(1)
	default:
		c.exitedNonZero.Add(1)
	}
	if st.Capture == nil {
		return
	}
	var total, dropped int64
	for _, n := range st.Totals {
		total += n
	}
	for _, n := range st.Capture.Dropped {
		dropped += n
	}
	c.captureWritten.Add(max(total-dropped, 0))
	c.captureDropped.Add(dropped)
}

// entry is a live process with its attachment count and grace timer.
type entry struct {
	p       *Process
	readers int
	drained bool
	timer   *time.Timer // the grace timer, while running
	gen     int         // bumped whenever the grace timer is armed or cancelled
}

// tombstone is what remains of a finished process: small on purpose, since
// a sandbox may keep a thousand of them.
type tombstone struct {
	id         uuid.UUID
	exit       Exit
	streams    uint8 // bit s set when the process had stream s
	terminal   bool
	captured   bool
	flow       Flow
	totals     ring.Offsets
	dropped    ring.Offsets
	started    int64 // unix nanoseconds
	exited     int64
	touched    time.Time
	cmdline    string
	prev, next *tombstone
}

// NewTable makes an empty table.
func NewTable(cfg TableConfig) *Table {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.TombstoneTTL <= 0 {
		cfg.TombstoneTTL = DefaultTombstoneTTL
	}
	if cfg.MaxTombstones <= 0 {
		cfg.MaxTombstones = DefaultMaxTombstones
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	t := &Table{cfg: cfg, live: map[uuid.UUID]*entry{}, tombs: map[uuid.UUID]*tombstone{}}
	t.lru.next, t.lru.prev = &t.lru, &t.lru
	return t
}

// ErrClosed is returned by a table that has been shut down.
var ErrClosed = errdefs.New(errdefs.ErrUnavailable, "process table is shut down")

// Start starts a process and returns its id: a random UUID, so that its
// first few characters tell it from the sandbox's other processes
// (Resolve).
func (t *Table) Start(spec Spec) (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", fmt.Errorf("process: new id: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", ErrClosed
	}
	p, err := start(id.String(), spec, t.cfg.DrainTimeout, func() { t.drained(id) })
	if err != nil {
		return "", err
	}
	if p.capture != nil && t.cfg.Logs != nil {
		p.openLog = t.opener(id.String())
	}
	t.live[id] = &entry{p: p}
	t.counts.started.Add(1)
	if t.observe != nil {
		t.observe(p.Status())
	}
	return id.String(), nil
}

// Observe has f told of each process the table starts from now on, as it
// starts and once it has finished (exited, its output drained, its totals
// final), in that order. f is called with the table locked: it must be
// quick and must not call the table.
func (t *Table) Observe(f func(Status)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observe = f
}

func parseID(id string) (uuid.UUID, error) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		// No process can have this id: as not found as an unknown one.
		return uuid.UUID{}, fmt.Errorf("%w: %q is not a process id", ErrNotFound, api.Clip(id))
	}
	return u, nil
}

// Resolve returns the id of the process ref names: ref itself when it is
// a whole id, else the one live process or tombstone whose id begins with
// ref, if ref has api.MinIDPrefix characters or more. A prefix two or
// more ids begin with is refused, naming them; one none does is returned
// as it is, for the call to find nothing.
func (t *Table) Resolve(ref string) (string, error) {
	if len(ref) == 36 || len(ref) < api.MinIDPrefix {
		return ref, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	var matches []string
	for id := range t.live {
		if s := id.String(); strings.HasPrefix(s, ref) {
			matches = append(matches, s)
		}
	}
	for id := range t.tombs {
		if s := id.String(); strings.HasPrefix(s, ref) {
			matches = append(matches, s)
		}
	}
	switch len(matches) {
	case 0:
		return ref, nil
	case 1:
		return matches[0], nil
	}
	slices.Sort(matches)
	const most = 5
	named := strings.Join(matches[:min(len(matches), most)], ", ")
	if len(matches) > most {
		named += fmt.Sprintf(" and %d more", len(matches)-most)
	}
	return "", fmt.Errorf("%w: process prefix %q matches %d processes (%s): give more of the id", ErrInvalid, api.Clip(ref), len(matches), named)
}

// lookup returns the live entry or the tombstone for id, evicting expired
// tombstones on the way. Caller holds t.mu.
func (t *Table) lookupLocked(id string) (*entry, *tombstone, error) {
	u, err := parseID(id)
	if err != nil {
		return nil, nil, err
	}
	t.expireLocked()
	if e := t.live[u]; e != nil {
		return e, nil, nil
	}
	if ts := t.tombs[u]; ts != nil {
		t.touchLocked(ts)
		return nil, ts, nil
	}
	return nil, nil, fmt.Errorf("%w: process %s", ErrNotFound, id)
}

// Process returns the live process for id; ErrFinished for a tombstone.
func (t *Table) Process(id string) (*Process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ts, err := t.lookupLocked(id)
	if err != nil {
		return nil, err
	}
	if ts != nil {
		return nil, fmt.Errorf("%w: %s (%v)", ErrFinished, id, ts.exit)
	}
	return e.p, nil
}

// Status reports a live process or a tombstone.
func (t *Table) Status(id string) (Status, error) {
	t.mu.Lock()
	e, ts, err := t.lookupLocked(id)
	t.mu.Unlock()
	switch {
	case err != nil:
		return Status{}, err
	case ts != nil:
		return ts.status(), nil
	}
	return e.p.Status(), nil
}

// List reports every live process and tombstone, oldest first.
func (t *Table) List() []Status {
	t.mu.Lock()
	t.expireLocked()
	ps := make([]*Process, 0, len(t.live))
	for _, e := range t.live {
		ps = append(ps, e.p)
	}
	out := make([]Status, 0, len(t.live)+len(t.tombs))
	for _, ts := range t.tombs {
		out = append(out, ts.status())
	}
	t.mu.Unlock()
	for _, p := range ps {
		out = append(out, p.Status())
	}
	slices.SortFunc(out, func(a, b Status) int {
		return cmp.Or(a.StartedAt.Compare(b.StartedAt), strings.Compare(a.ID, b.ID))
	})
	return out
}

// Retained returns, per stream, the oldest offset a reader attaching now
// is given bytes from: the ring's, or its captured log's when that holds
// older ones.
func (t *Table) Retained(id string) (ring.Offsets, error) {
	t.mu.Lock()
	e, ts, err := t.lookupLocked(id)
	t.mu.Unlock()
	if err != nil {
		return ring.Offsets{}, err
	}
	var first ring.Offsets
	var terminal, captured bool
	if ts != nil {
		first, terminal, captured = ts.totals, ts.terminal, ts.captured
	} else {
		first, terminal, captured = e.p.ring.First(), e.p.terminal, e.p.capture != nil
	}
	if !captured || t.cfg.Logs == nil {
		return first, nil
	}
	dir, err := t.cfg.Logs(id)
	if err != nil {
		return first, nil // the log cannot be read: the ring is what there is
	}
	defer dir.Close()
	if at, ok := capture.First(dir); ok {
		out := ring.Stdout
		if terminal {
			out = ring.PTY
		}
		first[out] = min(first[out], at.Stdout)
		first[ring.Stderr] = min(first[ring.Stderr], at.Stderr)
	}
	return first, nil
}

// Wait returns a process's exit once observed, or a tombstone's at once.
func (t *Table) Wait(ctx context.Context, id string) (Exit, error) {
	t.mu.Lock()
	e, ts, err := t.lookupLocked(id)
	t.mu.Unlock()
	switch {
	case err != nil:
		return Exit{}, err
	case ts != nil:
		return ts.exit, nil
	}
	return e.p.Wait(ctx)
}

// Attach opens a reader at the given offsets. For a tombstone the reader gets
// each stream's loss and end, then the exit.
func (t *Table) Attach(id string, from ring.Offsets, o AttachOptions) (*Attachment, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ts, err := t.lookupLocked(id)
	if err != nil {
		return nil, err
	}
	if ts != nil {
		var streams []ring.Stream
		for s := range ring.Stream(ring.NumStreams) {
			if ts.streams&(1<<s) != 0 {
				streams = append(streams, s)
			} else if from[s] != 0 {
				return nil, fmt.Errorf("%s: %w: %v has no output", id, ErrOutOfRange, s)
			}
		}
		for _, s := range streams {
			if from[s] < 0 || from[s] > ts.totals[s] {
				return nil, fmt.Errorf("%s: %w: %v offset %d, produced %d", id, ErrOutOfRange, s, from[s], ts.totals[s])
			}
		}
		a := &Attachment{pending: tombstoneEvents(streams, ts.totals, from), totals: ts.totals, exit: ts.exit, exitOK: true,
			pos: from, terminal: ts.terminal}
		if ts.captured && t.cfg.Logs != nil {
			a.log = t.opener(id)
		}
		return a, nil
	}
	a, err := e.p.Attach(from, o)
	if err != nil {
		return nil, err
	}
	e.readers++
	e.gen++ // a timer that already fired and waits for mu must not act
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	u := uuid.MustParse(id)
	var once sync.Once
	a.onClose = func() { once.Do(func() { t.detach(u) }) }
	return a, nil
}

// opener returns what opens process id's captured log.
func (t *Table) opener(id string) func() (*capture.Dir, error) {
	return func() (*capture.Dir, error) { return t.cfg.Logs(id) }
}

// detach ends one reader; the last one to leave a drained process restarts
// its grace period.
func (t *Table) detach(id uuid.UUID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.live[id]
	if e == nil {
		return
	}
	e.readers--
	if e.readers == 0 && e.drained && !t.closed {
		t.armLocked(id, e)
	}
}

// drained is called by a process's reaper when its output has ended and
// its goroutines are gone.
func (t *Table) drained(id uuid.UUID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.live[id]
	if e == nil {
		return
	}
	e.drained = true
	st := e.p.Status()
	t.counts.count(st)
	if t.observe != nil {
		t.observe(st)
	}
	if e.readers == 0 && !t.closed {
		t.armLocked(id, e)
	}
}

func (t *Table) armLocked(id uuid.UUID, e *entry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	e.gen++
	gen := e.gen
	e.timer = time.AfterFunc(t.cfg.Grace, func() { t.graceOver(id, e, gen) })
}

// graceOver turns a finished process nobody reads into a tombstone: its
// ring and handles go, its exit and totals stay.
func (t *Table) graceOver(id uuid.UUID, e *entry, gen int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.live[id] != e || e.gen != gen || e.readers > 0 || !e.drained {
		return
	}
	e.timer = nil
	delete(t.live, id)
	st := e.p.Status()
	e.p.ring.Discard()
	ts := &tombstone{
		id:       id,
		exit:     *st.Exit,
		terminal: st.Terminal,
		captured: e.p.capture != nil,
		flow:     st.Flow,
		totals:   st.Totals,
		dropped:  st.Dropped,
		started:  st.StartedAt.UnixNano(),
		exited:   st.ExitedAt.UnixNano(),
		cmdline:  clipCopy(strings.Join(st.Argv, " "), maxCmdline),
	}
	for _, s := range st.Streams {
		ts.streams |= 1 << s
	}
	t.tombs[id] = ts
	t.touchLocked(ts)
	for len(t.tombs) > t.cfg.MaxTombstones {
		t.evictLocked(t.lru.prev)
	}
}

func clipCopy(s string, n int) string {
	if len(s) <= n {
		return strings.Clone(s)
	}
	return strings.Clone(s[:n]) + "…"
}

// touchLocked moves ts to the front of the LRU list.
func (t *Table) touchLocked(ts *tombstone) {
	if ts.next != nil {
		ts.prev.next, ts.next.prev = ts.next, ts.prev
	}
	ts.touched = time.Now()
	ts.next, ts.prev = t.lru.next, &t.lru
	t.lru.next.prev = ts
	t.lru.next = ts
}

func (t *Table) evictLocked(ts *tombstone) {
	ts.prev.next, ts.next.prev = ts.next, ts.prev
	ts.prev, ts.next = nil, nil
	delete(t.tombs, ts.id)
}

// expireLocked drops tombstones untouched for longer than the TTL; the list
// is in touch order, so they are all at its end.
func (t *Table) expireLocked() {
	cutoff := time.Now().Add(-t.cfg.TombstoneTTL)
	for ts := t.lru.prev; ts != &t.lru && ts.touched.Before(cutoff); ts = t.lru.prev {
		t.evictLocked(ts)
	}
}

func (ts *tombstone) status() Status {
	e := ts.exit
	st := Status{
		ID:        ts.id.String(),
		Argv:      []string{ts.cmdline},
		State:     Exited,
		Exit:      &e,
		Totals:    ts.totals,
		First:     ts.totals,
		Dropped:   ts.dropped,
		Terminal:  ts.terminal,
		Flow:      ts.flow,
		StartedAt: time.Unix(0, ts.started),
		ExitedAt:  time.Unix(0, ts.exited),
	}
	for s := range ring.Stream(ring.NumStreams) {
		if ts.streams&(1<<s) != 0 {
			st.Streams = append(st.Streams, s)
			st.Ended[s] = true
		}
	}
	return st
}

// do runs f on the live process id; a tombstone answers ErrFinished.
func (t *Table) do(id string, f func(*Process) error) error {
	p, err := t.Process(id)
	if err != nil {
		return err
	}
	return f(p)
}

// Write queues stdin input; see Process.Write.
func (t *Table) Write(id string, offset int64, data []byte) (accepted int64, err error) {
	err = t.do(id, func(p *Process) error {
		accepted, err = p.Write(offset, data)
		return err
	})
	return accepted, err
}

// CloseStdin sends end-of-input; see Process.CloseStdin.
func (t *Table) CloseStdin(id string) error { return t.do(id, (*Process).CloseStdin) }

// Signal signals a process or its group; see Process.Signal.
func (t *Table) Signal(id string, sig syscall.Signal, group bool) error {
	return t.do(id, func(p *Process) error { return p.Signal(sig, group) })
}

// Release lets go of a process's output held for readers not attached;
// see Process.Release. A finished process holds nothing.
func (t *Table) Release(id string) error {
	err := t.do(id, func(p *Process) error {
		p.Release()
		return nil
	})
	if errors.Is(err, ErrFinished) {
		return nil
	}
	return err
}

// Terminate kills a process's group; see Process.Terminate.
func (t *Table) Terminate(id string) error { return t.do(id, (*Process).Terminate) }

// Resize resizes a process's terminal.
func (t *Table) Resize(id string, ws WindowSize) error {
	return t.do(id, func(p *Process) error { return p.Resize(ws) })
}

// Counts reports how many processes are live and how many are tombstones.
func (t *Table) Counts() (live, tombstones int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	return len(t.live), len(t.tombs)
}

// Shutdown kills every live process, waits (bounded by ctx) for their drains,
// and stops the table's timers. Tombstones stay readable.
func (t *Table) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	t.closed = true
	var ps []*Process
	for _, e := range t.live {
		if e.timer != nil {
			e.timer.Stop()
			e.timer = nil
		}
		ps = append(ps, e.p)
	}
	t.mu.Unlock()
	var errs []error
	for _, p := range ps {
		if err := p.Kill(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
