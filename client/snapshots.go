package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"

	"github.com/sandkiln/sandkiln/api"
)

// Snapshot takes a snapshot of the sandbox's files (its disk: /workspace
// and, with an image, the root's writes), running or stopped, named if
// name is set. Its processes go on; their writes wait the moment the
// copy takes. The snapshot outlives the sandbox. With o.Memory its
// processes are saved too (a running gVisor sandbox's). A sandbox without a
// disk of its own (disk_bytes 0) is an error IsFailedPrecondition
// reports; one past kilnd's snapshot quota, IsForbidden.
func (s *Sandbox) Snapshot(ctx context.Context, o api.SnapshotRequest) (api.Snapshot, error) {
	var out api.Snapshot
	return out, s.c.call(ctx, "POST", s.path("/snapshots"), nil, o, &out, false)
}

// Snapshots lists the sandbox's snapshots, oldest first.
func (s *Sandbox) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	var out []api.Snapshot
	return out, s.c.call(ctx, "GET", s.path("/snapshots"), nil, nil, &out, true)
}

// Rollback gives the sandbox the files of one of its snapshots (its id, a
// unique prefix of it, or its name): a running sandbox is stopped (as
// Stop, with o's timeout), gets a copy of the snapshot's disk, and runs
// again, its init command too; a stopped one stays stopped. The
// snapshot's processes are its history (api.Process.ForkedFrom).
func (s *Sandbox) Rollback(ctx context.Context, snapshot string, o StopOptions) (api.Sandbox, error) {
	q, _, err := o.query()
	if err != nil {
		return api.Sandbox{}, err
	}
	var out api.Sandbox
	return out, s.c.call(ctx, "POST", s.path("/rollback"), q, api.RollbackRequest{Snapshot: snapshot}, &out, false)
}

// Fork makes o.Count sandboxes (default 1), each with the sandbox's files
// as they are now, its image, limits, runtime, network policy (a new
// address each), init command and labels, o.Labels added. All are made,
// or none.
func (s *Sandbox) Fork(ctx context.Context, o api.ForkRequest) ([]*Sandbox, error) {
	var out api.Forked
	if err := s.c.call(ctx, "POST", s.path("/fork"), nil, o, &out, false); err != nil {
		return nil, err
	}
	made := make([]*Sandbox, len(out.Sandboxes))
	for i, info := range out.Sandboxes {
		made[i] = &Sandbox{c: s.c, ID: info.ID, Described: info}
	}
	return made, nil
}

// Snapshots lists kilnd's snapshots, oldest first; those of one sandbox
// (its id or a unique prefix of it; a deleted sandbox's id too) when
// sandbox is set.
func (c *Client) Snapshots(ctx context.Context, sandbox string) ([]api.Snapshot, error) {
	var q url.Values
	if sandbox != "" {
		q = url.Values{"sandbox": {sandbox}}
	}
	var out []api.Snapshot
	return out, c.call(ctx, "GET", "/snapshots", q, nil, &out, true)
}

// Snapshot describes a snapshot: ref is its id, a unique prefix of it, or
// its name.
func (c *Client) Snapshot(ctx context.Context, ref string) (api.Snapshot, error) {
	var out api.Snapshot
	return out, c.call(ctx, "GET", "/snapshots/"+url.PathEscape(ref), nil, nil, &out, true)
}

// RemoveSnapshot removes a snapshot; sandboxes made from it keep their
// files.
func (c *Client) RemoveSnapshot(ctx context.Context, ref string) error {
	return c.call(ctx, "DELETE", "/snapshots/"+url.PathEscape(ref), nil, nil, nil, true)
}

// ExportSnapshot reads a snapshot as a tar, for ImportSnapshot on another
// kilnd. The caller closes it. A tar that ends without its end-of-archive
// blocks is one whose export failed.
func (c *Client) ExportSnapshot(ctx context.Context, ref string) (io.ReadCloser, error) {
	resp, _, err := c.request(ctx, c.stream, "GET", "/snapshots/"+url.PathEscape(ref)+"/export", nil, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ImportSnapshot takes a snapshot from the tar ExportSnapshot gave, whole
// or not at all, with its id and name (IsAlreadyExists when either is
// taken here). A sandbox made from it needs its image here.
func (c *Client) ImportSnapshot(ctx context.Context, tar io.Reader) (api.Snapshot, error) {
	resp, _, err := c.request(ctx, c.stream, "POST", "/snapshots/import", nil, tar, "application/x-tar")
	if err != nil {
		return api.Snapshot{}, err
	}
	defer resp.Body.Close()
	var out api.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return api.Snapshot{}, fmt.Errorf("%w: POST /snapshots/import: reading the answer: %w", ErrOutcomeUnknown, err)
	}
	return out, nil
}
