package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
)

// closed reads a watcher until the server ends it, and returns how.
func closed(ctx context.Context, t *testing.T, c *websocket.Conn) websocket.CloseError {
	t.Helper()
	for {
		_, _, err := c.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("the watcher ended without a close: %v", err)
		}
		return ce
	}
}

// TestHostileControlMessages: a watcher with stdin sends messages the
// agent must refuse. Each ends that watcher with the close code for what
// was wrong and a reason that fits a close frame; the process and its
// input are untouched, and the agent serves the next watcher.
func TestHostileControlMessages(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "cat", Stdin: api.StdinPipe})
	defer a.call("DELETE", "/exec-stream/"+id, nil, nil)
	for _, tc := range []struct {
		name   string
		typ    websocket.MessageType
		msg    string
		code   websocket.StatusCode
		reason string
	}{
		{"not JSON", websocket.MessageText, "stdin_close", websocket.StatusUnsupportedData, "malformed control message"},
		{"a JSON array", websocket.MessageText, `[{"type":"stdin_close"}]`, websocket.StatusUnsupportedData, "malformed control message"},
		{"a size past uint16", websocket.MessageText, `{"type":"resize","cols":70000,"rows":1}`, websocket.StatusUnsupportedData, "malformed control message"},
		{"a negative size", websocket.MessageText, `{"type":"resize","cols":-1,"rows":1}`, websocket.StatusUnsupportedData, "malformed control message"},
		{"an unknown type", websocket.MessageText, `{"type":"exec","command":"sh"}`, websocket.StatusPolicyViolation, `unknown message type "exec"`},
		{"no type", websocket.MessageText, `{}`, websocket.StatusPolicyViolation, `unknown message type ""`},
		{"a type in another case", websocket.MessageText, `{"type":"STDIN_CLOSE"}`, websocket.StatusPolicyViolation, `unknown message type "STDIN_CLOSE"`},
		{"a long type", websocket.MessageText, `{"type":"` + strings.Repeat("é", 20000) + `"}`, websocket.StatusPolicyViolation, ""},
		{"a non-UTF-8 type", websocket.MessageText, `{"type":"` + "\xff\xfe" + `"}`, websocket.StatusPolicyViolation, "unknown message type \"\uFFFD\uFFFD\""},
		{"a zero size", websocket.MessageText, `{"type":"resize","cols":0,"rows":24}`, websocket.StatusPolicyViolation, "terminal size 0x24"},
		{"a size past the bound", websocket.MessageText, `{"type":"resize","cols":80,"rows":4097}`, websocket.StatusPolicyViolation, "terminal size 80x4097"},
		{"a resize without a terminal", websocket.MessageText, `{"type":"resize","cols":80,"rows":24}`, websocket.StatusPolicyViolation, ""},
		{"input past the message limit", websocket.MessageBinary, strings.Repeat("x", api.MaxWSClient+1), websocket.StatusMessageTooBig, ""},
	} {
		ctx := ctxT(t)
		c := a.dial("/exec-stream/"+id+"/logs?stdin=1", api.ProtocolV1)
		if err := c.Write(ctx, tc.typ, []byte(tc.msg)); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		ce := closed(ctx, t, c)
		c.CloseNow()
		if ce.Code != tc.code || tc.reason != "" && ce.Reason != tc.reason {
			t.Errorf("%s: closed with %v %q, want %v %q", tc.name, ce.Code, ce.Reason, tc.code, tc.reason)
		}
		if len(ce.Reason) > 123 || !utf8.ValidString(ce.Reason) {
			t.Errorf("%s: close reason %q", tc.name, ce.Reason)
		}
		var p api.Process
		a.call("GET", "/exec-stream/"+id, nil, &p)
		if p.State != api.StateRunning || p.Stdin == nil || p.Stdin.Accepted != 0 || p.Stdin.Closed {
			t.Fatalf("%s: the process after it: %+v, stdin %+v", tc.name, p, p.Stdin)
		}
	}

	// The messages done right, on a terminal: a resize the process sees,
	// then input.
	tty := a.start(api.ExecRequest{Command: "sh", Args: []string{"-c", "read x; stty size"}, TTY: &api.TTY{Cols: 80, Rows: 24}})
	ctx := ctxT(t)
	c := a.dial("/exec-stream/"+tty+"/logs?stdin=1", api.ProtocolV1)
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":100,"rows":30}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	w := &apitest.Checker{Keep: true}
	if err := w.Read(ctx, c); err != nil {
		t.Fatalf("watch: %v", err)
	}
	out := w.Stream("terminal").Data
	if !strings.Contains(string(out), "30 100") {
		t.Errorf("after a resize to 100x30 the terminal said %q", out)
	}
}
