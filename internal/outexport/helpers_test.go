package outexport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// ctxT is t's context, bounded.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// connect is a client of urls as kilnd connects: it waits for a server
// that is not up yet, and reconnects for ever. Closed when t ends.
func connect(t testing.TB, urls ...string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// startExporter starts an exporter, closed when t ends (before its
// connection).
func startExporter(t testing.TB, cfg Config) *Exporter {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	x, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("exporter %s: %+v", x.writer, x.Stats())
		}
		x.Close()
	})
	return x
}

// testWriter logs to t.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// logWatch is a slog handler that closes a channel when a record whose
// message contains a phrase is logged.
type logWatch struct {
	phrase string
	once   *sync.Once
	seen   chan struct{}
	next   slog.Handler
}

func newLogWatch(t testing.TB, phrase string) *logWatch {
	return &logWatch{phrase: phrase, once: new(sync.Once), seen: make(chan struct{}),
		next: slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})}
}

func (l *logWatch) Enabled(ctx context.Context, lv slog.Level) bool { return true }
func (l *logWatch) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, l.phrase) {
		l.once.Do(func() { close(l.seen) })
	}
	if l.next.Enabled(ctx, r.Level) {
		return l.next.Handle(ctx, r)
	}
	return nil
}
func (l *logWatch) WithAttrs(as []slog.Attr) slog.Handler {
	c := *l
	c.next = l.next.WithAttrs(as)
	return &c
}
func (l *logWatch) WithGroup(g string) slog.Handler {
	c := *l
	c.next = l.next.WithGroup(g)
	return &c
}

func slogOf(h slog.Handler) *slog.Logger { return slog.New(h) }

// replayed is what reading a process's output back gave.
type replayed struct {
	hello     api.Hello
	from      Offsets
	pos       map[string]int64 // where each stream got to
	delivered map[string]int64
	lost      map[string]int64
	gaps      []api.Gap
	ends      map[string]int64
	exit      *api.Exit
	frames    int
}

