package agent

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/process"
)

// grant sends a credit message of n bytes, with the offsets it acks.
func grant(t *testing.T, c *websocket.Conn, n int64, acked map[string]int64) {
	t.Helper()
	b, _ := json.Marshal(api.ClientMessage{Type: api.TypeCredit, Bytes: n, Offsets: acked})
	if err := c.Write(ctxT(t), websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// TestCreditBoundsWhatIsSent: a watcher that attached with credit=N is
// never sent more output than it has granted, at any moment, a frame
// costing at least api.CreditFrame (so a credit of 64 KiB is at most 256
// frames), and gets every byte, in order, granting as it reads; the ends
// and the exit come without more credit than the output needed. Both a
// burst (large frames) and short lines of two streams that interleave
// (frames of a few bytes, never merged).
func TestCreditBoundsWhatIsSent(t *testing.T) {
	a := newAgent(t)
	for _, tc := range []struct {
		name, script string
	}{
		{"burst", "head -c 2097152 /dev/urandom | tee /dev/stderr"},
		{"short lines", "i=0; while [ $i -lt 3000 ]; do echo $i; echo $i >&2; i=$((i+1)); done"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := a.start(api.ExecRequest{Command: "sh", Flow: api.FlowBlock, Args: []string{"-c", tc.script}})
			const window = 64 << 10
			c := a.dial("/exec-stream/"+id+"/logs?flow=block&ack=true&credit="+fmt.Sprint(window), api.ProtocolV1)
			w := &apitest.Checker{NoGaps: true, Keep: true}
			granted, spent := int64(window), int64(0)
			step := int64(1) // grants of changing sizes: 1 byte up to a window
			for w.Exit == nil {
				before := w.Stream("stdout").Delivered + w.Stream("stderr").Delivered
				kind, err := w.Next(ctxT(t), c)
				if err != nil {
					t.Fatalf("after %d of %d granted: %v", spent, granted, err)
				}
				if kind != apitest.TypeFrame {
					continue
				}
				n := w.Stream("stdout").Delivered + w.Stream("stderr").Delivered - before
				if spent += max(n, api.CreditFrame); spent > granted {
					t.Fatalf("sent frames costing %d with %d granted", spent, granted)
				}
				for granted-spent < api.CreditFrame {
					step = min(2*step+1, window)
					granted += step
					grant(t, c, step, w.Position())
				}
			}
			if err := w.Read(ctxT(t), c); err != nil { // to the close
				t.Fatal(err)
			}
			out, errs := w.Stream("stdout"), w.Stream("stderr")
			if !out.Ended || !errs.Ended || len(out.Data) == 0 || sha256.Sum256(out.Data) != sha256.Sum256(errs.Data) {
				t.Errorf("stdout and stderr differ, or did not end: %d and %d bytes", len(out.Data), len(errs.Data))
			}
		})
	}
}

// TestCreditRefusals: a credit that is not a positive number within
// api.MaxCredit is refused before anything is sent, and so is a credit
// message out of bounds or from a watcher that attached without credit.
func TestCreditRefusals(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "sh", Args: []string{"-c", "echo hi; read x"}, Stdin: api.StdinPipe})
	for _, v := range []string{"0", "-1", "x", "255", fmt.Sprint(int64(api.MaxCredit) + 1), "1e3"} {
		if code := a.call("GET", "/exec-stream/"+id+"/logs?credit="+v, nil, nil); code != http.StatusBadRequest {
			t.Errorf("credit=%s: status %d, want 400", v, code)
		}
	}
	for _, ms := range [][]api.ClientMessage{
		{{Type: api.TypeCredit, Bytes: 0}},
		{{Type: api.TypeCredit, Bytes: -5}},
		{{Type: api.TypeCredit, Bytes: api.MaxCredit + 1}},
		// More than api.MaxCredit outstanding, whatever was spent.
		{{Type: api.TypeCredit, Bytes: api.MaxCredit}, {Type: api.TypeCredit, Bytes: api.MaxCredit}},
	} {
		c := a.dial("/exec-stream/"+id+"/logs?credit=256", api.ProtocolV1)
		for _, m := range ms {
			b, _ := json.Marshal(m)
			if err := c.Write(ctxT(t), websocket.MessageText, b); err != nil {
				t.Fatal(err)
			}
		}
		if err := (&apitest.Checker{}).Read(ctxT(t), c); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
			t.Errorf("%+v: %v, want a close for a policy violation", ms, err)
		}
	}
	// Credit belongs to credit watchers, release to holding ones: a
	// holding watcher without credit sending credit, or one with credit
	// that holds nothing releasing, is closed.
	for typ, query := range map[string]string{api.TypeCredit: "?flow=block", api.TypeRelease: "?credit=256"} {
		hold := a.start(api.ExecRequest{Command: "true", Flow: api.FlowBlock})
		c := a.dial("/exec-stream/"+hold+"/logs"+query, api.ProtocolV1)
		b, _ := json.Marshal(api.ClientMessage{Type: typ, Bytes: 1})
		if err := c.Write(ctxT(t), websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		w := &apitest.Checker{}
		err := w.Read(ctxT(t), c)
		if websocket.CloseStatus(err) != websocket.StatusPolicyViolation && w.Exit == nil {
			t.Errorf("%s on %s: %v", typ, query, err)
		}
	}
}

