// Pausing a sandbox and resuming it, as Docker pauses a container: its
// processes stop where they are, their memory kept, and run on from
// there. It is still a running sandbox (its record's state), shown as
// paused (stateOf), from the pause until the resume, a stop, or its end.
//
// What kilnd does while it is paused: a call that needs the sandbox to run
// (a process started, stdin written, its files or ports reached) is
// refused, 409 with code "paused"; its processes' output stays readable
// from the agent, which a namespace sandbox's pause leaves running, and
// its attached watchers stay open (pausedRefusal says which calls go
// through). A gVisor sandbox's agent is paused with it: every call for it
// is refused, and output is read from the captured logs. Its idle timeout
// does not count while it is paused, and counts again from the resume; its
// ttl counts as always. A stop resumes it first, so that its processes are
// sent their signal and given their grace as a running sandbox's are; a
// delete kills them where they are.
//
// The record says it is paused before it is (the freeze follows the
// write), and says it runs once it does again (after the thaw): a kilnd
// that dies between the two finds the record paused and pauses the
// sandbox again as it adopts it (recover), so that a sandbox kilnd shows
// running never has frozen processes.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// stateOf is the state of rec's sandbox as the API shows it: a running
// one that is paused is paused.
func stateOf(rec record) string {
	if rec.State == StateRunning && rec.PausedAt != nil {
		return api.SandboxPaused
	}
	return rec.State
}

// paused says e's sandbox is paused. Called with d.mu held.
func (e *entry) paused() bool { return e.rec.State == StateRunning && e.rec.PausedAt != nil }

// agentPaused says e's sandbox's agent is paused with it (a gVisor
// sandbox's): it answers nothing until the resume. Called with d.mu held.
func (e *entry) agentPaused() bool {
	return e.paused() && runtimeOf(e.rec) != sandbox.RuntimeNamespaces
}

// Pause pauses a running sandbox (named as Delete takes it): every one of
// its processes stops where it is, its memory kept, until Resume. changed
// is false when it was paused already (HTTP's 304).
func (d *Daemon) Pause(ctx context.Context, ref string) (info Info, changed bool, err error) {
	e, err := d.claim(ctx, ref, newOp(false))
	if err != nil {
		return Info{}, false, err
	}
	defer d.mu.Unlock()
	defer e.finishOp()
	d.noticeExit(e)
	switch {
	case e.rec.State != StateRunning:
		return Info{}, false, fmt.Errorf("%w: sandbox %s is %s: %s: only a running sandbox is paused", errdefs.ErrFailedPrecondition, e.rec.ID, e.rec.State, e.rec.Reason)
	case e.rec.PausedAt != nil:
		return e.info(), false, nil
	}
	id, sb := e.rec.ID, e.sb
	now := time.Now().UTC()
	e.rec.PausedAt = &now
	if err := d.savePause(e.rec); err != nil {
		e.rec.PausedAt = nil
		return Info{}, false, d.hostFailure(fmt.Sprintf("sandbox %s could not be recorded paused", id), err)
	}
	// Calls that need the sandbox to run are refused from here on, and
	// the lock is not held through the freeze.
	d.mu.Unlock()
	err = sb.Pause()
	d.mu.Lock()
	if err != nil {
		e.rec.PausedAt = nil
		if serr := d.savePause(e.rec); serr != nil {
			d.log.Error("record a sandbox that did not pause", "id", id, "err", serr)
		}
		if errors.Is(err, sandbox.ErrNotPausable) {
			return Info{}, false, fmt.Errorf("%w: sandbox %s was made before sandboxes could be paused; stop and start it to pause it", errdefs.ErrFailedPrecondition, id)
		}
		return Info{}, false, d.hostFailure(fmt.Sprintf("sandbox %s could not be paused", id), err)
	}
	if e.deleting {
		return Info{}, false, fmt.Errorf("%w: sandbox %s was deleted as it paused", errdefs.ErrNotFound, id)
	}
	d.events.emit(sandboxEvent(api.EventPaused, e.rec))
	d.log.Info("sandbox paused", "id", id)
	return e.info(), true, nil
}