// readConn reads a kiln.v1 stream to its end, checking every frame
// against want at its offset and that frames and gaps follow each other
// without overlap or hole. It stops early, once every stream has reached
// until (if set), without waiting for more.
func readConn(ctx context.Context, t testing.TB, c Conn, from Offsets, want map[string][]byte, until map[string]int64) replayed {
	t.Helper()
	got := replayed{from: from, pos: map[string]int64{}, delivered: map[string]int64{}, lost: map[string]int64{}, ends: map[string]int64{}}
	for s, off := range from {
		got.pos[s] = off
	}
	reached := func() bool {
		if until == nil {
			return false
		}
		for s, n := range until {
			if got.pos[s] < n {
				return false
			}
		}
		return true
	}
	mismatches := 0
	for first := true; ; first = false {
		typ, data, err := c.Read(ctx)
		if errors.Is(err, io.EOF) || websocket.CloseStatus(err) == websocket.StatusNormalClosure {
			return got
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if typ == websocket.MessageBinary {
			f, err := api.ParseFrame(data)
			if err != nil {
				t.Fatal(err)
			}
			s := api.StreamNames[f.Stream]
			if int64(f.Offset) != got.pos[s] {
				t.Fatalf("frame of %s at %d, want %d", s, f.Offset, got.pos[s])
			}
			w := want[s]
			end := int64(f.Offset) + int64(len(f.Data))
			if end > int64(len(w)) || !bytes.Equal(f.Data, w[f.Offset:end]) {
				if mismatches++; mismatches < 5 {
					t.Errorf("frame of %s at %d (%d bytes): not what the process wrote", s, f.Offset, len(f.Data))
				}
			}
			got.pos[s], got.delivered[s] = end, got.delivered[s]+int64(len(f.Data))
			got.frames++
		} else {
			var m struct {
				Type string `json:"type"`
				api.Gap
				TotalBytes int64 `json:"total_bytes"`
				api.Exit
			}
			if err := json.Unmarshal(data, &m); err != nil {
				t.Fatal(err)
			}
			switch m.Type {
			case api.TypeHello:
				if !first {
					t.Fatal("a hello after the first message")
				}
				json.Unmarshal(data, &got.hello)
			case api.TypeGap:
				if m.From != got.pos[m.Stream] || m.To <= m.From || m.LostBytes != m.To-m.From {
					t.Fatalf("gap %+v where %s stands at %d", m.Gap, m.Stream, got.pos[m.Stream])
				}
				got.gaps = append(got.gaps, m.Gap)
				got.pos[m.Stream], got.lost[m.Stream] = m.To, got.lost[m.Stream]+m.LostBytes
			case api.TypeEnd:
				if m.TotalBytes != got.pos[m.Stream] {
					t.Fatalf("end of %s at %d where it stands at %d", m.Stream, m.TotalBytes, got.pos[m.Stream])
				}
				got.ends[m.Stream] = m.TotalBytes
			case api.TypeExit:
				e := m.Exit
				got.exit = &e
			default:
				t.Fatalf("message %s", data)
			}
			if first && m.Type != api.TypeHello {
				t.Fatalf("first message %s, not a hello", data)
			}
		}
		if reached() {
			return got
		}
	}
}

// readBack reads a process's exported output, from from, to its end.
// Following, it waits for the process's subject to be there.
func readBack(ctx context.Context, t testing.TB, js jetstream.JetStream, node, sandbox, process string, o ReadOptions, want map[string][]byte) replayed {
	t.Helper()
	r := openReader(ctx, t, js, node, sandbox, process, o)
	defer r.CloseNow()
	return readConn(ctx, t, r, o.From, want, nil)
}

// openReader opens a Reader; following, it waits for the subject to be
// there.
func openReader(ctx context.Context, t testing.TB, js jetstream.JetStream, node, sandbox, process string, o ReadOptions) *Reader {
	t.Helper()
	for {
		r, err := NewReader(ctx, js, node, sandbox, process, o)
		if err == nil {
			return r
		}
		if !o.Follow || !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatal(err)
		}
		// Nothing stored yet (the subject is made by the exporter's first
		// publish, which has no event to wait on from outside it), or
		// the stream's replicas choosing a leader.
		select {
		case <-ctx.Done():
			t.Fatalf("nothing exported: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitExported waits until the exporter has stored the process's output
// up to offsets until (each stream), reading it from JetStream as it
// comes.
func waitExported(ctx context.Context, t testing.TB, js jetstream.JetStream, node, sandbox, process string, want map[string][]byte, until map[string]int64) {
	t.Helper()
	r := openReader(ctx, t, js, node, sandbox, process, ReadOptions{Follow: true})
	defer r.CloseNow()
	readConn(ctx, t, r, nil, want, until)
}

// checkWhole says whether got has each stream of want whole or with
// exact gaps: every byte delivered at its offset (checked while reading)
// or counted lost, to the stream's total, and the exit.
func checkWhole(t testing.TB, got replayed, want map[string][]byte, exitCode int) {
	t.Helper()
	for s, w := range want {
		if got.pos[s] != int64(len(w)) || got.ends[s] != int64(len(w)) {
			t.Errorf("%s: read to %d, ended at %d; the process wrote %d", s, got.pos[s], got.ends[s], len(w))
		}
		if n := int64(len(w)) - min(got.from[s], int64(len(w))); got.delivered[s]+got.lost[s] != n {
			t.Errorf("%s: %d bytes delivered and %d lost, of %d from %d", s, got.delivered[s], got.lost[s], len(w), got.from[s])
		}
	}
	if got.exit == nil || got.exit.ExitCode == nil || *got.exit.ExitCode != exitCode {
		t.Errorf("exit %+v, want code %d", got.exit, exitCode)
	}
}

// subjectMessages are every message the subject holds, in order.
func subjectMessages(ctx context.Context, t testing.TB, js jetstream.JetStream, node, sandbox, process string) []*message {
	t.Helper()
	s, err := js.Stream(ctx, StreamName(node))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(Subject(node, sandbox, process)))
	if err != nil {
		t.Fatal(err)
	}
	n := info.State.Subjects[Subject(node, sandbox, process)]
	if n == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{Subject(node, sandbox, process)}})
	if err != nil {
		t.Fatal(err)
	}
	it, err := c.Messages(jetstream.PullMaxBytes(readBuffer))
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	var ms []*message
	for range n {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		meta, _ := msg.Metadata()
		m, err := decode(msg.Headers(), msg.Data(), meta.Sequence.Stream)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	return ms
}

// checkChain checks that each of the subject's messages begins where the
// one before it ends: nothing stored twice, no bytes skipped without a
// gap record. It returns the gap records.
func checkChain(t testing.TB, ms []*message) []record {
	t.Helper()
	var gaps []record
	for i, m := range ms {
		if i > 0 && m.at != ms[i-1].after() {
			t.Errorf("message %d (seq %d, %s, writer %s) begins at %v; the one before ends at %v",
				i, m.streamSeq, m.kind, m.writer, m.at.offsets(), ms[i-1].after().offsets())
		}
		if m.kind == kindRecord && m.rec.Event == eventGap {
			gaps = append(gaps, m.rec)
		}
	}
	if len(ms) > 0 {
		if last := ms[len(ms)-1]; last.kind != kindRecord || last.rec.Event != eventEnd {
			t.Errorf("the last message is %s, not the end record", last.kind)
		}
	}
	return gaps
}

func checkRecordedLoss(t *testing.T, got replayed, gaps []record) {
	t.Helper()
	var recorded int64
	for _, g := range gaps {
		if g.Cause != CauseRingEvicted && g.Cause != CauseExportDown {
			t.Errorf("gap record %+v", g)
		}
		recorded += g.Lost
	}
	if lost := got.lost["stdout"] + got.lost["stderr"]; lost != recorded {
		t.Errorf("the reader lost %d bytes; the gap records say %d", lost, recorded)
	}
}

// checkLogs checks what Logs says of process against got, the process's
// output read back from its start once its export is over: the state of
// its one run, the export's; the bytes held, those got was given; the
// bytes got was told lost, as the run's drops, or (retention-loss) as
// those before the first message kept.
func checkLogs(ctx context.Context, t testing.TB, js jetstream.JetStream, node, sandbox, process, state string, got replayed) {
	t.Helper()
	logs, err := Logs(ctx, js, node, sandbox)
	if err != nil {
		t.Fatal(err)
	}
	var l *api.CapturedLog
	for i := range logs {
		if logs[i].Process == process {
			l = &logs[i]
		}
	}
	if l == nil || len(l.Runs) != 1 {
		t.Fatalf("Logs: %+v, want %s with one run", logs, process)
	}
	r := openReader(ctx, t, js, node, sandbox, process, ReadOptions{})
	run, _ := r.Run()
	r.CloseNow()
	out, errs := got.lost["stdout"]+got.lost["terminal"], got.lost["stderr"]
	var wantBefore int64
	var wantDropped map[string]int64
	switch {
	case state == "retention-loss":
		wantBefore = out + errs
	case out+errs > 0:
		wantDropped = map[string]int64{"stdout": out, "stderr": errs}
	}
	held := got.delivered["stdout"] + got.delivered["terminal"] + got.delivered["stderr"]
	if r := l.Runs[0]; r.ID != run || r.State != state || l.Complete != (state == api.RunLossless) || !maps.Equal(r.Dropped, wantDropped) ||
		l.Stats.Before != wantBefore || l.Stats.Bytes != held {
		t.Errorf("Logs says %+v; want run %s %s, dropped %v, %d bytes before, %d held", *l, run, state, wantDropped, wantBefore, held)
	}
}
