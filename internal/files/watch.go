package files

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// A watch is a directory's file events, as the helper's inotify reports
// them, each given a sequence number and kept in a ring: a watcher that
// connects again from the last it saw misses nothing the ring still
// holds, and is told exactly how many it missed beyond that. A watch with
// no watcher ends after watchGrace.
const (
	watchRing  = 4096
	watchGrace = 30 * time.Second
	// maxWatches bounds a sandbox's watches.
	maxWatches = 16
)

// inotifyMask is what the helper watches for.
const inotifyMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_ONLYDIR

// watchTree is the helper's side: it watches dir and every directory
// below it (those made later too) and writes each event as a JSON line
// after its header, until the agent goes.
func watchTree(conn *net.UnixConn, dir string) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	t := &treeWatch{fd: fd, dir: dir, paths: map[int]string{}, made: map[string]bool{}}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("files: %s is not a directory: %w", dir, unix.ENOTDIR)
	}
	t.add(dir, false)
	if err := answer(conn, info(dir, fi), -1, nil); err != nil {
		return nil
	}
	t.w = bufio.NewWriter(conn)
	buf := make([]byte, 64<<10)
	for {
		if t.w.Buffered() > 0 || t.moved != nil {
			// Nothing more for a moment: what is pending goes out.
			if !readable(fd, 50) {
				t.flush()
				if t.w.Flush() != nil {
					return nil
				}
			}
		}
		n, err := unix.Read(fd, buf)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return nil
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				for i, c := range raw {
					if c == 0 {
						raw = raw[:i]
						break
					}
				}
				name = string(raw)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			t.event(ev, name)
		}
	}
}

// readable says whether the inotify instance fd has events within ms
// milliseconds. A poll a signal cut short (the runtime's preemption
// signals come often) is made again for the time left: taken for
// "readable", it would leave the events pending unsent until the next
// change in the tree, however long that is.
func readable(fd int, ms int) bool {
	deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, max(0, int(time.Until(deadline).Milliseconds())))
		if err == unix.EINTR {
			continue
		}
		return n > 0 || err != nil
	}
}

// treeWatch is the state of watchTree's watch.
type treeWatch struct {
	fd    int            // the inotify instance
	dir   string         // the watched tree's top
	paths map[int]string // each watch's directory
	w     *bufio.Writer  // the events, as JSON lines, to the agent
	last  api.FileEvent  // the event emitted last
	// Of a directory made while the watch runs (fresh), what was made in
	// it before its own watch came is told as created (found); what its
	// watch then reports again is told once (made).
	made  map[string]bool
	found []api.FileEvent
	// A move's two halves come as two events with one cookie: a move out
	// of the tree is a remove, into it a create.
	moved       *api.FileEvent
	movedCookie uint32
}

// add watches p and the directories below it.
func (t *treeWatch) add(p string, fresh bool) {
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fresh && q != p {
			t.found = append(t.found, api.FileEvent{Op: api.FileCreated, Path: q, Dir: d.IsDir()})
			t.made[q] = true
			if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
				t.found = append(t.found, api.FileEvent{Op: api.FileWritten, Path: q})
				t.made["write "+q] = true
			}
		}
		if !d.IsDir() {
			return nil
		}
		if wd, err := unix.InotifyAddWatch(t.fd, q, inotifyMask); err == nil {
			t.paths[wd] = q
		}
		return nil
	})
}

// emit writes an event, one write event for a run of writes to a file.
func (t *treeWatch) emit(e api.FileEvent) {
	if e.Op == api.FileWritten && t.last == e {
		return
	}
	t.last = e
	b, _ := json.Marshal(e)
	t.w.Write(append(b, '\n'))
}

// flush tells a move whose other half did not come as a remove.
func (t *treeWatch) flush() {
	if t.moved != nil {
		t.moved.Op = api.FileRemoved
		t.emit(*t.moved)
		t.moved = nil
	}
}

