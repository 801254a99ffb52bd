package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
)

// v1Script is a kiln.v1 stream from a list of messages.
type v1Script struct{ msgs []v1Msg }

type v1Msg struct {
	typ  websocket.MessageType
	data []byte
}

func (s *v1Script) Read(context.Context) (websocket.MessageType, []byte, error) {
	if len(s.msgs) == 0 {
		return 0, nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m.typ, m.data, nil
}

func frameMsg(stream byte, off int64, data string) v1Msg {
	return v1Msg{websocket.MessageBinary, api.AppendFrame(nil, api.Frame{Stream: stream, Offset: uint64(off), Data: []byte(data)})}
}

func jsonMsg(v any) v1Msg {
	b, _ := json.Marshal(v)
	return v1Msg{websocket.MessageText, b}
}

// TestLogFromCluster: a kiln.v1 stream read as a captured log is: lines
// as records at their offsets (a line cut by a loss or the end partial,
// one longer than a record's most in pieces), each loss a record of its
// own with its exact count, in the trailers too; raw, the bytes
// themselves; tail and stream as for a log.
func TestLogFromCluster(t *testing.T) {
	long := strings.Repeat("x", capture.MaxContent+5)
	msgs := func() *v1Script {
		return &v1Script{msgs: []v1Msg{
			jsonMsg(api.Hello{Type: api.TypeHello, Streams: map[string]api.HelloSpan{"stdout": {First: 0, Total: 99}, "stderr": {First: 0, Total: 4}}}),
			frameMsg(api.StreamStdout, 0, "one\ntw"),
			frameMsg(api.StreamStderr, 0, "err\n"),
			frameMsg(api.StreamStdout, 6, "o\nthr"),
			jsonMsg(api.Gap{Type: api.TypeGap, Stream: "stdout", From: 11, To: 18, LostBytes: 7}),
			frameMsg(api.StreamStdout, 18, "four\n"+long+"\nfiv"),
		}}
	}
	wantRaw := "one\ntwo\nerr\nthr" + "four\n" + long + "\nfiv"
	serve := func(t *testing.T, query string) (*httptest.ResponseRecorder, string) {
		t.Helper()
		r := httptest.NewRequest("GET", "/sandboxes/x/logs/y"+query, nil)
		lq, err := parseLogQuery(r)
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		logFromCluster(w, r, lq, newV1Entries(msgs(), nil), "run-1", true)
		return w, w.Body.String()
	}

	w, body := serve(t, "")
	// Lines are held until they end: err comes before two's end, as its
	// line ended first.
	if want := "one\nerr\ntwo\nthr" + "four\n" + long + "\nfiv"; body != want {
		t.Errorf("raw: %q\nwant %q", clipped(body), clipped(want))
	}
	if len(body) != len(wantRaw) {
		t.Errorf("raw: %d bytes, want %d", len(body), len(wantRaw))
	}
	res := w.Result()
	if got := res.Trailer.Get("Kiln-Lost"); got != `{"stdout":7}` {
		t.Errorf("Kiln-Lost %q", got)
	}
	var runs []api.Run
	json.Unmarshal([]byte(res.Trailer.Get("Kiln-Runs")), &runs)
	if len(runs) != 1 || runs[0].ID != "run-1" || runs[0].State != "interrupted" || runs[0].Dropped["stdout"] != 7 || res.Trailer.Get("Kiln-Complete") != "false" {
		t.Errorf("runs %+v, complete %s", runs, res.Trailer.Get("Kiln-Complete"))
	}

	_, body = serve(t, "?format=json")
	var got []api.LogRecord
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		var rec api.LogRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		rec.Time = time.Time{}
		got = append(got, rec)
	}
	off := func(n int64) *int64 { return &n }
	want := []api.LogRecord{
		{Stream: "stdout", Offset: off(0), Text: "one"},
		{Stream: "stderr", Offset: off(0), Text: "err"},
		{Stream: "stdout", Offset: off(4), Text: "two"},
		{Stream: "stdout", Offset: off(8), Text: "thr", Partial: true},
		{Stream: "stdout", Offset: off(11), LostBytes: 7},
		{Stream: "stdout", Offset: off(18), Text: "four"},
		{Stream: "stdout", Offset: off(23), Text: long[:capture.MaxContent], Partial: true},
		{Stream: "stdout", Offset: off(23 + capture.MaxContent), Text: "xxxxx"},
		{Stream: "stdout", Offset: off(23 + int64(len(long)) + 1), Text: "fiv", Partial: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", clipped(diff))
	}

	if _, body := serve(t, "?tail=2&stream=stdout"); body != long+"\nfiv" {
		t.Errorf("tail=2: %q", clipped(body))
	}
	if _, body := serve(t, "?stream=stderr"); body != "err\n" {
		t.Errorf("stderr: %q", body)
	}
}

func clipped(s string) string {
	if len(s) > 200 {
		return s[:100] + "…" + s[len(s)-100:]
	}
	return s
}

// TestLogFromClusterEnds: a stream whose exit came is a lossless run when
// nothing was lost; a read that ends at the hello's totals stops there.
func TestLogFromClusterEnds(t *testing.T) {
	src := &v1Script{msgs: []v1Msg{
		jsonMsg(api.Hello{Type: api.TypeHello, Streams: map[string]api.HelloSpan{"stdout": {Total: 3}}}),
		frameMsg(api.StreamStdout, 0, "ab\n"),
		jsonMsg(api.End{Type: api.TypeEnd, Stream: "stdout", TotalBytes: 3}),
		jsonMsg(api.ExitMessage{Type: api.TypeExit}),
	}}
	r := httptest.NewRequest("GET", "/sandboxes/x/logs/y", nil)
	w := httptest.NewRecorder()
	logFromCluster(w, r, logQuery{filter: capture.Filter{Tail: -1}}, newV1Entries(src, nil), "run", true)
	if w.Body.String() != "ab\n" || w.Result().Trailer.Get("Kiln-Complete") != "true" {
		t.Errorf("%q %v", w.Body.String(), w.Result().Trailer)
	}

	live := &v1Script{msgs: []v1Msg{
		jsonMsg(api.Hello{Type: api.TypeHello, Streams: map[string]api.HelloSpan{"stdout": {Total: 3}}}),
		frameMsg(api.StreamStdout, 0, "ab\n"),
		frameMsg(api.StreamStdout, 3, "later\n"),
	}}
	v := newV1Entries(live, nil)
	v.target = map[string]int64{}
	var out bytes.Buffer
	readCaptured(context.Background(), v, logQuery{filter: capture.Filter{Tail: -1}}, func(e capture.Entry) error {
		out.Write(e.Payload())
		return nil
	})
	if out.String() != "ab\n" || len(live.msgs) != 1 {
		t.Errorf("without follow: %q, %d messages left", out.String(), len(live.msgs))
	}
}
