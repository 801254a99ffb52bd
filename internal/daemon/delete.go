package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// A delete is decided at once and finished as soon as it can be. The
// sandbox is deleted in kilnd's memory the moment the delete is taken:
// from then on no list, no lookup by name or prefix and no request for its
// agent finds it (its exact id still reaches its captured logs). Then it
// is ended: destroyed (everything in it killed, its cgroups and files
// removed), its disk and network released, its record saved deleted or,
// with remove_logs, its directory removed. A step that fails (the state
// directory full, a group that does not empty) leaves the deletion
// unfinished, and the finisher retries it from the first step not done,
// until it is done; the sandbox is never shown again meanwhile.
//
// The next kilnd, if this one stops meanwhile, finds the deletion by its
// marker whatever the sandbox's record says: an empty file,
// STATE_DIR/deleting/ID (ID.all with remove_logs), made before anything
// is done on the host and removed last. It takes an inode and no data
// block, so a state directory with no space left for a record still takes
// it. (A marker that cannot be made is logged; the deletion is then
// retried only while this kilnd runs.)
//
// Deleted sandboxes' records and directories (their captured logs) are
// removed KeepDeleted after their delete (the janitor's sweep).

// deletingDir holds the markers of unfinished deletions.
const deletingDir = "deleting"

// allSuffix ends the marker of a deletion that removes the logs too.
const allSuffix = ".all"

// DefaultKeepDeleted is how long a deleted sandbox's record and captured
// logs stay unless kilnd is told otherwise.
const DefaultKeepDeleted = 24 * time.Hour

// Retries of an unfinished deletion: the first after retryFirst, each
// next one after twice as long, at most retryMax.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 10 * time.Second
)

// deletion is a delete not yet finished. Its steps are run by one
// goroutine at a time: the delete's own, then the finisher's.
type deletion struct {
	id         string
	e          *entry           // its record guarded by d.mu
	sb         sandbox.Instance // nil until taken back, for a record alone
	removeLogs bool
	// ended says the sandbox is destroyed and its disk and network
	// released: what is left is its record or its directory.
	ended bool
	// done is closed once the deletion is finished.
	done chan struct{}
}

// Delete kills everything in a sandbox (named by its id, its name or a
// unique prefix of its id) and removes it; its captured logs stay unless
// removeLogs. Its name is free once it returns, and it is never shown
// again: a deletion that cannot be finished now is finished by kilnd,
// retrying.
func (d *Daemon) Delete(ref string, removeLogs bool) error {
	return d.delete(ref, removeLogs, false)
}

// delete is Delete; claimed says the caller already marked the entry
// deleting.
func (d *Daemon) delete(ref string, removeLogs, claimed bool) error {
	d.mu.Lock()
	e, err := d.lookup(ref)
	if err != nil {
		d.mu.Unlock()
		return err
	}
	if e.rec.State == StateDeleted || (e.deleting && !claimed) {
		d.mu.Unlock()
		return fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, api.Clip(ref))
	}
	id := e.rec.ID
	e.proxy, e.deleting = nil, true
	now := time.Now().UTC()
	e.rec.State, e.rec.StoppedAt, e.rec.PausedAt = StateDeleted, &now, nil
	if e.rec.Reason == "" {
		e.rec.Reason = "deleted"
	}
	d.forget(e)
	del := &deletion{id: id, e: e, removeLogs: removeLogs, done: make(chan struct{})}
	e.unfinished = del
	gone := sandboxEvent(api.EventDeleted, e.rec)
	// A stop under way is cut short (what its grace waits for is killed
	// now), and a start finishes; either way the instance it leaves is the
	// one ended here, never one it is still making.
	op := e.op
	if op != nil {
		op.cutShort()
	}
	d.mu.Unlock()
	d.events.emit(gone)
	if !removeLogs {
		d.metrics.stopped.WithLabelValues("deleted").Inc()
	} else {
		d.purgeOutput(id) // its cluster's copy goes with its logs
	}
	if err := d.mark(id, removeLogs); err != nil {
		d.log.Error("mark a sandbox being deleted", "id", id, "err", err)
	}
	if op != nil {
		<-op.done
	}
	d.mu.Lock()
	del.sb = e.sb
	d.mu.Unlock()
	if err := d.finish(del); err != nil {
		d.log.Warn("a delete is not finished; kilnd retries it", "id", id, "err", err)
		d.mu.Lock()
		d.unfinished[id] = del
		d.mu.Unlock()
		d.wakeFinisher()
	}
	return nil
}