// event tells what one inotify event, of the entry name, says.
func (t *treeWatch) event(ev *unix.InotifyEvent, name string) {
	if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
		t.flush()
		t.emit(api.FileEvent{Op: api.FileOverflow})
		return
	}
	base, ok := t.paths[int(ev.Wd)]
	if !ok {
		return
	}
	p := filepath.Join(base, name)
	isDir := ev.Mask&unix.IN_ISDIR != 0
	if ev.Mask&unix.IN_IGNORED != 0 {
		delete(t.paths, int(ev.Wd))
		return
	}
	if t.moved != nil && !(ev.Mask&unix.IN_MOVED_TO != 0 && ev.Cookie == t.movedCookie) {
		t.flush()
	}
	switch {
	case ev.Mask&unix.IN_CREATE != 0:
		if t.made[p] {
			delete(t.made, p) // told already, when its directory was found
			break
		}
		t.emit(api.FileEvent{Op: api.FileCreated, Path: p, Dir: isDir})
		if isDir {
			t.add(p, true)
		}
	case ev.Mask&unix.IN_MODIFY != 0:
		if t.made["write "+p] {
			delete(t.made, "write "+p)
			break
		}
		t.emit(api.FileEvent{Op: api.FileWritten, Path: p})
	case ev.Mask&unix.IN_DELETE != 0:
		t.emit(api.FileEvent{Op: api.FileRemoved, Path: p, Dir: isDir})
	case ev.Mask&unix.IN_MOVED_FROM != 0:
		t.moved, t.movedCookie = &api.FileEvent{Path: p, Dir: isDir}, ev.Cookie
	case ev.Mask&unix.IN_MOVED_TO != 0:
		if t.moved != nil {
			t.emit(api.FileEvent{Op: api.FileRenamed, From: t.moved.Path, Path: p, Dir: isDir})
			t.moved = nil
		} else {
			t.emit(api.FileEvent{Op: api.FileCreated, Path: p, Dir: isDir})
		}
		if isDir {
			t.add(p, true)
		}
	case ev.Mask&unix.IN_DELETE_SELF != 0 && base == t.dir:
		t.emit(api.FileEvent{Op: api.FileRemoved, Path: t.dir, Dir: true})
	}
	for _, e := range t.found {
		t.emit(e)
	}
	t.found = t.found[:0]
}

// watch is one directory's events, on the agent.
type watch struct {
	id   string
	dir  string
	call *call

	mu      sync.Mutex
	events  []api.FileEvent // the ring: events[seq % watchRing]
	next    uint64          // the seq the next event gets (from 1)
	ended   error           // why the helper stopped, once it did
	changed chan struct{}   // closed and replaced when events come or it ends
	users   int
	idle    *time.Timer
}

// watches are a Server's, by id.
type watches struct {
	mu       sync.Mutex
	m        map[string]*watch
	starting int // being made: counted against maxWatches
}

// pump reads the helper's events into the ring until it ends.
func (w *watch) pump(r io.Reader) {
	// An event names at most two paths of PATH_MAX: a longer line is not
	// one, and ends the watch (the helper is the sandbox's).
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 16<<10), 16<<10)
	for sc.Scan() {
		var e api.FileEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // the helper is the sandbox's: nothing but events counts
		}
		w.mu.Lock()
		w.next++
		e.Seq = w.next
		e.Type = api.WatchTypeEvent
		w.events[e.Seq%watchRing] = e
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	}
	w.mu.Lock()
	w.ended = fmt.Errorf("files: the watch of %s ended", w.dir)
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// since returns the events after seq the ring still holds, how many after
// seq it no longer does, and what to wait on for more.
func (w *watch) since(seq uint64) (evs []api.FileEvent, lost uint64, changed <-chan struct{}, ended error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	first := uint64(1)
	if w.next > watchRing {
		first = w.next - watchRing + 1
	}
	if seq+1 < first {
		lost, seq = first-seq-1, first-1
	}
	for s := seq + 1; s <= w.next; s++ {
		evs = append(evs, w.events[s%watchRing])
	}
	return evs, lost, w.changed, w.ended
}

