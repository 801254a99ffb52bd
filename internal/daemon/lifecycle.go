// Stopping a sandbox and starting it again, as Docker stops and starts a
// container: a stop ends its processes and keeps everything else; a start
// makes a new instance of it from its record, on its files as the last
// one left them, and runs its init command again.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// reasonStopped is the reason of a sandbox a stop ended.
const reasonStopped = "stopped by request"

// A stop's grace, from SIGTERM to the kill of what is left:
// DefaultStopTimeout unless the request says (?timeout=SECONDS, as
// docker stop -t), at most MaxStopTimeout (the stop's request stays open
// for as long).
const (
	DefaultStopTimeout = 10 * time.Second
	MaxStopTimeout     = 10 * time.Minute
)

// haltTimeout bounds the wait, once a stop has killed what was left, for
// the sandbox's watcher to have ended it and recorded the stop.
const haltTimeout = time.Minute

// lifecycleOp is a stop or a start under way (entry.op). A sandbox has one
// at a time: another waits for done, and a delete waits for done before it
// ends the instance the stop or start leaves, having cut a stop's grace
// short.
type lifecycleOp struct {
	stop  bool
	hurry chan struct{} // closed by cutShort
	once  sync.Once
	done  chan struct{} // closed by finishOp
}

func newOp(stop bool) *lifecycleOp {
	return &lifecycleOp{stop: stop, hurry: make(chan struct{}), done: make(chan struct{})}
}

// cutShort ends a stop's grace now (what is left is killed), and keeps a
// start that has not begun making its instance from beginning it.
func (op *lifecycleOp) cutShort() { op.once.Do(func() { close(op.hurry) }) }

// stopping says a stop of e is under way: its watcher is the one to
// record it. Called with d.mu held.
func (e *entry) stopping() bool { return e.op != nil && e.op.stop }

// finishOp ends e's stop or start, waking what waits for it. Called with
// d.mu held.
func (e *entry) finishOp() {
	close(e.op.done)
	e.op = nil
}

// claim finds the sandbox ref stands for (not deleted) and makes op the
// change under way of it, once the one under way, if any, has finished;
// the wait ends with ctx. It returns with d.mu held, unless it fails.
func (d *Daemon) claim(ctx context.Context, ref string, op *lifecycleOp) (*entry, error) {
	d.mu.Lock()
	for {
		e, err := d.lookup(ref)
		if err == nil && (e.rec.State == StateDeleted || e.deleting) {
			err = fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, api.Clip(ref))
		}
		if err != nil {
			d.mu.Unlock()
			return nil, err
		}
		if e.op == nil {
			e.op = op
			return e, nil
		}
		busy := e.op.done
		d.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: sandbox %s: %w", errdefs.ErrUnavailable, e.rec.ID, ctx.Err())
		}
		d.mu.Lock()
	}
}

