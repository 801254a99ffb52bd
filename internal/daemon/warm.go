// Sandboxes made ahead, so that an everyday create does not wait for an
// agent to start.

package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Most of a create's time is its agent's start (the namespaces runtime:
// about 35 ms of 40 here; gVisor's: most of half a second), and nothing
// of it depends on the request when the request is of the everyday shape:
// no name or hostname (the hostname is then made of the id), no image or
// rootfs, no init, no mounts, no network, and kilnd's own limits, log rotation and
// oom policy. kilnd keeps sandboxes of that shape made ahead, as many of
// each runtime as Config.Warm says, and a create of that shape takes one,
// whose agent answers already, and makes it the caller's: its labels,
// timeouts and creation time given, its record written, its creation
// told. Another is made behind it.
//
// A sandbox made ahead is nobody's until a create takes it: it has no
// record (a kilnd that dies leaves it to the next, which ends it as a
// create it interrupted), no event tells of it, and no list, lookup,
// metric or timeout finds it. kilnd ends those it still holds as it
// closes. Its id is made as it is made: ids are random, and a create
// never says when its id was drawn.

// DefaultWarm is how many sandboxes kilnd makes ahead unless told
// otherwise: two of the namespaces runtime, whose idle sandboxes cost
// about 10 MiB each; gVisor's, five times that, only when asked for.
// MaxWarm is the most per runtime.
var DefaultWarm = map[string]int{sandbox.RuntimeNamespaces: 2}

const MaxWarm = 64

// warmSandbox is a sandbox made ahead, with the plan it was made from.
type warmSandbox struct {
	rec    record
	sb     sandbox.Instance
	limits api.Limits
	logs   Logs
}

// warmPool holds the sandboxes made ahead, by runtime, the oldest first.
type warmPool struct {
	mu    sync.Mutex
	ready map[string][]*warmSandbox
	// changed is closed, and replaced, when ready changes.
	changed chan struct{}
	// wake tells the maker a sandbox was taken.
	wake chan struct{}
}

func newWarmPool() *warmPool {
	return &warmPool{ready: map[string][]*warmSandbox{}, changed: make(chan struct{}), wake: make(chan struct{}, 1)}
}

// warmable reports whether a create planned as p may take a sandbox made
// ahead: whether it is of the everyday shape (the rest, limits and
// rotation, is matched against each sandbox's own plan).
func (d *Daemon) warmable(p createPlan) bool {
	r := p.req
	return d.cfg.Warm[p.backend.Name()] > 0 && r.Name == "" && r.Hostname == "" && r.Rootfs == "" && r.Image == "" &&
		r.Init == nil && len(r.Mounts) == 0 && r.Snapshot == "" && !egress.Wanted(r.Network) && cmp.Or(r.OnOOM, api.OnOOMEndSandbox) == api.OnOOMEndSandbox
}

// takeWarm takes, for a create planned as p, a sandbox made ahead whose
// agent runs, or returns nil if there is none of its shape.
func (d *Daemon) takeWarm(p createPlan) *warmSandbox {
	if !d.warmable(p) {
		return nil
	}
	runtime := p.backend.Name()
	for {
		w := d.warm.take(runtime, p.limits, p.logs)
		if w == nil {
			return nil
		}
		select {
		case d.warm.wake <- struct{}{}:
		default:
		}
		if w.sb.Alive() {
			return w
		}
		// Its agent ended while it waited (killed on the host, out of
		// memory): it is nobody's to tell.
		d.log.Warn("a sandbox made ahead had ended; another is taken", "id", w.rec.ID, "runtime", runtime, "reason", agentExited(w.sb))
		d.discardWarm(w)
	}
}

// take removes and returns the oldest sandbox of runtime made with limits
// and logs, or nil.
func (pool *warmPool) take(runtime string, limits api.Limits, logs Logs) *warmSandbox {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	ready := pool.ready[runtime]
	i := slices.IndexFunc(ready, func(w *warmSandbox) bool { return w.limits == limits && w.logs == logs })
	if i < 0 {
		return nil
	}
	w := ready[i]
	pool.ready[runtime] = slices.Delete(ready, i, i+1)
	pool.changedNow()
	return w
}

// put adds w, just made, to the sandboxes of runtime made ahead.
func (pool *warmPool) put(runtime string, w *warmSandbox) {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	pool.ready[runtime] = append(pool.ready[runtime], w)
	pool.changedNow()
}

// changedNow tells the waiters of changed. pool.mu is held.
func (pool *warmPool) changedNow() {
	close(pool.changed)
	pool.changed = make(chan struct{})
}

// Settle waits, until ctx ends, for the work kilnd does in the background
// after a create answered: every sandbox it makes ahead made. A benchmark
// settles kilnd before it times anything, lest that work be counted
// against what it times beside.
func (d *Daemon) Settle(ctx context.Context) error {
	for _, rt := range d.warmRuntimes() {
		if err := d.AwaitMadeAhead(ctx, rt, d.cfg.Warm[rt]); err != nil {
			return err
		}
	}
	return nil
}

// AwaitMadeAhead waits until kilnd holds n sandboxes of runtime made
// ahead, or ctx ends: for a benchmark or a test that measures a create
// taking one.
func (d *Daemon) AwaitMadeAhead(ctx context.Context, runtime string, n int) error {
	for {
		d.warm.mu.Lock()
		have, changed := len(d.warm.ready[runtime]), d.warm.changed
		d.warm.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// count is how many sandboxes of runtime are made ahead.
func (pool *warmPool) count(runtime string) int {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	return len(pool.ready[runtime])
}

// createWarm makes a sandbox made ahead the caller's, as the create of
// req asked it: the rest of what Create does once a sandbox runs.
func (d *Daemon) createWarm(w *warmSandbox, req CreateRequest) (Info, error) {
	rec := w.rec
	began := time.Now()
	rec.CreatedAt, rec.Labels, rec.IdleTimeout, rec.TTL = began.UTC(), req.Labels, req.IdleTimeoutSeconds, req.TTLSeconds
	if err := d.saveSoon(rec); err != nil {
		d.discardWarm(w)
		return Info{}, d.hostFailure("sandbox "+rec.ID+" could not be recorded", err)
	}
	d.metrics.creates.Observe(time.Since(began).Seconds())
	d.metrics.warmTaken.Inc()
	e := &entry{rec: rec, node: &d.nodeName}
	d.mu.Lock()
	d.add(e)
	d.events.emit(sandboxEvent(api.EventCreated, rec))
	d.running(e, w.sb, true)
	d.mu.Unlock()
	d.log.Info("sandbox created", "id", rec.ID, "runtime", rec.Runtime, "agent", w.sb.AgentPID(), "made_ahead", true)
	return d.infoOf(e), nil
}

// makeWarm makes a sandbox of runtime ahead: as Create makes one from
// {"runtime": runtime}, but not recorded.
func (d *Daemon) makeWarm(ctx context.Context, runtime string) (*warmSandbox, error) {
	p, err := d.plan(CreateRequest{Runtime: runtime})
	if err != nil {
		return nil, err
	}
	defer p.release()
	id := newID()
	diskMount, diskImage, err := d.takeDisk(id, p.limits, nil)
	if err != nil {
		return nil, err
	}
	if diskMount != nil {
		defer diskMount.Close()
	}
	rec := newRecord(id, p, diskImage, time.Now())
	opts := d.options(p, &rec, diskMount)
	opts.MadeAhead = true
	opts.Started = func(state json.RawMessage) error {
		rec.Sandbox = state
		return nil
	}
	undo := func() {
		if diskImage != "" {
			d.disks.Release(diskImage)
		}
	}
	sb, err := d.launchUnrecorded(ctx, p.backend, opts, &rec, undo)
	if err != nil {
		return nil, err
	}
	rec.Sandbox = sb.State()
	return &warmSandbox{rec: rec, sb: sb, limits: p.limits, logs: p.logs}, nil
}

// discardWarm ends a sandbox made ahead, and everything of it.
func (d *Daemon) discardWarm(w *warmSandbox) {
	if err := w.sb.Destroy(false); err != nil {
		d.log.Error("end a sandbox made ahead", "id", w.rec.ID, "err", err)
	}
	if w.rec.Disk != "" && d.disks != nil {
		if err := d.disks.Release(w.rec.Disk); err != nil {
			d.log.Error("release the disk of a sandbox made ahead", "id", w.rec.ID, "err", err)
		}
	}
}

// warmRuntimes are the runtimes sandboxes are made ahead for: those this
// host has that Config.Warm asks for, in order.
func (d *Daemon) warmRuntimes() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(d.backends)) {
		if d.unavailable[name] == nil && d.cfg.Warm[name] > 0 {
			out = append(out, name)
		}
	}
	return out
}

// warmer keeps Config.Warm's sandboxes made ahead for each runtime, one at
// a time, until kilnd closes. Making one takes as much of the host as
// the create it saves, so it waits until creates have paused for
// warmQuiet: a sandbox taken is not made again while the create that
// took it is still at work in it, nor while a burst of creates goes on
// (those past the ones made ahead wait for their own, as without any).
// A runtime whose sandboxes cannot be made is tried again later, less
// and less often.
func (d *Daemon) warmer() {
	ctx, cancel := d.untilClosing()
	defer cancel()
	runtimes := d.warmRuntimes()
	failing := map[string]time.Time{} // the runtimes failing, to when to try again
	backoff := map[string]time.Duration{}
	// fill makes one sandbox for the first runtime short of them that is
	// not failing; it reports whether it made or tried one, and when the
	// next failing runtime may be tried again.
	fill := func() (tried bool, next time.Time) {
		for _, rt := range runtimes {
			if until, ok := failing[rt]; ok && time.Now().Before(until) {
				if next.IsZero() || until.Before(next) {
					next = until
				}
				continue
			}
			if d.warm.count(rt) >= d.cfg.Warm[rt] {
				continue
			}
			w, err := d.makeWarm(ctx, rt)
			if err != nil {
				if ctx.Err() == nil {
					backoff[rt] = min(max(2*backoff[rt], time.Second), time.Minute)
					failing[rt] = time.Now().Add(backoff[rt])
					d.log.Warn("a sandbox could not be made ahead; creates wait for their own meanwhile", "runtime", rt, "retry_in", backoff[rt], "err", err)
				}
				return true, next
			}
			delete(failing, rt)
			delete(backoff, rt)
			d.warm.put(rt, w)
			return true, next
		}
		return false, next
	}
	for {
		// Creates paused?
		for quiet := false; !quiet; {
			select {
			case <-d.closing:
				return
			case <-d.warm.wake:
			case <-time.After(warmQuiet):
				quiet = true
			}
		}
		tried, next := fill()
		if tried {
			continue
		}
		var retry <-chan time.Time // none while no runtime is failing
		if !next.IsZero() {
			retry = time.After(time.Until(next))
		}
		select {
		case <-d.closing:
			return
		case <-d.warm.wake:
		case <-retry:
		}
	}
}

// warmQuiet is how long creates pause before a sandbox is made ahead.
const warmQuiet = 100 * time.Millisecond

// closeWarm ends the sandboxes made ahead: nobody's, they go with the
// kilnd that made them. Called by Close once the warmer has returned.
func (d *Daemon) closeWarm() {
	d.warm.mu.Lock()
	all := d.warm.ready
	d.warm.ready = map[string][]*warmSandbox{}
	d.warm.changedNow()
	d.warm.mu.Unlock()
	var wg sync.WaitGroup
	for _, ready := range all {
		for _, w := range ready {
			wg.Go(func() { d.discardWarm(w) })
		}
	}
	wg.Wait()
}
