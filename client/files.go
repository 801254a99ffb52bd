package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// filesPath is the route of the absolute path p inside the sandbox.
func (s *Sandbox) filesPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("client: %q: a path in a sandbox is absolute", p)
	}
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, seg := range segs {
		segs[i] = url.PathEscape(seg)
	}
	return s.path("/files/" + strings.Join(segs, "/")), nil
}

// WriteFile writes the content r gives to the file p in the sandbox,
// making its parent directories as needed, streamed, all or nothing: p
// holds the whole content once it returns without an error, and is as it
// was otherwise (IsNoSpace: the sandbox's disk is full). Its permission is
// mode; when mode is zero, a replaced file's (without setuid and setgid),
// or 0644 for a new file. A replaced file keeps its owner and group; a
// new one belongs to the sandbox's root. A directory or a symbolic link at
// p is not replaced (IsFailedPrecondition).
func (s *Sandbox) WriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) (api.FileInfo, error) {
	route, err := s.filesPath(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	q := url.Values{}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	resp, _, err := s.c.request(ctx, s.c.stream, "PUT", route, q, r, "application/octet-stream")
	if err != nil {
		return api.FileInfo{}, err
	}
	defer resp.Body.Close()
	var fi api.FileInfo
	err = json.NewDecoder(resp.Body).Decode(&fi)
	return fi, err
}

// ReadFile reads the file p in the sandbox, streamed; the caller closes
// it.
func (s *Sandbox) ReadFile(ctx context.Context, p string) (io.ReadCloser, error) {
	return s.ReadFileRange(ctx, p, 0, -1)
}

// ReadFileRange reads n bytes of the file p from offset (to its end when
// n is negative).
func (s *Sandbox) ReadFileRange(ctx context.Context, p string, offset, n int64) (io.ReadCloser, error) {
	route, err := s.filesPath(p)
	if err != nil {
		return nil, err
	}
	var header map[string]string
	switch {
	case n == 0:
		return io.NopCloser(strings.NewReader("")), nil
	case n > 0:
		header = map[string]string{"Range": fmt.Sprintf("bytes=%d-%d", offset, offset+n-1)}
	case offset > 0:
		header = map[string]string{"Range": fmt.Sprintf("bytes=%d-", offset)}
	}
	resp, _, err := s.c.requestWith(ctx, s.c.stream, "GET", route, nil, nil, "", header)
	if err != nil {
		return nil, err
	}
	if resp.Header.Get("Content-Type") == "application/json" {
		resp.Body.Close()
		return nil, &Error{Status: 400, Code: api.CodePrecondition, Message: p + " is a directory"}
	}
	return resp.Body, nil
}

// Stat describes the entry p in the sandbox, not following a final
// symbolic link.
func (s *Sandbox) Stat(ctx context.Context, p string) (api.FileInfo, error) {
	route, err := s.filesPath(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	err = s.c.call(ctx, "GET", route, url.Values{"stat": {"true"}}, nil, &fi, true)
	return fi, err
}

// ReadDir lists the directory p in the sandbox, in the order of the
// entries' names.
func (s *Sandbox) ReadDir(ctx context.Context, p string) ([]api.FileInfo, error) {
	route, err := s.filesPath(p)
	if err != nil {
		return nil, err
	}
	resp, _, err := s.c.request(ctx, s.c.stream, "GET", route, nil, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/json" {
		return nil, &Error{Status: 400, Code: api.CodePrecondition, Message: p + " is not a directory"}
	}
	var list []api.FileInfo
	err = json.NewDecoder(resp.Body).Decode(&list)
	return list, err
}

// Remove removes the file or empty directory p in the sandbox; with
// recursive, a directory and everything in it.
func (s *Sandbox) Remove(ctx context.Context, p string, recursive bool) error {
	route, err := s.filesPath(p)
	if err != nil {
		return err
	}
	return s.c.call(ctx, "DELETE", route, url.Values{"recursive": {strconv.FormatBool(recursive)}}, nil, nil, true)
}

// Mkdir makes the directory p in the sandbox and its parents, with mode
// (0755 when zero).
func (s *Sandbox) Mkdir(ctx context.Context, p string, mode fs.FileMode) (api.FileInfo, error) {
	route, err := s.filesPath(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	q := url.Values{"op": {"mkdir"}}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	var fi api.FileInfo
	err = s.c.call(ctx, "POST", route, q, nil, &fi, true)
	return fi, err
}

// Move renames from to to in the sandbox.
func (s *Sandbox) Move(ctx context.Context, from, to string) (api.FileInfo, error) {
	route, err := s.filesPath(from)
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	err = s.c.call(ctx, "POST", route, url.Values{"op": {"move"}, "to": {to}}, nil, &fi, false)
	return fi, err
}

// Archive reads a tar of p in the sandbox (a directory with everything in
// it, or one file), its entries named from p's base name, as docker cp
// gives it; and what p is. The caller closes it.
func (s *Sandbox) Archive(ctx context.Context, p string) (io.ReadCloser, api.FileInfo, error) {
	resp, _, err := s.c.request(ctx, s.c.stream, "GET", s.path("/archive"), url.Values{"path": {p}}, nil, "")
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	var fi api.FileInfo
	json.Unmarshal([]byte(resp.Header.Get(api.PathStatHeader)), &fi)
	return resp.Body, fi, nil
}

// Extract extracts the tar r gives into the directory dir in the sandbox,
// which must exist, all or nothing: nothing of it is in dir unless it
// returns without an error. Its entries belong to the sandbox's root.
// Members other than regular files, directories and links (sparse and
// contiguous files, FIFOs, devices) are refused (IsInvalid), and so are
// absolute names, ".." and links leading out of dir (IsPermissionDenied),
// naming the member.
func (s *Sandbox) Extract(ctx context.Context, dir string, r io.Reader) error {
	resp, _, err := s.c.request(ctx, s.c.stream, "PUT", s.path("/archive"), url.Values{"path": {dir}}, r, "application/x-tar")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// WatchOptions resume a files watch: ID is the watch's (its first
// message gives it), After the last event's number seen.
type WatchOptions struct {
	ID    string
	After uint64
}

// FileWatch is a directory's file events in a sandbox: create, write,
// remove, rename, each with its number. Events the watch no longer held
// when this watcher came for them come as a gap with their exact count.
type FileWatch struct {
	// ID and Dir name the watch: WatchOptions{ID, After} resumes it for
	// a while after its last watcher went.
	ID, Dir string
	// Seq is the watch's last event's number when this watcher came.
	Seq  uint64
	conn *websocket.Conn
	ctx  context.Context
}

// WatchFiles watches the directory dir in the sandbox and everything
// below it.
func (s *Sandbox) WatchFiles(ctx context.Context, dir string, o WatchOptions) (*FileWatch, error) {
	route, err := s.filesPath(dir)
	if err != nil {
		return nil, err
	}
	q := url.Values{"watch": {"true"}}
	if o.ID != "" {
		q.Set("id", o.ID)
		q.Set("after", strconv.FormatUint(o.After, 10))
	}
	c, err := s.c.dial(ctx, route, q, api.ProtocolWatch)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(1 << 20)
	_, b, err := c.Read(ctx)
	var hello api.WatchHello
	if err == nil {
		err = json.Unmarshal(b, &hello)
	}
	if err != nil || hello.Type != api.WatchTypeHello {
		c.CloseNow()
		return nil, fmt.Errorf("client: watch %s: no hello: %w", dir, err)
	}
	return &FileWatch{ID: hello.ID, Dir: hello.Dir, Seq: hello.Seq, conn: c, ctx: ctx}, nil
}

// Next is the next event or gap, waiting for it.
func (w *FileWatch) Next() (api.FileEvent, error) {
	_, b, err := w.conn.Read(w.ctx)
	if err != nil {
		return api.FileEvent{}, err
	}
	var e api.FileEvent
	if err := json.Unmarshal(b, &e); err != nil {
		return api.FileEvent{}, fmt.Errorf("client: watch: %w", err)
	}
	return e, nil
}

// Close ends this watcher; the watch stays for a while for another.
func (w *FileWatch) Close() error { return w.conn.Close(websocket.StatusNormalClosure, "") }
