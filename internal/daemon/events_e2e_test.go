package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// eventStream is GET /events read a line at a time.
type eventStream struct {
	resp   *http.Response
	lines  *bufio.Scanner
	cancel context.CancelFunc
}

func (k *kilnd) events(t *testing.T, query string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), faultDeadline)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+k.addr+"/events"+query, nil)
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		cancel()
		t.Fatalf("GET /events%s: %d %s", query, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return &eventStream{resp: resp, lines: bufio.NewScanner(resp.Body), cancel: cancel}
}

func (s *eventStream) next(t *testing.T) api.Event {
	t.Helper()
	if !s.lines.Scan() {
		t.Fatalf("the events ended: %v", s.lines.Err())
	}
	var e api.Event
	if err := json.Unmarshal(s.lines.Bytes(), &e); err != nil {
		t.Fatalf("%v in %s", err, s.lines.Bytes())
	}
	return e
}

func (s *eventStream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// TestEventsResumeWithoutLossOrRepeat: a reader of GET /events sees each
// sandbox created, its processes started and exited, the sandbox stopped
// (its init's exit and why) and deleted, in order, numbered one after another; cut off half-way and back with
// after= the last it read, it gets exactly the rest, none twice; with
// follow=false it gets those held and an end; a filter keeps one
// sandbox's.
func TestEventsResumeWithoutLossOrRepeat(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	live := k.events(t, "")
	var web, job daemon.Info
	k.json("POST", "/sandboxes", `{"name":"web"}`, &web)
	k.json("POST", "/sandboxes", `{"init":{"command":"sh","args":["-c","exit 3"]}}`, &job)

	var seen []api.Event
	want := func(s *eventStream, typ, sandbox string) api.Event {
		t.Helper()
		e := s.next(t)
		if e.Type != typ || e.Sandbox != sandbox || e.Epoch == "" || e.Time.IsZero() {
			t.Fatalf("event %+v, want %s of %s", e, typ, sandbox)
		}
		if n := len(seen); n > 0 && e.Seq != seen[n-1].Seq+1 {
			t.Fatalf("event %d after %d", e.Seq, seen[n-1].Seq)
		}
		seen = append(seen, e)
		return e
	}
	if e := want(live, api.EventCreated, web.ID); e.Seq != 1 || e.Name != "web" {
		t.Errorf("the first event: %+v", e)
	}
	want(live, api.EventCreated, job.ID)
	// Its init, a process like any: started, then exited with its bytes
	// counted, before the sandbox it ended stopped.
	started := want(live, api.EventProcessStarted, job.ID)
	if p := started.Process; p == nil || p.Command != "sh" || p.State != api.StateRunning || p.ExitCode != nil {
		t.Errorf("the init's start: %+v", p)
	}
	exited := want(live, api.EventProcessExited, job.ID)
	if p := exited.Process; p == nil || p.ID != started.Process.ID || p.ExitCode == nil || *p.ExitCode != 3 || p.Streams["stdout"].TotalBytes != 0 {
		t.Errorf("the init's exit: %+v", p)
	}
	stopped := want(live, api.EventStopped, job.ID)
	if stopped.Exit == nil || stopped.Exit.ExitCode == nil || *stopped.Exit.ExitCode != 3 || stopped.Reason == "" {
		t.Errorf("the init's end: %+v", stopped)
	}
	// Cut off: what happens meanwhile is read on coming back.
	live.close()
	k.json("DELETE", "/sandboxes/"+job.ID, nil, nil)
	k.json("DELETE", "/sandboxes/web", nil, nil)
	again := k.events(t, fmt.Sprintf("?after=%d", seen[len(seen)-1].Seq))
	want(again, api.EventDeleted, job.ID)
	if e := want(again, api.EventDeleted, web.ID); e.Reason != "deleted" || e.Name != "web" {
		t.Errorf("web's delete: %+v", e)
	}
	// Nothing more: the next event is the next sandbox's.
	var other daemon.Info
	k.json("POST", "/sandboxes", `{}`, &other)
	want(again, api.EventCreated, other.ID)
	again.close()

	held := k.events(t, "?follow=false&sandbox="+job.ID)
	n := 0
	for held.lines.Scan() {
		n++
	}
	held.close()
	if n != 5 {
		t.Errorf("job's events held: %d, want created, its init's start and exit, stopped, deleted", n)
	}
	// Outside a cluster no event has a node: a node's are none, as a
	// node's sandboxes are none in GET /sandboxes?node=.
	byNode := k.events(t, "?follow=false&node=n1")
	for byNode.lines.Scan() {
		t.Errorf("an event of node n1 outside a cluster: %s", byNode.lines.Bytes())
	}
	byNode.close()
	k.refuses("GET", "/events?type=process.begun", nil, 400, api.CodeInvalid, "process.exited")
	k.refuses("GET", "/events?after=-1", nil, 400, api.CodeInvalid, "after")
	k.refuses("GET", "/events?type=nothing", nil, 400, api.CodeInvalid, "type")
	k.refuses("GET", "/events?colour=red", nil, 400, api.CodeInvalid, `"colour"`)
}

// TestEventsOverWebSocket: GET /events as a WebSocket (kiln.events) gives
// the same events, one a text message, from after= on, live; a browser's
// token subprotocol is taken; with follow=false the connection closes
// with 1000 once those held are sent.
func TestEventsOverWebSocket(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	ctx, cancel := context.WithTimeout(t.Context(), faultDeadline)
	defer cancel()
	dial := func(query string) *websocket.Conn {
		t.Helper()
		c, resp, err := websocket.Dial(ctx, "ws://"+k.addr+"/events"+query,
			&websocket.DialOptions{Subprotocols: []string{api.ProtocolEvents, api.TokenProtocolPrefix + k.d.Token()}})
		if err != nil {
			t.Fatalf("GET /events%s as a WebSocket: %v", query, err)
		}
		if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != api.ProtocolEvents {
			t.Errorf("subprotocol %q", got)
		}
		return c
	}
	read := func(c *websocket.Conn) api.Event {
		t.Helper()
		typ, b, err := c.Read(ctx)
		if err != nil || typ != websocket.MessageText {
			t.Fatalf("read: %v %v", typ, err)
		}
		var e api.Event
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return e
	}
	live := dial("")
	defer live.CloseNow()
	var a, b daemon.Info
	k.json("POST", "/sandboxes", `{"name":"a"}`, &a)
	if e := read(live); e.Type != api.EventCreated || e.Sandbox != a.ID || e.Seq != 1 {
		t.Errorf("the first event: %+v", e)
	}
	k.json("POST", "/sandboxes", `{"name":"b"}`, &b)
	if e := read(live); e.Type != api.EventCreated || e.Sandbox != b.ID || e.Seq != 2 {
		t.Errorf("the second event: %+v", e)
	}
	held := dial("?after=1&follow=false")
	if e := read(held); e.Seq != 2 || e.Sandbox != b.ID {
		t.Errorf("after 1: %+v", e)
	}
	if _, _, err := held.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Errorf("follow=false after the events held: %v, want a close with 1000", err)
	}
	// Refused as the NDJSON form is, before any upgrade.
	k.refuses("GET", "/events?type=nothing", nil, 400, api.CodeInvalid, "type")
}