// Stop ends every process of a sandbox (named as Delete takes it) and
// keeps the rest: its record, files and captured logs stay, and Start runs
// it again. A paused sandbox is resumed first. Each process's group gets
// SIGTERM, as kiln kill sends it; once all have exited, or grace has
// passed (none: at once), everything left in the sandbox is killed, its
// agent too, whose shutdown ends the captured runs. It is then stopped,
// "stopped by request", with its init command's exit if it had one.
// changed is false when it was stopped already (HTTP's 304), the
// description then as it was.
func (d *Daemon) Stop(ctx context.Context, ref string, grace time.Duration) (info Info, changed bool, err error) {
	op := newOp(true)
	e, err := d.claim(ctx, ref, op)
	if err != nil {
		return Info{}, false, err
	}
	if e.rec.State == StateRunning && !e.sb.Alive() {
		// It ended by itself, and nobody noticed yet: its own reason.
		d.stopped(e, agentExited(e.sb), false)
		e.proxy = nil
	}
	if e.rec.State != StateRunning {
		e.finishOp()
		info = e.info()
		d.mu.Unlock()
		return info, false, nil
	}
	d.resumeToStop(e)
	id, sb, watched := e.rec.ID, e.sb, e.watched
	var agent http.RoundTripper
	if e.proxy != nil {
		agent = e.proxy.Transport
	}
	e.proxy = nil // no call reaches it from now on: it is stopping
	d.mu.Unlock()
	d.log.Info("sandbox stopping", "id", id, "grace", grace)
	if grace > 0 && agent != nil {
		terminate(agent, grace, op.hurry)
		if c, ok := agent.(interface{ CloseIdleConnections() }); ok {
			c.CloseIdleConnections()
		}
	}
	halted := sb.Halt()
	// Its watcher, woken by the agent's exit, ends what is left of it and
	// records the stop (as requested: e.stopping).
	t := time.NewTimer(haltTimeout)
	defer t.Stop()
	ended := true
	select {
	case <-watched:
	case <-t.C:
		ended = false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e.finishOp()
	switch {
	case e.deleting:
		return Info{}, false, fmt.Errorf("%w: sandbox %s was deleted as it stopped", errdefs.ErrNotFound, id)
	case e.rec.State == StateRunning && !ended:
		return Info{}, false, d.hostFailure(fmt.Sprintf("sandbox %s did not stop", id),
			errors.Join(halted, fmt.Errorf("its agent %d has not ended %v after its kill", sb.AgentPID(), haltTimeout)))
	case e.rec.State == StateRunning:
		// Its watcher ended with kilnd: the next one finds it stopped.
		return Info{}, false, errdefs.New(errdefs.ErrUnavailable, "sandbox "+id+": kilnd is shutting down as it stops")
	case halted != nil:
		d.log.Warn("a sandbox stopped, but not all of it at once", "id", id, "err", halted)
	}
	return e.info(), true, nil
}

// terminate asks the agent behind t to end each of its processes:
// SIGTERM to each one's process group, then it waits until they have all
// exited, grace has passed or hurry is closed, whichever comes first. An
// agent that does not answer has nothing more to wait for.
func terminate(t http.RoundTripper, grace time.Duration, hurry <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		select {
		case <-hurry:
			cancel()
		case <-ctx.Done():
		}
	})
	var procs []api.Process
	if askAgent(ctx, t, "/exec-stream", &procs) != nil {
		return
	}
	var running []string
	for _, p := range procs {
		if p.State != api.StateRunning {
			continue
		}
		if agentCall(ctx, t, "POST", "/exec-stream/"+url.PathEscape(p.ID)+"/signal", `{"signal":"TERM"}`) == nil {
			running = append(running, p.ID)
		}
	}
	// One after the other: the last to exit sets the time, and the others'
	// waits, over already, answer at once.
	for _, id := range running {
		if agentCall(ctx, t, "GET", "/exec-stream/"+url.PathEscape(id)+"/wait", "") != nil && ctx.Err() != nil {
			return
		}
	}
}

// agentCall makes a call of kilnd's own to the agent behind t, its
// answer's body read (within maxAgentAnswer) and dropped; it fails
// without an answer, or with one that is not a success.
func agentCall(ctx context.Context, t http.RoundTripper, method, path, body string) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxAgentAnswer)); err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("agent: %s %s: %s", method, path, resp.Status)
	}
	return nil
}

// Start runs a stopped sandbox (named as Delete takes it) again: a new
// instance of it, made by its runtime from its record (its image or root
// filesystem, limits, hostname, network policy and init command, which
// runs again), on its files as its last instance left them, its disk
// mounted again. Its id, name, labels and captured logs stay, and so does
// its creation: a ttl counts from it, and a sandbox past its ttl is not
// started. Its idle timeout counts from the start. changed is false when
// it runs already (HTTP's 304).
func (d *Daemon) Start(ctx context.Context, ref string) (info Info, changed bool, err error) {
	op := newOp(false)
	e, err := d.claim(ctx, ref, op)
	if err != nil {
		return Info{}, false, err
	}
	d.noticeExit(e)
	if e.rec.State == StateRunning {
		e.finishOp()
		info = e.info()
		d.mu.Unlock()
		return info, false, nil
	}
	if err := d.startable(e); err != nil {
		e.finishOp()
		d.mu.Unlock()
		return Info{}, false, err
	}
	prev, watched, next, id := e.sb, e.watched, e.rec, e.rec.ID
	// Its own copies of what a call may change in e.rec meanwhile (a
	// preview revoked), for the record the start saves.
	next.Previews, next.Labels = slices.Clone(next.Previews), maps.Clone(next.Labels)
	d.mu.Unlock()
	// The last instance's watcher has ended what was left of it (its
	// cgroups are named by the sandbox's id, as the new one's are).
	if watched != nil {
		select {
		case <-watched:
		case <-d.closing:
			d.mu.Lock()
			defer d.mu.Unlock()
			e.finishOp()
			return Info{}, false, errdefs.New(errdefs.ErrUnavailable, "sandbox "+id+": kilnd is shutting down")
		}
	}
	select {
	case <-op.hurry:
		// Deleted meanwhile: nothing to start.
		d.mu.Lock()
		defer d.mu.Unlock()
		e.finishOp()
		return Info{}, false, fmt.Errorf("%w: sandbox %s was deleted as it started", errdefs.ErrNotFound, id)
	default:
	}
	// Once begun, the start is finished whether or not its caller waits.
	sb, err := d.startAgain(context.WithoutCancel(ctx), prev, &next)
	d.mu.Lock()
	defer d.mu.Unlock()
	defer e.finishOp()
	if err != nil {
		// The record as it was, stopped (a start records it running first).
		if serr := d.save(e.rec); serr != nil {
			d.log.Error("record a sandbox that did not start", "id", id, "err", serr)
		}
		return Info{}, false, err
	}
	// A delete waits for this start, then ends the instance it made.
	e.sb, e.rec.Sandbox, e.rec.Network = sb, next.Sandbox, next.Network
	if e.deleting {
		return Info{}, false, fmt.Errorf("%w: sandbox %s was deleted as it started", errdefs.ErrNotFound, id)
	}
	e.rec.State, e.rec.StoppedAt, e.rec.Reason, e.rec.Exit = StateRunning, nil, "", nil
	// Told before its processes are (running starts their relay).
	d.events.emit(sandboxEvent(api.EventStarted, e.rec))
	d.running(e, sb, true)
	if err := d.save(e.rec); err != nil {
		d.log.Error("record a started sandbox", "id", id, "err", err)
	}
	d.log.Info("sandbox started", "id", id, "runtime", runtimeOf(e.rec), "agent", sb.AgentPID())
	return e.info(), true, nil
}