// newAgentHolding is newAgent whose flow block processes wait for their
// holding readers far longer than any test runs: a process that ends in a
// test was let go.
func newAgentHolding(t *testing.T) *agent {
	logs := t.TempDir()
	d, err := capture.OpenDir(logs)
	if err != nil {
		t.Fatal(err)
	}
	table := process.NewTable(process.TableConfig{Logs: d.OpenSub})
	srv := serveAsTheAgent(New(Config{Table: table, Env: os.Environ(), Logs: d, FlowGrace: time.Hour}))
	t.Cleanup(func() {
		srv.Close()
		table.Shutdown(ctxT(t))
		d.Close()
	})
	return &agent{t: t, srv: srv, table: table, logs: logs}
}

// TestReleaseLetsTheProcessGo: a holding watcher that releases the output
// before it goes holds nothing after: the process, which waits for its
// reader otherwise, runs on to its end at once.
func TestReleaseLetsTheProcessGo(t *testing.T) {
	a := newAgentHolding(t)
	for _, query := range []string{"?flow=block&ack=true&credit=1024", "?flow=block&ack=true"} {
		t.Run(query, func(t *testing.T) { releaseLetsGo(t, a, query) })
	}
}

// releaseLetsGo reads a little of a held burst through query, releases,
// and goes: the process then runs to its end, and a later reader is told
// exactly what it lost.
func releaseLetsGo(t *testing.T, a *agent, query string) {
	id := a.start(api.ExecRequest{Command: "head", Args: []string{"-c", "16777216", "/dev/zero"}, Flow: api.FlowBlock})
	c := a.dial("/exec-stream/"+id+"/logs"+query, api.ProtocolV1)
	w := &apitest.Checker{}
	for w.Stream("stdout").Delivered < 1024 {
		if _, err := w.Next(ctxT(t), c); err != nil {
			t.Fatal(err)
		}
	}
	var st api.Process
	a.call("GET", "/exec-stream/"+id, nil, &st)
	if st.State != api.StateRunning {
		t.Fatalf("the held process is %s with 1 KiB of 16 MiB read", st.State)
	}
	b, _ := json.Marshal(api.ClientMessage{Type: api.TypeRelease})
	if err := c.Write(ctxT(t), websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	if e := a.wait(id); e.ExitCode == nil || *e.ExitCode != 0 {
		t.Fatalf("exit %v", e)
	}
	// A later reader is told exactly what the released output lost.
	w = &apitest.Checker{}
	if err := w.Read(ctxT(t), a.dial("/exec-stream/"+id+"/logs", api.ProtocolV1)); err != nil {
		t.Fatal(err)
	}
	if s := w.Stream("stdout"); s.Delivered+s.Lost != 16<<20 || s.Lost == 0 {
		t.Errorf("delivered %d and lost %d of 16 MiB", s.Delivered, s.Lost)
	}
}

// TestReleaseWithoutAWatcher: POST …/release lets go of what a flow block
// process holds for a first reader that never came, and of what a holding
// reader that went left held; a finished process answers it all the same.
func TestReleaseWithoutAWatcher(t *testing.T) {
	a := newAgentHolding(t)
	// Never read: held from its start at the ring's fill.
	id := a.start(api.ExecRequest{Command: "head", Args: []string{"-c", "16777216", "/dev/zero"}, Flow: api.FlowBlock})
	if code := a.call("POST", "/exec-stream/"+id+"/release", nil, nil); code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	if e := a.wait(id); e.ExitCode == nil || *e.ExitCode != 0 {
		t.Fatalf("exit %v", e)
	}
	// A holding reader that went: its hold stays for it until released.
	id = a.start(api.ExecRequest{Command: "head", Args: []string{"-c", "16777216", "/dev/zero"}, Flow: api.FlowBlock})
	c := a.dial("/exec-stream/"+id+"/logs?flow=block", api.ProtocolV1)
	w := &apitest.Checker{}
	for w.Stream("stdout").Delivered == 0 {
		if _, err := w.Next(ctxT(t), c); err != nil {
			t.Fatal(err)
		}
	}
	c.CloseNow()
	if code := a.call("POST", "/exec-stream/"+id+"/release", nil, nil); code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	// The agent may not have seen the close yet, its reader still
	// attached and holding: released again once it is gone.
	done := make(chan api.Exit, 1)
	go func() { done <- a.wait(id) }()
	for {
		select {
		case e := <-done:
			if e.ExitCode == nil || *e.ExitCode != 0 {
				t.Fatalf("exit %v", e)
			}
			if code := a.call("POST", "/exec-stream/"+id+"/release", nil, nil); code != http.StatusNoContent {
				t.Fatalf("release of a finished process: %d", code)
			}
			return
		case <-ctxT(t).Done():
			t.Fatal("the released process never finished")
		case <-time.After(10 * time.Millisecond):
			a.call("POST", "/exec-stream/"+id+"/release", nil, nil)
		}
	}
}
