// Moving stopped sandboxes off a drained node: each goes, as a snapshot
// of its files, to another node, which makes it again.

package daemon

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// moveStopped moves every stopped sandbox of this node to other nodes,
// one at a time, and says of each where it went or why it did not.
func (d *Daemon) moveStopped(ctx context.Context) []api.MovedSandbox {
	var moved []api.MovedSandbox
	for _, info := range d.List() {
		if info.State != StateStopped {
			continue
		}
		m := api.MovedSandbox{Sandbox: info.ID, Name: info.Name}
		if err := d.moveOne(ctx, info, &m); err != nil {
			m.Error = err.Error()
			d.log.Warn("cluster: a stopped sandbox not moved off its drained node", "sandbox", info.ID, "err", err)
		}
		moved = append(moved, m)
		if ctx.Err() != nil {
			break
		}
	}
	return moved
}

// moveOne moves one stopped sandbox: a snapshot of it here, exported to
// the node placement chooses and imported there, makes a sandbox of the
// same name, labels and settings there (the snapshot's), then the one
// here is deleted with its logs, which its snapshot took along. A named
// sandbox is deleted before its name is taken there, so m.Snapshot says
// where its files are should that fail: nothing of it is lost.
func (d *Daemon) moveOne(ctx context.Context, info Info, m *api.MovedSandbox) error {
	n := d.cluster
	to, err := n.Place("", nil)
	if err != nil {
		return err
	}
	if to.Self {
		return errdefs.New(errdefs.ErrFailedPrecondition, "no other node is ready to take it")
	}
	snap, err := d.Snapshot(ctx, info.ID, api.SnapshotRequest{})
	if err != nil {
		return fmt.Errorf("its snapshot: %w", err)
	}
	m.Snapshot, m.Node = snap.ID, to.Name
	rec, err := d.snapshot(snap.ID)
	if err != nil {
		return err
	}
	disk, err := os.Open(d.snaps.path(rec.ID, snapshotDisk))
	if err != nil {
		return fmt.Errorf("its snapshot's disk: %w", err)
	}
	defer disk.Close()
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := writeExport(tw, rec, disk, d.snaps.path(rec.ID, snapshotLogs))
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	var there api.Snapshot
	err = n.Do(ctx, to, http.MethodPost, "/snapshots/import", "application/x-tar", pr, &there)
	pr.CloseWithError(errors.New("the import ended"))
	if err != nil {
		return fmt.Errorf("its snapshot's import on node %s: %w", to.Name, err)
	}
	create := func() (Info, error) {
		var made Info
		err := n.Do(ctx, to, http.MethodPost, "/sandboxes", "", CreateRequest{Snapshot: there.ID, Name: info.Name, Node: to.Name}, &made)
		return made, err
	}
	var made Info
	if info.Name == "" {
		// Made there first: the one here goes only once it is.
		if made, err = create(); err != nil {
			return fmt.Errorf("making it on node %s (snapshot %s there): %w", to.Name, there.ID, err)
		}
	}
	if err := d.Delete(info.ID, true); err != nil {
		return fmt.Errorf("deleting it here: %w", err)
	}
	if info.Name != "" {
		n.Forget(ctx, info.ID, info.Name) // its name, free for the sandbox there
		if made, err = create(); err != nil {
			return fmt.Errorf("making it on node %s (its files are in snapshot %s there, and %s here): %w", to.Name, there.ID, snap.ID, err)
		}
	}
	m.ID, m.Snapshot = made.ID, ""
	// The snapshots were the move's: the sandbox there has its copy.
	if err := d.RemoveSnapshot(snap.ID); err != nil {
		d.log.Warn("cluster: a moved sandbox's snapshot not removed", "snapshot", snap.ID, "err", err)
	}
	if err := n.Do(ctx, to, http.MethodDelete, "/snapshots/"+there.ID, "", nil, nil); err != nil {
		d.log.Warn("cluster: a moved sandbox's imported snapshot not removed", "node", to.Name, "snapshot", there.ID, "err", err)
	}
	return nil
}
