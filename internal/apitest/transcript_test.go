package apitest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// scripted serves one WebSocket that sends msgs, then closes with code
// (or drops the connection when code is 0), and returns a client of it.
func scripted(t *testing.T, msgs []msg, code websocket.StatusCode) *websocket.Conn {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{api.ProtocolV1, api.ProtocolRaw}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for _, m := range msgs {
			if err := c.Write(r.Context(), m.typ, m.data); err != nil {
				return
			}
		}
		if code != 0 {
			c.Close(code, "")
		}
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), &websocket.DialOptions{Subprotocols: []string{api.ProtocolV1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		msgs   []msg
		code   websocket.StatusCode
		reason string // "" when the connection is as it should be
	}{
		{"whole", twoStreams, websocket.StatusNormalClosure, ""},
		{"closed before the exit", twoStreams[:6], websocket.StatusNormalClosure, "closed normally before the exit, at stderr=5 (ended) stdout=9 (ended) after 6 messages"},
		{"dropped before the exit", twoStreams[:3], 0, "at stderr=5 stdout=5 after 3 messages: failed to get reader"},
		{"closed abnormally after the exit", twoStreams, websocket.StatusGoingAway, "after the exit, failed to get reader: received close frame: status = StatusGoingAway"},
		{"a broken message", with(twoStreams, 3, gap("stdout", 4, 9)), websocket.StatusNormalClosure, "stdout gap [4, 9) at offset 4, expected one from 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			w, err := ReadAll(ctx, scripted(t, tc.msgs, tc.code), nil)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatal(err)
			case tc.reason == "" && (!w.Closed || string(w.Stream("stdout").Data) != "out1\nout2"):
				t.Errorf("read %v, stdout %q", w, w.Stream("stdout").Data)
			case tc.reason != "" && (err == nil || !strings.Contains(err.Error(), tc.reason)):
				t.Errorf("read: %v\nwant: %s", err, tc.reason)
			}
		})
	}
}

func TestReadRaw(t *testing.T) {
	bin := func(s string) msg { return msg{websocket.MessageBinary, []byte(s)} }
	line := func(s string) msg { return msg{websocket.MessageText, []byte(s)} }
	for _, tc := range []struct {
		name   string
		msgs   []msg
		code   websocket.StatusCode
		want   string
		reason string
	}{
		{"whole", []msg{bin("a\n"), line("[3 bytes of stdout lost]\n"), bin("b"), line("[process exited with code 0]\n")}, websocket.StatusNormalClosure,
			"a\n[3 bytes of stdout lost]\nb[process exited with code 0]\n", ""},
		{"no exit", []msg{bin("a\n")}, websocket.StatusNormalClosure, "a\n", `closed normally before the exit line, after "a\n"`},
		{"dropped", []msg{bin("a\n")}, 0, "a\n", "message 2: failed to get reader"},
		{"output after the exit", []msg{line("[process exited with code 0]\n"), bin("late")}, websocket.StatusNormalClosure,
			"[process exited with code 0]\n", `message 2, "late", after the exit line`},
		{"text that is not a line", []msg{line("exit 0")}, websocket.StatusNormalClosure, "", `message 1 is text "exit 0", not a line in brackets`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			got, err := ReadRaw(ctx, scripted(t, tc.msgs, tc.code))
			if got != tc.want || tc.reason == "" && err != nil || tc.reason != "" && (err == nil || !strings.Contains(err.Error(), tc.reason)) {
				t.Errorf("read %q, %v\nwant %q, %s", got, err, tc.want, tc.reason)
			}
		})
	}
}

func TestPattern(t *testing.T) {
	if got := string(Line.Bytes(30, 4)); got != "u\n01" {
		t.Errorf("bytes at 30: %q", got)
	}
	if err := Line.Check("stdout", 62, []byte("u\n01")); err != nil {
		t.Error(err)
	}
	if err := Line.Check("stdout", 63, []byte("\n0x")); err == nil || err.Error() != `stdout byte at offset 65 is 'x', want '1'` {
		t.Errorf("a wrong byte: %v", err)
	}
	if got := Line.Shell(100); got != "yes 0123456789abcdefghijklmnopqrstu | head -c 100" {
		t.Errorf("shell %q", got)
	}
}
