package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/natstest"
	"github.com/sandkiln/sandkiln/internal/outexport"
)

// TestClusterReadsFilled: on a live node of a cluster, a process's
// output older than its ring (three times the ring's size was written)
// is read from the cluster's copy, then from the ring, then live: a
// kiln.v1 watcher from offset 0 and from the middle, and the logs
// endpoint (the process has no captured log), byte for byte, with no
// loss but what the copy itself lacks.
func TestClusterReadsFilled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	nats := natstest.Cluster(t, 1)
	a := startNode(t, "a", "", nats.URLs(), nil)
	ready(t, a)
	tok := a.token(t)
	code, body := a.do(t, tok, "POST", "/sandboxes", `{}`)
	var sb api.Sandbox
	if json.Unmarshal(body, &sb); code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	defer a.do(t, tok, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", "")
	// 260,000 lines, 3,120,000 bytes (three times the 1 MiB ring), in
	// 100 bursts; then the process waits for its input to close, and
	// says tail.
	script := `i=0; while [ $i -lt 100 ]; do awk -v b=$i 'BEGIN{for(j=0;j<2600;j++) printf "line-%06d\n", b*2600+j}'; i=$((i+1)); sleep 0.01; done; cat >/dev/null; echo tail`
	var want bytes.Buffer
	for i := range 260000 {
		fmt.Fprintf(&want, "line-%06d\n", i)
	}
	produced := int64(want.Len())
	req, _ := json.Marshal(api.ExecRequest{Command: "sh", Args: []string{"-c", script}, Stdin: api.StdinPipe})
	code, body = a.do(t, tok, "POST", "/sandboxes/"+sb.ID+"/exec-stream", string(req))
	var st api.Started
	if json.Unmarshal(body, &st); code != http.StatusOK || st.ID == "" {
		t.Fatalf("start: %d %s", code, body)
	}
	_, js := natsClient(t, nats.URLs())
	eventually(t, "the output written and in the cluster", func() (bool, string) {
		procs, err := outexport.Processes(context.Background(), js, "a", sb.ID, api.SandboxNodeLost)
		if err != nil || len(procs) != 1 {
			return false, fmt.Sprint(procs, err)
		}
		return procs[0].Streams["stdout"].TotalBytes == produced, fmt.Sprint(procs[0].Streams)
	})
	// What the copy itself lacks (its gap records): the most a filled
	// read may lack.
	rd, err := outexport.NewReader(context.Background(), js, "a", sb.ID, st.ID, outexport.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	copied, copyLost, _ := readAll(t, rd)
	rd.CloseNow()
	if int64(len(copied))+copyLost != produced {
		t.Fatalf("the copy: %d bytes and %d lost of %d", len(copied), copyLost, produced)
	}
	t.Logf("the cluster's copy: %d bytes, %d lost to the export", len(copied), copyLost)

	// Live, from 0: the copy, the ring, then what comes after the input
	// closes.
	w := watch(t, a, tok, sb.ID, st.ID, 0)
	if span := w.hello.Streams["stdout"]; span.First != 0 || span.Total != produced {
		t.Errorf("hello %+v: want the copy's first offset, 0, and the total %d", w.hello, produced)
	}
	w.readTo(t, produced)
	if code, body := a.do(t, tok, "POST", "/sandboxes/"+sb.ID+"/exec-stream/"+st.ID+"/stdin/close", ""); code/100 != 2 {
		t.Fatalf("stdin close: %d %s", code, body)
	}
	w.readTo(t, -1)
	whole := append(bytes.Clone(want.Bytes()), "tail\n"...)
	w.check(t, "live from 0", whole, 0, copyLost)
	if !w.ended || !w.exited {
		t.Errorf("live from 0: ended %v, exit %v", w.ended, w.exited)
	}

	// Once it ended, from the middle of what only the copy holds, and
	// from 0 again.
	for _, from := range []int64{1_000_000, 0} {
		w := watch(t, a, tok, sb.ID, st.ID, from)
		w.readTo(t, -1)
		w.check(t, "from "+strconv.FormatInt(from, 10), whole, from, copyLost)
	}

	// The logs endpoint: raw, then records.
	resp, raw := get(t, a, tok, "/sandboxes/"+sb.ID+"/logs/"+st.ID)
	if resp.StatusCode != 200 || (copyLost == 0 && !bytes.Equal(raw, whole)) || int64(len(raw)) > int64(len(whole)) {
		t.Errorf("logs: %d, %d bytes of %d (the copy lost %d)", resp.StatusCode, len(raw), len(whole), copyLost)
	}
	if copyLost == 0 && (resp.Trailer.Get("Kiln-Lost") != "{}" || resp.Trailer.Get("Kiln-Complete") != "true") {
		t.Errorf("logs' trailers: %v", resp.Trailer)
	}
	resp, recs := get(t, a, tok, "/sandboxes/"+sb.ID+"/logs/"+st.ID+"?format=json&tail=2")
	lines := strings.Split(strings.TrimSpace(string(recs)), "\n")
	var last, tail api.LogRecord
	if len(lines) == 2 {
		json.Unmarshal([]byte(lines[0]), &last)
		json.Unmarshal([]byte(lines[1]), &tail)
	}
	if resp.StatusCode != 200 || last.Text != "line-259999" || last.Offset == nil || *last.Offset != produced-12 ||
		tail.Text != "tail" || tail.Offset == nil || *tail.Offset != produced || last.Time.IsZero() {
		t.Errorf("logs as records, tail=2: %d %s", resp.StatusCode, recs)
	}
}

// get GETs path from n, the body read whole (trailers with it).
func get(t *testing.T, n *node, tok, path string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", n.url()+path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// watcher is a kiln.v1 watcher of a process's stdout: its hello, the
// bytes it got (each frame checked to continue where the stream stood),
// where they began, what its gaps said was lost, and whether its end and
// exit came.
type watcher struct {
	c             *websocket.Conn
	hello         api.Hello
	from, pos     int64
	got           []byte
	frames        []api.Frame
	lost          int64
	ended, exited bool
}

func watch(t *testing.T, n *node, tok, sbx, pid string, from int64) *watcher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := dialStdout(t, n, tok, sbx, pid, from)
	t.Cleanup(func() { c.CloseNow() })
	w := &watcher{c: c, from: from, pos: from}
	typ, b, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageText || json.Unmarshal(b, &w.hello) != nil || w.hello.Type != api.TypeHello {
		t.Fatalf("the first message: %s %v", b, err)
	}
	return w
}

// readTo reads until stdout got to offset to, or, for -1, to the close.
func (w *watcher) readTo(t *testing.T, to int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for to < 0 || w.pos < to {
		typ, b, err := w.c.Read(ctx)
		if err != nil {
			if to >= 0 || websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("at %d: %v", w.pos, err)
			}
			return
		}
		if typ == websocket.MessageText {
			var m struct {
				Type string `json:"type"`
				api.Gap
			}
			json.Unmarshal(b, &m)
			switch {
			case m.Type == api.TypeGap && m.Stream == "stdout":
				if m.From != w.pos || m.LostBytes != m.To-m.From {
					t.Fatalf("a gap %s where the stream stood at %d", b, w.pos)
				}
				w.lost += m.LostBytes
				w.pos = m.To
			case m.Type == api.TypeEnd && m.Stream == "stdout":
				w.ended = true
			case m.Type == api.TypeExit:
				w.exited = true
			}
			continue
		}
		f, err := api.ParseFrame(b)
		if err != nil {
			t.Fatal(err)
		}
		if f.Stream != api.StreamStdout {
			continue
		}
		if int64(f.Offset) != w.pos {
			t.Fatalf("a frame at %d where the stream stood at %d", f.Offset, w.pos)
		}
		f.Data = bytes.Clone(f.Data)
		w.frames = append(w.frames, f)
		w.got = append(w.got, f.Data...)
		w.pos = int64(f.Offset) + int64(len(f.Data))
	}
}

// check says whether the watcher got want from its start: each frame's
// bytes those of want at its offset, the rest told lost, and no more
// lost than the copy lacks (none if it lacks none).
func (w *watcher) check(t *testing.T, what string, want []byte, from int64, copyLost int64) {
	t.Helper()
	for _, f := range w.frames {
		end := int64(f.Offset) + int64(len(f.Data))
		if end > int64(len(want)) || !bytes.Equal(f.Data, want[f.Offset:end]) {
			t.Fatalf("%s: the frame at %d (%d bytes) is not the output's", what, f.Offset, len(f.Data))
		}
	}
	if int64(len(w.got))+w.lost != int64(len(want))-from || w.lost > copyLost {
		t.Errorf("%s: %d bytes and %d lost from %d, want the %d bytes to %d (the copy lacks %d)", what, len(w.got), w.lost, from,
			int64(len(want))-from, len(want), copyLost)
	}
	if copyLost == 0 && !bytes.Equal(w.got, want[from:]) {
		t.Errorf("%s: %d bytes, not the output's %d", what, len(w.got), int64(len(want))-from)
	}
}