// startable says why stopped sandbox e cannot be started, if it cannot.
// Called with d.mu held.
func (d *Daemon) startable(e *entry) error {
	rec := e.rec
	switch {
	case e.sb == nil:
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s cannot be started: its runtime, %s, could not take it back when kilnd started (kilnd's log says why)", rec.ID, runtimeOf(rec)))
	case rec.TTL > 0 && time.Since(rec.CreatedAt) >= time.Duration(rec.TTL)*time.Second:
		end := rec.CreatedAt.Add(time.Duration(rec.TTL) * time.Second)
		return fmt.Errorf("%w: sandbox %s: its ttl of %ds ended at %s, counted from its creation: it does not run again", errdefs.ErrFailedPrecondition, rec.ID, rec.TTL, end.Format(time.RFC3339))
	case rec.Disk != "" && d.disks == nil:
		return errdefs.Opaque(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s cannot be started: this kilnd cannot mount sandbox disks (kilnd's log says why, when it started)", rec.ID), d.disksErr)
	}
	return nil
}

// startAgain makes the new instance of the sandbox of rec, whose stopped
// one is prev, and writes its state and network into rec. The record is
// saved running before anything is made: a kilnd that dies during the
// start finds it running, and adopts the new instance or, gone or never
// made, stops it and ends what is left of it, its cgroups by the
// sandbox's id (recover). On a failure nothing of the new instance is
// left, and the caller saves the record as it was.
func (d *Daemon) startAgain(ctx context.Context, prev sandbox.Instance, rec *record) (sandbox.Instance, error) {
	id := rec.ID
	p, err := d.replan(*rec)
	if err != nil {
		return nil, err
	}
	defer p.release()
	// What its last instance may have left on the host, were its end cut
	// short: its cgroups, runsc's container.
	if err := p.backend.EndLeftover(id, d.sandboxDir(id)); err != nil {
		return nil, d.hostFailure(fmt.Sprintf("sandbox %s cannot be started: its last instance could not be ended", id), err)
	}
	var disk *os.File
	if rec.Disk != "" {
		if disk, err = d.disks.Mount(rec.Disk); err != nil {
			return nil, d.hostFailure(fmt.Sprintf("sandbox %s cannot be started: its disk could not be mounted", id), err)
		}
		// The agent has it once it started; this copy goes either way.
		defer disk.Close()
	}
	policy := rec.Network
	rec.State, rec.StoppedAt, rec.Reason, rec.Exit, rec.Network = StateRunning, nil, "", nil, nil
	opts := d.options(p, rec, disk)
	opts.Restart = prev
	if policy != nil {
		if err := d.plug(id, policy.Policy, rec, &opts); err != nil {
			return nil, err
		}
	}
	undo := func() {
		if rec.Network != nil {
			d.unplug(id)
		}
	}
	if err := d.save(*rec); err != nil {
		undo()
		return nil, d.hostFailure(fmt.Sprintf("sandbox %s could not be recorded", id), err)
	}
	return d.launch(ctx, p.backend, opts, rec, undo)
}

// replan is the plan of a sandbox started again, from its record: what
// its create chose, checked again against what this kilnd has now (its
// runtime, its image kept, its root filesystem there).
func (d *Daemon) replan(rec record) (p createPlan, err error) {
	p.release = func() {}
	runtime := runtimeOf(rec)
	var ok bool
	if p.backend, ok = d.backends[runtime]; !ok {
		return p, fmt.Errorf("%w: sandbox %s cannot be started: this kilnd has no runtime %q", errdefs.ErrFailedPrecondition, rec.ID, api.Clip(runtime))
	}
	if why := d.unavailable[runtime]; why != nil {
		return p, errdefs.Opaque(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s cannot be started: runtime %s is not available on this host (kilnd --runtimes says why)", rec.ID, runtime), why)
	}
	p.req = CreateRequest{Init: rec.Init, Image: rec.Image}
	if rec.ImageID != "" {
		if p.img, p.layers, p.release, err = d.imageRoot(rec.ImageID); err != nil {
			p.release = func() {}
			if errdefs.ClassOf(err) == errdefs.ErrNotFound {
				err = fmt.Errorf("%w: sandbox %s cannot be started: its image %s (%s) is no longer kept", errdefs.ErrFailedPrecondition, rec.ID, api.Clip(rec.Image), api.ShortID(rec.ImageID))
			}
			return p, err
		}
	}
	if rec.Rootfs != "" {
		if p.req.Rootfs, err = d.resolveRootfs(rec.Rootfs); err != nil {
			p.release()
			if errdefs.ClassOf(err) == errdefs.ErrNotFound {
				err = fmt.Errorf("%w: sandbox %s cannot be started: its root filesystem is no longer in kilnd's images directory", errdefs.ErrFailedPrecondition, rec.ID)
			}
			return p, err
		}
	}
	p.limits = rec.Limits
	p.logs = d.cfg.Logs
	if rec.Logs != nil {
		p.logs = p.logs.Apply(*rec.Logs)
	}
	// Its mounts as they are now: a source gone, or no longer below a
	// directory this kilnd allows, is no sandbox to start.
	if err := d.withMounts(&p, rec.Mounts, errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s cannot be started: ", rec.ID)); err != nil {
		p.release()
		if errdefs.ClassOf(err) == errdefs.ErrPermissionDenied {
			err = fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
		}
		return p, err
	}
	return p, nil
}

// Restart stops a sandbox (Stop, with grace) if it runs, and starts it
// again: a sandbox stopped already is started.
func (d *Daemon) Restart(ctx context.Context, ref string, grace time.Duration) (Info, error) {
	stopped, _, err := d.Stop(ctx, ref, grace)
	if err != nil {
		return Info{}, err
	}
	// By its id: ref's name or prefix may find another by now.
	info, _, err := d.Start(ctx, stopped.ID)
	return info, err
}

// stopTimeout reads a stop's ?timeout=SECONDS, its only parameter.
func stopTimeout(q url.Values) (time.Duration, error) {
	grace := DefaultStopTimeout
	for k, vs := range q {
		if k != "timeout" {
			return 0, fmt.Errorf("%w: no parameter %q: want timeout", errdefs.ErrInvalidArgument, api.Clip(k))
		}
		n, err := strconv.ParseInt(vs[0], 10, 64)
		if err != nil || n < 0 || n > int64(MaxStopTimeout/time.Second) {
			return 0, fmt.Errorf("%w: timeout %q: want whole seconds from 0 to %d (default %d)", errdefs.ErrInvalidArgument,
				api.Clip(vs[0]), int64(MaxStopTimeout/time.Second), int64(DefaultStopTimeout/time.Second))
		}
		grace = time.Duration(n) * time.Second
	}
	return grace, nil
}

// answerChange answers a stop or a start: the sandbox's description, or
// 304 Not Modified (no body, as HTTP has it) when it was as asked already,
// as Docker answers.
func answerChange(w http.ResponseWriter, info Info, changed bool, err error) {
	switch {
	case err != nil:
		reply.Error(w, err)
	case !changed:
		w.WriteHeader(http.StatusNotModified)
	default:
		reply.JSON(w, http.StatusOK, info)
	}
}

func (d *Daemon) stopHandler(w http.ResponseWriter, r *http.Request) {
	grace, err := stopTimeout(r.URL.Query())
	if err != nil {
		reply.Error(w, err)
		return
	}
	info, changed, err := d.Stop(r.Context(), r.PathValue("id"), grace)
	answerChange(w, info, changed, err)
}

func (d *Daemon) startHandler(w http.ResponseWriter, r *http.Request) {
	for k := range r.URL.Query() {
		reply.Error(w, fmt.Errorf("%w: no parameter %q: a start takes none", errdefs.ErrInvalidArgument, api.Clip(k)))
		return
	}
	info, changed, err := d.Start(r.Context(), r.PathValue("id"))
	answerChange(w, info, changed, err)
}

func (d *Daemon) restartHandler(w http.ResponseWriter, r *http.Request) {
	grace, err := stopTimeout(r.URL.Query())
	if err != nil {
		reply.Error(w, err)
		return
	}
	info, err := d.Restart(r.Context(), r.PathValue("id"), grace)
	answerChange(w, info, true, err)
}