// Resume lets a paused sandbox's processes run on from where they were.
// Its idle timeout counts from now. changed is false when it was not
// paused (HTTP's 304).
func (d *Daemon) Resume(ctx context.Context, ref string) (info Info, changed bool, err error) {
	e, err := d.claim(ctx, ref, newOp(false))
	if err != nil {
		return Info{}, false, err
	}
	defer d.mu.Unlock()
	defer e.finishOp()
	d.noticeExit(e)
	switch {
	case e.rec.State != StateRunning:
		return Info{}, false, fmt.Errorf("%w: sandbox %s is %s: %s: only a paused sandbox is resumed", errdefs.ErrFailedPrecondition, e.rec.ID, e.rec.State, e.rec.Reason)
	case e.rec.PausedAt == nil:
		return e.info(), false, nil
	}
	id, sb := e.rec.ID, e.sb
	d.mu.Unlock()
	err = sb.Resume()
	d.mu.Lock()
	if err != nil {
		return Info{}, false, d.hostFailure(fmt.Sprintf("sandbox %s could not be resumed", id), err)
	}
	if e.deleting {
		return Info{}, false, fmt.Errorf("%w: sandbox %s was deleted as it resumed", errdefs.ErrNotFound, id)
	}
	e.rec.PausedAt, e.lastUsed = nil, time.Now()
	if err := d.savePause(e.rec); err != nil {
		// It runs: the next kilnd, finding it recorded paused, pauses it
		// again as it adopts it, which a resume then undoes.
		d.log.Error("record a resumed sandbox", "id", id, "err", err)
	}
	d.events.emit(sandboxEvent(api.EventResumed, e.rec))
	d.log.Info("sandbox resumed", "id", id)
	return e.info(), true, nil
}

// resumeToStop resumes paused e before a stop, so that its processes are
// sent their signal and given their grace. A resume that fails is logged:
// the stop's kill ends them all the same. Called with d.mu held and e's
// stop claimed; it releases the lock while the sandbox resumes.
func (d *Daemon) resumeToStop(e *entry) {
	if e.rec.PausedAt == nil {
		return
	}
	sb, id := e.sb, e.rec.ID
	d.mu.Unlock()
	err := sb.Resume()
	d.mu.Lock()
	if err != nil {
		d.log.Warn("a paused sandbox stops without being resumed first", "id", id, "err", err)
	}
	e.rec.PausedAt = nil
}

// adoptPaused pauses again, as kilnd adopts it, a sandbox recorded paused:
// it is (a gVisor one's instance learns it), or its last kilnd died
// before it was, or as it was resumed (see the top of this file). One
// that cannot be paused is recorded running, as it is. Called from New.
func (d *Daemon) adoptPaused(e *entry) {
	if e.rec.PausedAt == nil {
		return
	}
	if err := e.sb.Pause(); err != nil {
		d.log.Error("a sandbox recorded paused could not be paused again; it runs", "id", e.rec.ID, "err", err)
		e.rec.PausedAt = nil
		if err := d.save(e.rec); err != nil {
			d.log.Error("record a sandbox running", "id", e.rec.ID, "err", err)
		}
	}
}

// savePause writes rec as a pause or a resume leaves it: whole, renamed
// into place, so that a kilnd killed at any moment after finds it, but
// never synced to the disk, not even in the background. What it records
// matters only while the sandbox's processes live: a host that loses
// power before its disk has the record loses them too, and the next
// kilnd finds the sandbox ended, paused or not. A sync, even one not
// waited for, has the next pause's or resume's write of the record wait
// for the file system's journal.
func (d *Daemon) savePause(rec record) error { return d.write(rec, false) }

// pausedRefusal is the refusal of call r to paused sandbox id, or nil for
// a call that goes through: one the agent answers without the sandbox's
// processes running (their list, status, output and attached watchers,
// their exit, a signal, a terminal's size, top), unless agentPaused.
func pausedRefusal(r *http.Request, id string, agentPaused bool) error {
	refuse := func(what string) error {
		return fmt.Errorf("%w: sandbox %s is paused: resume it (kiln resume) to %s", errdefs.ErrPaused, id, what)
	}
	if agentPaused {
		return refuse("reach its agent, paused with it")
	}
	path, _ := agentPath(r.URL)
	switch {
	case path == "/exec" || path == "/exec-stream" && r.Method != http.MethodGet:
		return refuse("start a process in it")
	case strings.HasPrefix(path, "/files/") || path == "/archive":
		return refuse("reach its files")
	case strings.HasPrefix(path, "/ports/") || strings.HasPrefix(path, "/tcp/"):
		return refuse("reach its ports")
	case strings.HasPrefix(path, "/exec-stream/") && strings.Contains(path, "/stdin"):
		return refuse("write to a process's stdin")
	}
	return nil
}

func (d *Daemon) pauseHandler(w http.ResponseWriter, r *http.Request) {
	if err := noParameters(r, "a pause"); err != nil {
		reply.Error(w, err)
		return
	}
	info, changed, err := d.Pause(r.Context(), r.PathValue("id"))
	answerChange(w, info, changed, err)
}

func (d *Daemon) resumeHandler(w http.ResponseWriter, r *http.Request) {
	if err := noParameters(r, "a resume"); err != nil {
		reply.Error(w, err)
		return
	}
	info, changed, err := d.Resume(r.Context(), r.PathValue("id"))
	answerChange(w, info, changed, err)
}

// noParameters refuses a query on a call (what) that takes none.
func noParameters(r *http.Request, what string) error {
	for k := range r.URL.Query() {
		return fmt.Errorf("%w: no parameter %q: %s takes none", errdefs.ErrInvalidArgument, api.Clip(k), what)
	}
	return nil
}
