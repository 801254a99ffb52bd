package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/roles"
)

func TestMain(m *testing.M) {
	roles.PlayIfReexecuted()
	daemontest.NoRaceExitSleep()
	if addr := os.Getenv(echoEnv); addr != "" {
		serveEcho(addr) // in a sandbox, for TestPorts
		os.Exit(0)
	}
	// Most tests run side by side, each with a kilnd of its own: their
	// sandboxes' host users are kept apart.
	removeUIDs, err := daemontest.ShareUIDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := stopExampleKilnd(); err != nil {
		fmt.Fprintln(os.Stderr, "the examples' kilnd:", err)
		code = 1
	}
	if err := removeUIDs(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// kilnd starts a kilnd on a fresh state directory and returns a client of
// it and a sandbox.
func kilnd(t *testing.T) (*client.Client, *client.Sandbox) {
	t.Helper()
	return clientOf(t, startKilnd(t).State)
}

// startKilnd starts a kilnd on a fresh state directory, closed with the
// test.
func startKilnd(t *testing.T) *daemontest.Kilnd {
	t.Helper()
	return startKilndOn(t, "")
}

// startKilndOn is startKilnd with a TCP listener on listen too.
func startKilndOn(t *testing.T, listen string) *daemontest.Kilnd {
	t.Helper()
	return daemontest.StartT(t, listen)
}

// clientOf returns a client of the kilnd at state, and a sandbox.
func clientOf(t *testing.T, state string) (*client.Client, *client.Sandbox) {
	t.Helper()
	c, err := client.New(client.Options{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sb, err := c.CreateSandbox(ctxT(t), client.SandboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c, sb
}

// account holds the chunks a handle gives out to kiln.v1's per-stream
// accounting, each stream from its offset in from (a reopened handle's
// reference; nil is the beginning): in Format Bytes every chunk starts
// where its stream stood and every gap says exactly what it skipped;
// decoded text, which has no byte offsets of its own, keeps its order.
type account struct {
	from    map[string]int64
	noGaps  bool // nothing may be lost (a holding handle's output)
	streams map[string]*apitest.Stream
	decoded map[string]bool // streams given out as text
}

func (a *account) stream(name string) *apitest.Stream {
	if a.streams == nil {
		a.streams, a.decoded = map[string]*apitest.Stream{}, map[string]bool{}
	}
	s := a.streams[name]
	if s == nil {
		s = apitest.NewStream(name, a.from[name])
		s.Keep, s.NoGaps = true, a.noGaps
		a.streams[name] = s
	}
	return s
}

// take accounts for one chunk.
func (a *account) take(ch client.Chunk) error {
	s := a.stream(ch.Stream)
	switch {
	case ch.Lost > 0:
		// A gap chunk's offset is where the stream stands after it.
		return s.Gap(ch.Offset-ch.Lost, ch.Offset)
	case ch.Bytes != nil:
		return s.Frame(ch.Offset, ch.Bytes)
	}
	a.decoded[ch.Stream] = true
	return s.Text(ch.Offset, ch.Text)
}

// collect reads a process's output to its end, from the offsets from (a
// reopened handle's reference; nil for the beginning), held to the
// per-stream accounting, and holds the handle's own counts to it. It
// returns each stream's output and the bytes lost in all.
func collect(t *testing.T, p *client.Process, from map[string]int64) (map[string]string, int64) {
	t.Helper()
	a := &account{from: from}
	for ch, err := range p.Output(ctxT(t)) {
		if err != nil {
			t.Fatal(err)
		}
		if err := a.take(ch); err != nil {
			t.Fatalf("output of %s: %v", p.ID, err)
		}
	}
	r, err := p.Wait(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var lost int64
	for name, s := range a.streams {
		c := r.Streams[name]
		if !c.Ended || c.Lost < s.Lost || !a.decoded[name] && c.Bytes != s.Next {
			t.Errorf("%s: the handle counts %+v, its output gave out %d bytes and %d lost, to %d", name, c, s.Delivered, s.Lost, s.Next)
		}
		out[name] = string(s.Data)
		lost += s.Lost
	}
	return out, lost
}

func TestStartOutputWait(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	// é split across two writes, on stdout; a lone invalid byte on stderr.
	p, err := sb.Start(ctx, client.StartOptions{Command: "sh", Args: []string{"-c", `printf 'caf\303'; sleep 0.1; printf '\251\n'; printf 'bad\377\n' >&2; exit 3`}})
	if err != nil {
		t.Fatal(err)
	}
	out, lost := collect(t, p, nil)
	if out["stdout"] != "café\n" || out["stderr"] != "bad\uFFFD\n" || lost != 0 {
		t.Errorf("output %q, lost %d", out, lost)
	}
	r, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Exit.Code() != 3 || !r.OutputComplete {
		t.Errorf("result %+v", r)
	}
	// Bytes keep what text replaced.
	q, err := sb.Start(ctx, client.StartOptions{Command: "printf", Args: []string{`a\377\000b`}, Format: client.Bytes})
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := collect(t, q, nil); out["stdout"] != "a\xff\x00b" {
		t.Errorf("bytes %q", out["stdout"])
	}
}

func TestInputInOrderThenEOF(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	p, err := sb.Start(ctx, client.StartOptions{Command: "cat", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"one ", "two ", "three\n"} {
		if err := p.Write(ctx, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Write(ctx, make([]byte, api.MaxStdin+1)); !errors.Is(err, client.ErrWriteTooLarge) {
		t.Errorf("oversized write: %v", err)
	}
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseStdin(ctx); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := p.Write(ctx, []byte("late")); !errors.Is(err, client.ErrStdinClosed) {
		t.Errorf("write after close: %v", err)
	}
	if out, _ := collect(t, p, nil); out["stdout"] != "one two three\n" {
		t.Errorf("echoed %q", out["stdout"])
	}
}

// TestDisconnectThenReopen: a handle disconnected mid-output and reopened
// from its reference resumes where it stood: nothing repeated, nothing
// lost, and the output is complete.
func TestDisconnectThenReopen(t *testing.T) {
	t.Parallel()
	c, sb := kilnd(t)
	ctx := ctxT(t)
	p, err := sb.Start(ctx, client.StartOptions{Command: "sh", Args: []string{"-c", "for i in $(seq 1 30); do echo line-$i; sleep 0.01; done"}})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for ch, err := range p.Output(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		got += ch.Text
		if strings.Count(got, "\n") >= 5 {
			break
		}
	}
	ref, err := p.Disconnect()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Status(ctx); !errors.Is(err, client.ErrDetached) {
		t.Errorf("status after disconnect: %v", err)
	}
	raw, _ := json.Marshal(ref)
	var back client.Reference
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	again, err := c.Sandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	q, err := again.Reopen(ctx, back)
	if err != nil {
		t.Fatal(err)
	}
	out, lost := collect(t, q, back.Offsets)
	got += out["stdout"]
	var want strings.Builder
	for i := 1; i <= 30; i++ {
		want.WriteString("line-" + strconv.Itoa(i) + "\n")
	}
	if got != want.String() || lost != 0 {
		t.Errorf("got %q (lost %d)", got, lost)
	}
	if r, err := q.Wait(ctx); err != nil || !r.OutputComplete || r.Exit.Code() != 0 {
		t.Errorf("wait %+v, %v", r, err)
	}
}

func TestTerminateStatusAndErrors(t *testing.T) {
	t.Parallel()
	c, sb := kilnd(t)
	ctx := ctxT(t)
	p, err := sb.Start(ctx, client.StartOptions{Command: "sleep", Args: []string{"1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Status(ctx); err != nil || st.State != client.Running {
		t.Errorf("status %+v, %v", st, err)
	}
	// The answer is the process as it was when the kill was sent, never
	// the exit the kill itself caused.
	if got, err := p.Terminate(ctx); err != nil || got != client.TerminateRequested {
		t.Errorf("terminate %q, %v", got, err)
	}
	r, err := p.Wait(ctx)
	if err != nil || r.Exit.Signal() != "KILL" {
		t.Errorf("wait %+v, %v", r, err)
	}
	if st, _ := p.Status(ctx); st.State != client.Exited {
		t.Errorf("status after exit %+v", st)
	}
	if got, err := p.Terminate(ctx); err != nil || got != client.TerminateExited {
		t.Errorf("terminate after the exit %q, %v", got, err)
	}
	if _, err := c.Sandbox(ctx, "01a22779-5cfd-7451-9354-2e19949d5c7f"); !client.IsNotFound(err) {
		t.Errorf("unknown sandbox: %v", err)
	}
	if _, err := sb.Process(ctx, "01a22779-5cfd-7451-9354-2e19949d5c7f", client.ProcessOptions{}); !client.IsNotFound(err) {
		t.Errorf("unknown process: %v", err)
	}
	if _, err := sb.Start(ctx, client.StartOptions{Command: "/no/such/program"}); !client.IsInvalid(err) {
		t.Errorf("bad program: %v", err)
	}
}

func TestExec(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	r, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo out; echo err >&2; exit 2"})
	if err != nil || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" || r.Exit.Code() != 2 {
		t.Errorf("exec %+v, %v", r, err)
	}
	var seen []string
	r, err = sb.Exec(ctx, client.ExecOptions{Command: "sh", Args: []string{"-c", "echo a; sleep 0.05; echo b"}, MaxOutputBytes: 3,
		OnOutput: func(ch client.Chunk) error { seen = append(seen, ch.Text); return nil }})
	if err != nil || string(r.Stdout) != "a\nb" || !r.Truncated || strings.Join(seen, "") != "a\nb\n" {
		t.Errorf("exec with callback %+v (seen %q), %v", r, seen, err)
	}
}

// TestLostAnswerIsUnknown: a write whose answer never comes is reported as
// an unknown outcome, and input stays stopped until resynced; a lost
// terminate answer is kept and returned again without a second request.
func TestLostAnswerIsUnknown(t *testing.T) {
	var mu sync.Mutex
	requests := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests[r.Method+" "+r.URL.Path]++
		mu.Unlock()
		switch {
		case r.URL.Path == "/sandboxes/sb/exec-stream" && r.Method == "POST":
			w.Write([]byte(`{"id":"p"}`))
		case r.URL.Path == "/sandboxes/sb/exec-stream/p" && r.Method == "GET":
			w.Write([]byte(`{"id":"p","state":"running","stdin":{"accepted":2}}`))
		case r.URL.Path == "/sandboxes/sb/exec-stream/p/wait":
			// The connection breaks while waiting.
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
		default:
			// The request arrived; the answer is lost.
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}
	}))
	defer srv.Close()
	c, err := client.New(client.Options{Addr: strings.TrimPrefix(srv.URL, "http://"), Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)
	s := c.Handle("sb")
	p, err := s.Start(ctx, client.StartOptions{Command: "cat", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(ctx, []byte("hi")); !client.IsOutcomeUnknown(err) {
		t.Fatalf("write with a lost answer: %v", err)
	}
	if err := p.Write(ctx, []byte("more")); !errors.Is(err, client.ErrInputUncertain) {
		t.Errorf("write after an unknown outcome: %v", err)
	}
	if _, err := p.Disconnect(); !errors.Is(err, client.ErrInputUncertain) {
		t.Errorf("disconnect with input uncertain: %v", err)
	}
	if r, err := p.Wait(ctx); err == nil {
		t.Errorf("a wait whose connection broke reported %+v", r)
	}
	if acc, err := p.ResyncInput(ctx); err != nil || acc != 2 {
		t.Errorf("resync: %d, %v", acc, err)
	}
	if _, err := p.Terminate(ctx); !client.IsOutcomeUnknown(err) {
		t.Errorf("terminate with a lost answer: %v", err)
	}
	if _, err := p.Terminate(ctx); !client.IsOutcomeUnknown(err) {
		t.Errorf("second terminate: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := requests["DELETE /sandboxes/sb/exec-stream/p"]; n != 1 {
		t.Errorf("terminate sent %d times, want once", n)
	}
}

// TestBytesExact: 256 KiB of every byte value on stdout and invalid UTF-8
// with NUL on stderr arrive byte for byte.
func TestBytesExact(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	script := `python3 -c "
import sys
sys.stdout.buffer.write(bytes(range(256)) * 1024)
sys.stderr.buffer.write(b'\x00\xff\xfe\xc3(\x00end')
"`
	p, err := sb.Start(ctx, client.StartOptions{Command: "sh", Args: []string{"-c", script}, Format: client.Bytes})
	if err != nil {
		t.Fatal(err)
	}
	out, lost := collect(t, p, nil)
	var want strings.Builder
	for range 1024 {
		for i := range 256 {
			want.WriteByte(byte(i))
		}
	}
	if out["stdout"] != want.String() || out["stderr"] != "\x00\xff\xfe\xc3(\x00end" || lost != 0 {
		t.Errorf("stdout %d bytes (equal %v), stderr %q, lost %d", len(out["stdout"]), out["stdout"] == want.String(), out["stderr"], lost)
	}
}

// TestReopenAfterEviction: a handle reopened after its position was
// evicted reports a gap of exactly the evicted bytes, then the rest.
func TestReopenAfterEviction(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	const total = 3 << 20 // three times the ring
	p, err := sb.Start(ctx, client.StartOptions{Command: "head", Args: []string{"-c", strconv.Itoa(total), "/dev/zero"}, Format: client.Bytes,
		Flow: api.FlowDrop, Overflow: client.OverflowReport})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := p.Disconnect()
	if err != nil {
		t.Fatal(err)
	}
	q, err := sb.Reopen(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	out, lost := collect(t, q, ref.Offsets)
	if int64(len(out["stdout"]))+lost != total || lost == 0 {
		t.Errorf("delivered %d + lost %d != %d", len(out["stdout"]), lost, total)
	}
	if r, err := q.Wait(ctx); err != nil || r.OutputComplete {
		t.Errorf("after a gap: %+v, %v (want OutputComplete false)", r, err)
	}
}

// TestResumeInsideACharacter: a handle disconnected while a character is
// half received resumes before it, so the character arrives whole, once.
func TestResumeInsideACharacter(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	p, err := sb.Start(ctx, client.StartOptions{Command: "sh", Args: []string{"-c", `printf 'caf\303'; sleep 0.3; printf '\251\n'`}})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for ch, err := range p.Output(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		got += ch.Text
		if got == "caf" {
			break
		}
	}
	ref, err := p.Disconnect()
	if err != nil {
		t.Fatal(err)
	}
	if ref.Offsets["stdout"] != 3 {
		t.Errorf("reference at %d, want 3: the half character is not delivered", ref.Offsets["stdout"])
	}
	q, err := sb.Reopen(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	out, lost := collect(t, q, ref.Offsets)
	if got+out["stdout"] != "café\n" || lost != 0 {
		t.Errorf("got %q + %q (lost %d)", got, out["stdout"], lost)
	}
}

// TestFlowBlockResumesWithoutLoss: a handle holding a flow block process's
// output goes away mid-stream; the process waits for it, and the handle
// reopened from its reference, within the grace period, gets the rest:
// every byte of 32 MiB, with no gap, and the process's own exit.
func TestFlowBlockResumesWithoutLoss(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	const size = 32 << 20
	p, err := sb.Start(ctx, client.StartOptions{Command: "sh", Args: []string{"-c", "head -c 33554432 /dev/urandom | tee /workspace/r; exit 6"},
		Flow: api.FlowBlock, Format: client.Bytes})
	if err != nil {
		t.Fatal(err)
	}
	// One account across both handles: the reopened one goes on exactly
	// where the first stopped, and neither loses a byte.
	a := &account{noGaps: true}
	var ref client.Reference
	for ch, err := range p.Output(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if err := a.take(ch); err != nil {
			t.Fatal(err)
		}
		if a.stream("stdout").Delivered >= 4<<20 {
			// The handle goes away mid-stream, its reader with it,
			// leaving the output held for Reopen.
			if ref, err = p.Disconnect(); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	st, err := sb.Process(ctx, p.ID, client.ProcessOptions{Format: client.Bytes})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := st.Status(ctx); err != nil || s.Process == nil || s.Process.Flow != api.FlowBlock || s.State != client.Running {
		t.Fatalf("status %+v, %v: want a running flow block process", s.Process, err)
	}
	q, err := sb.Reopen(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Offsets["stdout"] != a.stream("stdout").Next {
		t.Fatalf("reference at %v, the output given out to %d", ref.Offsets, a.stream("stdout").Next)
	}
	for ch, err := range q.Output(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if err := a.take(ch); err != nil {
			t.Fatalf("after reopening: %v", err)
		}
	}
	got := a.stream("stdout").Data
	if errs := a.stream("stderr"); errs.Frames+errs.Gaps != 0 {
		t.Errorf("stderr gave out %+v, want nothing", errs)
	}
	r, err := q.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Exit.Code() != 6 || !r.OutputComplete || r.Streams["stdout"] != (client.StreamCount{Bytes: size, Ended: true}) {
		t.Fatalf("result %+v", r)
	}
	res, err := sb.Exec(ctx, client.ExecOptions{Shell: "sha256sum < /workspace/r"})
	if err != nil {
		t.Fatal(err)
	}
	if want, _, _ := strings.Cut(string(res.Stdout), " "); fmt.Sprintf("%x", sha256.Sum256(got)) != want || len(got) != size {
		t.Fatalf("got %d bytes of %d, not the bytes written", len(got), size)
	}
}

// TestExecResumesABrokenConnection: Exec and Follow, their connection to
// kilnd cut again and again, resume each time from the last byte given
// out: the output comes whole, nothing repeated, with the command's exit.
func TestExecResumesABrokenConnection(t *testing.T) {
	t.Parallel()
	k := startKilnd(t)
	p, err := k.Proxy(t.TempDir(), 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	_, sb := clientOf(t, p.State)
	ctx := ctxT(t)
	var want strings.Builder
	for i := 1; i <= 400000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	var got strings.Builder
	res, err := sb.Exec(ctx, client.ExecOptions{Shell: "seq 1 400000; exit 3",
		OnOutput: func(ch client.Chunk) error { got.WriteString(ch.Text); return nil }})
	if err != nil || res.Exit.Code() != 3 || got.String() != want.String() || p.Cuts() < 2 {
		t.Fatalf("Exec through %d cuts: %v, exit %v, %d bytes of %d, equal %v", p.Cuts(), err, res.Exit, got.Len(), want.Len(), got.String() == want.String())
	}

	proc, err := sb.Start(ctx, client.StartOptions{Command: "seq", Args: []string{"1", "400000"}, Format: client.Bytes, Flow: api.FlowBlock})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Detach()
	var out []byte
	resumed := 0
	for ch, err := range proc.Follow(ctx, client.Resume{OnResume: func(error, time.Duration) { resumed++ }}) {
		if err != nil {
			t.Fatal(err)
		}
		if ch.Lost > 0 {
			t.Fatalf("%d bytes lost", ch.Lost)
		}
		out = append(out, ch.Bytes...)
	}
	if string(out) != want.String() || resumed < 2 {
		t.Fatalf("Follow, resumed %d times: %d bytes of %d, equal %v", resumed, len(out), want.Len(), string(out) == want.String())
	}
}

// TestCapturedLogTail: LogOptions' zero value is the whole log (it used to
// send tail=0 and return nothing); Tail keeps the last lines, NoLines none.
func TestCapturedLogTail(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	p, err := sb.Start(ctx, client.StartOptions{Command: "seq", Args: []string{"5"}, Capture: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	read := func(o client.LogOptions) string {
		t.Helper()
		out, err := sb.CapturedLog(ctx, p.ID, o)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		b, err := io.ReadAll(out)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// The log's writer ends its run just after the exit: wait for the run's
	// record to say it is whole.
	for complete := false; !complete; {
		logs, err := sb.CapturedLogs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range logs {
			complete = complete || l.Process == p.ID && l.Complete
		}
		if !complete {
			select {
			case <-ctx.Done():
				t.Fatal("the captured log never said it was complete")
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	if got := read(client.LogOptions{}); got != "1\n2\n3\n4\n5\n" {
		t.Errorf("the zero LogOptions: %q", got)
	}
	if got := read(client.LogOptions{Tail: 2}); got != "4\n5\n" {
		t.Errorf("Tail 2: %q", got)
	}
	if got := read(client.LogOptions{Tail: client.NoLines}); got != "" {
		t.Errorf("NoLines: %q", got)
	}
}

// TestHealthAndVersion: Health is nil while kilnd answers and an error
// once it does not; ServerVersion names the Go that built it.
func TestHealthAndVersion(t *testing.T) {
	t.Parallel()
	c, _ := kilnd(t)
	ctx := ctxT(t)
	if err := c.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	v, err := c.ServerVersion(ctx)
	if err != nil || !strings.HasPrefix(v.GoVersion, "go1.") {
		t.Errorf("ServerVersion: %+v, %v", v, err)
	}
	gone, err := client.New(client.Options{Addr: "127.0.0.1:1", Token: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Health(ctx); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("Health of nothing listening: %v, want ErrUnavailable", err)
	}
}
