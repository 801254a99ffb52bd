package daemon

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Listing sandboxes: GET /sandboxes, its filters and its pages.

// MaxListLimit bounds GET /sandboxes?limit=.
const MaxListLimit = 1000

// listHandler answers GET /sandboxes: the sandboxes its query chooses
// (label, name, state, image, runtime, node; all for the deleted ones kept
// too), a page of limit at a time, the next page's cursor in
// Kiln-Next-Cursor and a Link header.
func (d *Daemon) listHandler(w http.ResponseWriter, r *http.Request) {
	s, err := selectionOf(r.URL.Query())
	if err != nil {
		reply.Error(w, err)
		return
	}
	var list []Info
	var next string
	if d.cluster != nil && r.Header.Get(cluster.ForwardedHeader) == "" {
		limit := s.Limit
		s.Limit = 0
		if list, _, err = d.Select(s); err == nil {
			s.Limit = limit
			list, next, err = d.withRemote(list, s)
		}
	} else {
		list, next, err = d.Select(s)
	}
	if err != nil {
		reply.Error(w, err)
		return
	}
	if next != "" {
		q := r.URL.Query()
		q.Set("cursor", next)
		w.Header().Set(api.NextCursorHeader, next)
		w.Header().Set("Link", "<"+r.URL.Path+"?"+q.Encode()+`>; rel="next"`)
	}
	reply.JSON(w, http.StatusOK, list)
}

// selectionOf reads a list's query. A parameter it does not know is
// refused, so that a misspelt filter does not list everything.
func selectionOf(q url.Values) (Selection, error) {
	var s Selection
	invalid := func(format string, a ...any) (Selection, error) {
		return Selection{}, fmt.Errorf("%w: "+format, append([]any{errdefs.ErrInvalidArgument}, a...)...)
	}
	for k, vs := range q {
		if len(vs) > 1 && k != "label" {
			return invalid("%s given %d times: want it once", api.Clip(k), len(vs))
		}
		v := vs[0]
		switch k {
		case "label":
			if len(vs) > api.MaxLabels {
				return invalid("label given %d times: want at most %d", len(vs), api.MaxLabels)
			}
			for _, l := range vs {
				if key, _, _ := strings.Cut(l, "="); !isLabelKey(key) {
					return invalid("label %q: want KEY or KEY=VALUE, KEY 1 to %d of a-z, A-Z, 0-9, '.', '_', '-' and '/'", api.Clip(l), api.MaxLabelKeyLen)
				}
			}
			s.Labels = vs
		case "name":
			s.Name = v
		case "image":
			s.Image = v
		case "runtime":
			s.Runtime = v
		case "node":
			s.Node = v
		case "state":
			if v != StateRunning && v != api.SandboxPaused && v != StateStopped && v != StateDeleted && v != api.SandboxUnknown && v != api.SandboxNodeLost {
				return invalid("state %q: want %s, %s, %s, %s, or in a cluster %s or %s", api.Clip(v), StateRunning, api.SandboxPaused, StateStopped, StateDeleted, api.SandboxUnknown, api.SandboxNodeLost)
			}
			s.State = v
			s.Deleted = s.Deleted || v == StateDeleted
		case "all":
			all, err := strconv.ParseBool(v)
			if err != nil {
				return invalid("all %q: want true or false", api.Clip(v))
			}
			s.Deleted = s.Deleted || all
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxListLimit {
				return invalid("limit %q: want 1 to %d", api.Clip(v), MaxListLimit)
			}
			s.Limit = n
		case "cursor":
			s.After = v
		default:
			return invalid("no list parameter %q: want label, name, state, image, runtime, node, all, limit or cursor", api.Clip(k))
		}
	}
	return s, nil
}

// List returns every sandbox not deleted, oldest first.
func (d *Daemon) List() []Info {
	list, _, _ := d.Select(Selection{})
	return list
}

// Selection chooses sandboxes for Select: each field left empty chooses
// all.
type Selection struct {
	// Labels must each match: "KEY" (the sandbox has the label) or
	// "KEY=VALUE".
	Labels                      []string
	Name, State, Image, Runtime string
	// Node, in a cluster, is the node the sandboxes run on (Info.Node):
	// outside one, where sandboxes have no node, it chooses none.
	Node string
	// Deleted takes in the deleted sandboxes whose records are kept
	// (kilnd --keep-deleted).
	Deleted bool
	// After, a cursor Select gave, starts after the sandbox it names;
	// Limit, when not 0, is the most it returns.
	After string
	Limit int
}