// serveWatch serves GET /files/{path...}?watch=true: a WebSocket of the
// directory's events, or, with &id=ID&after=SEQ, of a watch made before,
// from after the last event seen.
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request, p string) {
	q := r.URL.Query()
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			reply.Error(w, fmt.Errorf("%w: after=%q: want a sequence number", errdefs.ErrInvalidArgument, v))
			return
		}
		after = n
	}
	wt, err := s.watchOf(r.Context(), p, q.Get("id"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer s.release(wt)
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{api.ProtocolWatch}, InsecureSkipVerify: true})
	if err != nil {
		return // Accept has answered
	}
	defer c.CloseNow()
	ctx := c.CloseRead(r.Context()) // the client sends nothing
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return c.Write(wctx, websocket.MessageText, b) == nil
	}
	wt.mu.Lock()
	last := wt.next
	wt.mu.Unlock()
	if !send(api.WatchHello{Type: api.WatchTypeHello, ID: wt.id, Dir: wt.dir, Seq: last}) {
		return
	}
	seq := after
	if q.Get("id") == "" {
		seq = 0 // a new watch: everything from its start
	} else if after > last {
		c.Close(websocket.StatusPolicyViolation, fmt.Sprintf("after=%d: the watch has %d events", after, last))
		return
	}
	for {
		evs, lost, changed, ended := wt.since(seq)
		if lost > 0 {
			if !send(api.FileEvent{Type: api.WatchTypeGap, Seq: seq + lost, Lost: lost}) {
				return
			}
			seq += lost
		}
		for _, e := range evs {
			if !send(e) {
				return
			}
			seq = e.Seq
		}
		if ended != nil && len(evs) == 0 {
			c.Close(websocket.StatusNormalClosure, "the watch ended")
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// watchOf returns the watch id (a new one of dir when id is empty), held
// by the caller until release.
func (s *Server) watchOf(ctx context.Context, dir, id string) (*watch, error) {
	s.watches.mu.Lock()
	if s.watches.m == nil {
		s.watches.m = map[string]*watch{}
	}
	if id != "" {
		wt, ok := s.watches.m[id]
		if ok && wt.dir == dir {
			wt.mu.Lock()
			wt.users++
			if wt.idle != nil {
				wt.idle.Stop()
			}
			wt.mu.Unlock()
		}
		s.watches.mu.Unlock()
		if !ok || wt.dir != dir {
			return nil, fmt.Errorf("%w: no watch %q of %s (it ended %v after its last watcher, or never was)", errdefs.ErrNotFound, id, dir, watchGrace)
		}
		return wt, nil
	}
	if len(s.watches.m)+s.watches.starting >= maxWatches {
		s.watches.mu.Unlock()
		return nil, fmt.Errorf("%w: %d watches already", errdefs.ErrTooLarge, maxWatches)
	}
	s.watches.starting++
	s.watches.mu.Unlock()
	defer func() {
		s.watches.mu.Lock()
		s.watches.starting--
		s.watches.mu.Unlock()
	}()
	// The helper answers at once; then it lives as long as the watch, not
	// the request.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	c, err := s.start(hctx, "watch", dir)
	if err == nil {
		c.stop() // before the timeout's context ends, which would kill it
	}
	cancel()
	if err != nil {
		return nil, err
	}
	wt := &watch{id: uuid.Must(uuid.NewV7()).String(), dir: dir, call: c, events: make([]api.FileEvent, watchRing), changed: make(chan struct{}), users: 1}
	go wt.pump(c.body())
	s.watches.mu.Lock()
	s.watches.m[wt.id] = wt
	s.watches.mu.Unlock()
	return wt, nil
}

// release lets go of a watch; the last to go starts its grace period.
func (s *Server) release(wt *watch) {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	wt.users--
	if wt.users > 0 {
		return
	}
	wt.idle = time.AfterFunc(watchGrace, func() {
		// Under both locks, in watchOf's order: a watcher that came back
		// meanwhile keeps it.
		s.watches.mu.Lock()
		wt.mu.Lock()
		gone := wt.users == 0 && s.watches.m[wt.id] == wt
		if gone {
			delete(s.watches.m, wt.id)
		}
		wt.mu.Unlock()
		s.watches.mu.Unlock()
		if gone {
			wt.call.finish() // ends the helper, which waits for its next event
		}
	})
}