// finish takes a deletion's steps from the first not done. It returns
// nil once the deletion is finished.
func (d *Daemon) finish(del *deletion) error {
	d.mu.Lock()
	rec := del.e.rec
	d.mu.Unlock()
	id := rec.ID
	if !del.ended {
		if del.sb == nil && rec.Sandbox != nil {
			sb, err := d.adopt(rec)
			if err != nil {
				return fmt.Errorf("take the sandbox back: %w", err)
			}
			del.sb = sb
		}
		if del.sb != nil {
			if err := del.sb.Destroy(!del.removeLogs); err != nil {
				return err
			}
		}
		if rec.Disk != "" && d.disks != nil {
			if err := d.disks.Release(rec.Disk); err != nil {
				return err
			}
		}
		d.unplug(id)
		del.ended = true
	}
	if del.removeLogs {
		if err := os.RemoveAll(d.sandboxDir(id)); err != nil {
			return err
		}
	} else if err := d.save(rec); err != nil {
		return err
	}
	if err := os.Remove(d.marker(id, del.removeLogs)); err != nil && !errors.Is(err, os.ErrNotExist) {
		// Found again at the next start, the deletion finishes at once.
		d.log.Error("remove the marker of a finished deletion", "id", id, "err", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.unfinished, id)
	del.e.unfinished = nil
	if del.removeLogs {
		delete(d.sandboxes, id)
	}
	close(del.done)
	return nil
}

// marker is the path of a deletion's marker.
func (d *Daemon) marker(id string, removeLogs bool) string {
	if removeLogs {
		id += allSuffix
	}
	return filepath.Join(d.cfg.StateDir, deletingDir, id)
}

// mark makes a deletion's marker, durably.
func (d *Daemon) mark(id string, removeLogs bool) error {
	dir := filepath.Join(d.cfg.StateDir, deletingDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(d.marker(id, removeLogs), os.O_WRONLY|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	df, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer df.Close()
	return df.Sync()
}

// markers reads the markers of the deletions an earlier kilnd left
// unfinished: each sandbox's id, and whether its logs go too.
func (d *Daemon) markers() map[string]bool {
	ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, deletingDir))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			d.log.Error("read the markers of unfinished deletions", "err", err)
		}
		return nil
	}
	out := map[string]bool{}
	for _, e := range ents {
		id, all := strings.CutSuffix(e.Name(), allSuffix)
		out[id] = out[id] || all
	}
	return out
}

// resume takes up a deletion an earlier kilnd left unfinished, for the
// finisher. Called from New, before the finisher starts.
func (d *Daemon) resume(e *entry, removeLogs bool) {
	rec := &e.rec
	if rec.State != StateDeleted {
		now := time.Now().UTC()
		rec.State, rec.StoppedAt = StateDeleted, &now
		if rec.Reason == "" {
			rec.Reason = "deleted"
		}
	}
	e.deleting = true
	del := &deletion{id: rec.ID, e: e, sb: e.sb, removeLogs: removeLogs, done: make(chan struct{})}
	e.unfinished = del
	d.unfinished[rec.ID] = del
}

// wakeFinisher tells the finisher a deletion was handed to it.
func (d *Daemon) wakeFinisher() {
	select {
	case d.retry <- struct{}{}:
	default:
	}
}

// finisher retries the unfinished deletions, backing off while they keep
// failing, until kilnd closes; what is unfinished then is resumed by the
// next kilnd, from its markers.
func (d *Daemon) finisher() {
	wait := retryFirst
	for {
		d.mu.Lock()
		n := len(d.unfinished)
		d.mu.Unlock()
		var tick <-chan time.Time
		var t *time.Timer
		if n > 0 {
			t = time.NewTimer(wait)
			tick = t.C
		}
		select {
		case <-d.closing:
			if t != nil {
				t.Stop()
			}
			return
		case <-d.retry:
			if t != nil {
				t.Stop()
			}
			continue
		case <-tick:
		}
		d.mu.Lock()
		todo := make([]*deletion, 0, len(d.unfinished))
		for _, del := range d.unfinished {
			todo = append(todo, del)
		}
		d.mu.Unlock()
		failed := false
		for _, del := range todo {
			if err := d.finish(del); err != nil {
				failed = true
				d.log.Warn("a delete is not finished yet; kilnd retries it", "id", del.id, "err", err)
			} else {
				d.log.Info("a delete finished", "id", del.id)
			}
		}
		if failed {
			wait = min(2*wait, retryMax)
		} else {
			wait = retryFirst
		}
	}
}

// sweep removes the records and directories of the sandboxes deleted
// longer than KeepDeleted ago, their captured logs with them.
func (d *Daemon) sweep(now time.Time) {
	type old struct {
		id     string
		hashes []string // of its previews
	}
	var olds []old
	d.mu.Lock()
	for id, e := range d.sandboxes {
		if e.rec.State != StateDeleted || e.unfinished != nil {
			continue
		}
		at := e.rec.CreatedAt
		if e.rec.StoppedAt != nil {
			at = *e.rec.StoppedAt
		}
		if now.Sub(at) >= d.cfg.KeepDeleted {
			o := old{id: id}
			for _, p := range e.rec.Previews {
				o.hashes = append(o.hashes, p.Hash)
			}
			olds = append(olds, o)
		}
	}
	d.mu.Unlock()
	for _, o := range olds {
		if err := os.RemoveAll(d.sandboxDir(o.id)); err != nil {
			d.log.Error("remove a deleted sandbox's directory", "id", o.id, "err", err)
			continue
		}
		d.mu.Lock()
		delete(d.sandboxes, o.id)
		for _, h := range o.hashes {
			if d.previews[h] == o.id {
				delete(d.previews, h)
			}
		}
		d.mu.Unlock()
		d.log.Info("deleted sandbox removed", "id", o.id, "kept", d.cfg.KeepDeleted)
	}
}