// matches reports whether rec, on the node named node ("" outside a
// cluster), is chosen by s, its state aside.
func (s Selection) matches(rec record, node string) bool {
	if s.Name != "" && rec.Name != s.Name || s.Runtime != "" && runtimeOf(rec) != s.Runtime || s.Node != "" && node != s.Node {
		return false
	}
	if s.Image != "" && rec.Image != s.Image && rec.ImageID != s.Image && !strings.HasPrefix(rec.ImageID, "sha256:"+s.Image) {
		return false
	}
	for _, l := range s.Labels {
		k, v, hasValue := strings.Cut(l, "=")
		got, ok := rec.Labels[k]
		if !ok || hasValue && got != v {
			return false
		}
	}
	return true
}

// nodeName is the name of e's node in its cluster, "" outside one.
func (e *entry) nodeName() string {
	if e.node != nil {
		if name := e.node.Load(); name != nil {
			return *name
		}
	}
	return ""
}

// Select returns the sandboxes s chooses, oldest first, and the cursor
// of the page after them ("" when there is none); its error is a cursor
// it did not give.
//
// It takes d.mu twice whatever the count: once for the entries, once for
// their infos. Between the two, outside the lock, it asks each running
// sandbox whether its agent lives (a read of /proc each): one whose agent
// died is recorded stopped, as get does, so that a list never shows it
// running.
func (d *Daemon) Select(s Selection) ([]Info, string, error) {
	type seen struct {
		e    *entry
		sb   sandbox.Instance // when running and not being deleted
		dead bool
	}
	after, err := parseCursor(s.After)
	if err != nil {
		return nil, "", err
	}
	d.mu.Lock()
	ids := d.live
	if s.Deleted {
		ids = slices.Collect(maps.Keys(d.sandboxes))
	}
	var all []seen
	for _, id := range ids {
		e := d.sandboxes[id]
		if !s.matches(e.rec, e.nodeName()) || s.After != "" && compareCursors(cursorOf(e.rec), after) <= 0 {
			continue
		}
		c := seen{e: e}
		if e.rec.State == StateRunning && !e.deleting {
			c.sb = e.sb
		}
		all = append(all, c)
	}
	d.mu.Unlock()
	slices.SortFunc(all, func(a, b seen) int { return compareCursors(cursorOf(a.e.rec), cursorOf(b.e.rec)) })
	for i := range all {
		if sb := all[i].sb; sb != nil {
			all[i].dead = !sb.Alive()
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := []Info{}
	var last record
	for _, c := range all {
		e := c.e
		if e.rec.State == StateDeleted && !s.Deleted {
			continue // deleted meanwhile
		}
		if c.dead && e.sb == c.sb {
			d.noticeExit(e)
		}
		if s.State != "" && stateOf(e.rec) != s.State {
			continue
		}
		if s.Limit > 0 && len(out) == s.Limit {
			return out, cursorOf(last).String(), nil
		}
		out = append(out, e.info())
		last = e.rec
	}
	return out, "", nil
}

// cursor is a place in a list of sandboxes, oldest first: a sandbox's
// creation and, for those made in the same nanosecond, its id. As a
// string it is the two with a dot between.
type cursor struct {
	created int64
	id      string
}

func cursorOf(rec record) cursor { return cursor{rec.CreatedAt.UnixNano(), rec.ID} }

func (c cursor) String() string { return strconv.FormatInt(c.created, 10) + "." + c.id }

func compareCursors(a, b cursor) int {
	if c := cmp.Compare(a.created, b.created); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

// parseCursor reads a cursor Select gave ("" for none).
func parseCursor(s string) (cursor, error) {
	if s == "" {
		return cursor{}, nil
	}
	created, id, _ := strings.Cut(s, ".")
	n, err := strconv.ParseInt(created, 10, 64)
	if err != nil || id == "" {
		return cursor{}, fmt.Errorf("%w: cursor %q: want one a page's Kiln-Next-Cursor gave", errdefs.ErrInvalidArgument, api.Clip(s))
	}
	return cursor{n, id}, nil
}
