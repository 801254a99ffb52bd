package outexport

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/natstest"
	"github.com/sandkiln/sandkiln/internal/roles"
)

func TestMain(m *testing.M) {
	roles.PlayIfReexecuted()
	goleak.VerifyTestMain(m)
}

const (
	node    = "n1"
	sandbox = "sbx1"
)

// writeRandom has p write n chunks of up to max bytes, each to one of
// its streams, random bytes, seeded.
func writeRandom(p *fakeProc, seed uint64, n, maxLen int) {
	r := rand.New(rand.NewPCG(seed, 1))
	for range n {
		b := make([]byte, 1+r.IntN(maxLen))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		p.write(p.streams[r.IntN(len(p.streams))], b)
	}
}

func proc(id string) api.Process {
	return api.Process{ID: id, Command: "sh", Args: []string{"-c", "work"}, StartedAt: time.Now()}
}

// A process's output, written while the exporter follows it, reads back
// from JetStream whole, from the start and from any offsets, then its
// end and exit; the subject is one chain of messages.
func TestExportAndReplay(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout, api.StreamStderr)
	src.add("p1", p)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
	if err := x.Follow(sandbox, proc("p1")); err != nil {
		t.Fatal(err)
	}
	writeRandom(p, 1, 3000, 3000)
	p.finish(3)
	want := p.want()
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
	checkWhole(t, got, want, 3)
	if len(got.gaps) != 0 {
		t.Errorf("gaps %+v", got.gaps)
	}
	totals := map[string]int64{"stdout": int64(len(want["stdout"])), "stderr": int64(len(want["stderr"]))}
	for s, span := range got.hello.Streams {
		if span.First != 0 || span.Total > totals[s] {
			t.Errorf("hello: %s %+v of %d", s, span, totals[s])
		}
	}
	gaps := checkChain(t, subjectMessages(ctx, t, js, node, sandbox, "p1"))
	if len(gaps) != 0 {
		t.Errorf("gap records %+v", gaps)
	}
	checkLogs(ctx, t, js, node, sandbox, "p1", "lossless", got)
	for _, from := range []Offsets{
		{},
		{"stdout": 1},
		{"stderr": totals["stderr"] / 3},
		{"stdout": totals["stdout"] / 2, "stderr": totals["stderr"] / 5},
		{"stdout": totals["stdout"] - 1, "stderr": totals["stderr"]},
		{"stdout": totals["stdout"], "stderr": totals["stderr"]},
	} {
		got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{From: from}, want)
		checkWhole(t, got, want, 3)
		for s, n := range totals {
			if got.delivered[s] != n-from[s] || got.lost[s] != 0 {
				t.Errorf("from %v: %s: %d delivered, %d lost, want %d", from, s, got.delivered[s], got.lost[s], n-from[s])
			}
		}
		if got.hello.Streams["stdout"].Total != totals["stdout"] {
			t.Errorf("from %v: hello %+v", from, got.hello)
		}
	}
	// Each message read says when JetStream stored what it came of (the
	// hello, nothing), and the reader names the export's run, begun.
	r := openReader(ctx, t, js, node, sandbox, "p1", ReadOptions{})
	before := time.Now()
	for i := 0; ; i++ {
		typ, _, err := r.Read(ctx)
		if err != nil {
			break
		}
		switch stored := r.Stored(); {
		case i == 0 && !stored.IsZero():
			t.Errorf("the hello stored at %v", stored)
		case i > 0 && typ == websocket.MessageBinary && (stored.IsZero() || stored.After(before)):
			t.Errorf("message %d stored at %v, read at %v", i, stored, before)
		}
	}
	if run, begun := r.Run(); len(run) != 36 || !begun {
		t.Errorf("run %q, begun %v", run, begun)
	}
	r.CloseNow()
	st := x.Stats()
	if st.Ended != 1 || st.Lost != 0 || st.Bytes != totals["stdout"]+totals["stderr"] || st.Fenced != 0 {
		t.Errorf("stats %+v", st)
	}
	// Following it again finds its export ended.
	if err := x.Follow(sandbox, proc("p1")); err != nil {
		t.Fatal(err)
	}
}

// The offset → sequence search starts each reader at the first message
// that takes a stream past its offsets, as a scan of the subject finds it.
func TestSearchMatchesScan(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout, api.StreamStderr)
	src.add("p1", p)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
	x.Follow(sandbox, proc("p1"))
	writeRandom(p, 2, 500, 100)
	p.finish(0)
	want := p.want()
	readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
	ms := subjectMessages(ctx, t, js, node, sandbox, "p1")
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		from := Offsets{"stdout": r.Int64N(int64(len(want["stdout"])) + 2), "stderr": r.Int64N(int64(len(want["stderr"])) + 2)}
		rd, err := NewReader(ctx, js, node, sandbox, "p1", ReadOptions{From: from})
		if err != nil {
			t.Fatal(err)
		}
		truth := ms[len(ms)-1].streamSeq + 1
		for _, m := range ms {
			if rd.reaches(m) {
				truth = m.streamSeq
				break
			}
		}
		if rd.readTo+1 != truth {
			t.Errorf("from %v: starts at %d, the scan at %d", from, rd.readTo+1, truth)
		}
		got := readConn(ctx, t, rd, from, want, nil)
		rd.CloseNow()
		for s, n := range from {
			if w := int64(len(want[s])); got.delivered[s] != max(w-n, 0) {
				t.Errorf("from %v: %s: %d bytes, want %d", from, s, got.delivered[s], max(w-n, 0))
			}
		}
	}
}

// A stream too small for the output keeps its newest messages; a reader
// is told exactly what it no longer holds, to the byte, and still gets
// the end and exit.
func TestTinyMaxBytesExactGaps(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout, api.StreamStderr)
	src.add("p1", p)
	const maxBytes = 64 << 10
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src, MaxBytes: maxBytes})
	x.Follow(sandbox, proc("p1"))
	writeRandom(p, 5, 1000, 2000) // about 1 MiB
	p.finish(0)
	want := p.want()
	// A reader that follows from the start sees the stream discard what
	// it has not read yet, exactly.
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
	checkWhole(t, got, want, 0)
	// Once it is over, what is left is a tail: a gap from 0 to where the
	// first message kept begins, then everything.
	ms := subjectMessages(ctx, t, js, node, sandbox, "p1")
	checkChain(t, ms)
	info, err := js.Stream(ctx, StreamName(node))
	if err != nil {
		t.Fatal(err)
	}
	if st := info.CachedInfo().State; st.Bytes > maxBytes {
		t.Errorf("the stream holds %d bytes, more than %d", st.Bytes, maxBytes)
	}
	got = readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{}, want)
	checkWhole(t, got, want, 0)
	first := ms[0].at
	var lost int64
	for _, s := range []byte{api.StreamStdout, api.StreamStderr} {
		name := api.StreamNames[s]
		if got.lost[name] != first.off[s] {
			t.Errorf("%s: %d bytes lost, want %d (where the first message kept begins)", name, got.lost[name], first.off[s])
		}
		if got.hello.Streams[name].First != first.off[s] {
			t.Errorf("hello %+v, want %s first at %d", got.hello, name, first.off[s])
		}
		lost += got.lost[name]
	}
	if lost == 0 {
		t.Error("nothing discarded: the test proves nothing")
	}
	checkLogs(ctx, t, js, node, sandbox, "p1", "retention-loss", got)
	if x.Stats().Lost != 0 {
		t.Errorf("the exporter says it lost %d bytes; JetStream discarded them", x.Stats().Lost)
	}
}

// An exporter that comes to a process after its ring let bytes go
// records exactly what it missed, as a gap record the reader turns into
// a gap.
func TestRingEvictedGapRecord(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(16<<10, api.StreamStdout, api.StreamStderr)
	src.add("p1", p)
	writeRandom(p, 6, 400, 2000)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
	x.Follow(sandbox, proc("p1"))
	writeRandom(p, 7, 20, 100)
	p.finish(1)
	want := p.want()
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
	checkWhole(t, got, want, 1)
	gaps := checkChain(t, subjectMessages(ctx, t, js, node, sandbox, "p1"))
	var recorded int64
	for _, g := range gaps {
		if g.Cause != CauseRingEvicted {
			t.Errorf("gap record %+v: cause %q", g, g.Cause)
		}
		recorded += g.Lost
	}
	if lost := got.lost["stdout"] + got.lost["stderr"]; recorded != lost || lost == 0 || x.Stats().Lost != lost {
		t.Errorf("gap records say %d, the reader lost %d, the exporter counts %d", recorded, lost, x.Stats().Lost)
	}
	checkLogs(ctx, t, js, node, sandbox, "p1", "lossy", got)
}

// A follower rests when lapped, or when it has published most of a span
// long enough to tell (see restShare).
func TestShouldRest(t *testing.T) {
	for _, tc := range []struct {
		lapped       bool
		worked, span time.Duration
		want         bool
	}{
		{true, 0, 0, true},
		{false, 0, time.Second, false},
		{false, busySpan / 2, busySpan / 2, false}, // too short a span to tell
		{false, busySpan, busySpan, true},
		{false, 95 * time.Millisecond, busySpan, true},
		{false, 80 * time.Millisecond, busySpan, false}, // keeps up, idle a fifth of the time
		{false, 900 * time.Millisecond, time.Second, true},
	} {
		if got := shouldRest(tc.lapped, tc.worked, tc.span); got != tc.want {
			t.Errorf("shouldRest(%v, %v, %v) = %v, want %v", tc.lapped, tc.worked, tc.span, got, tc.want)
		}
	}
}

// A flood that outruns the export while it is followed: the follower,
// lapped again and again, rests, and the copy is still exact (each byte
// stored once at its offset, or counted in a gap record), its messages a
// chain with no duplicate.
func TestFloodRests(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(64<<10, api.StreamStdout)
	src.add("p1", p)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
	x.Follow(sandbox, proc("p1"))
	// Chunks of a length prime to the others', so that a byte stored at
	// another's offset differs.
	chunk := make([]byte, 65521)
	for i := range 4 { // 8 MiB, 2 at a time: more than the ring and the inbox hold
		for j := range chunk {
			chunk[j] = byte(i*7 + j)
		}
		for range 32 {
			p.write(api.StreamStdout, chunk)
		}
		// The next 2 MiB once the export has stored more: it is lapped
		// while it follows, not only when it comes.
		n := x.Stats().Messages
		for x.Stats().Messages == n {
			select {
			case <-ctx.Done():
				t.Fatalf("nothing more exported: %+v", x.Stats())
			case <-time.After(time.Millisecond):
			}
		}
	}
	p.finish(0)
	want := p.want()
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
	checkWhole(t, got, want, 0)
	gaps := checkChain(t, subjectMessages(ctx, t, js, node, sandbox, "p1"))
	checkRecordedLoss(t, got, gaps)
	st := x.Stats()
	t.Logf("stats %+v", st)
	if st.Bytes+st.Lost != int64(len(want["stdout"])) || st.Lost == 0 || st.Rests == 0 {
		t.Errorf("stats %+v: stored and lost make %d bytes of %d, want all, with a rest", st, st.Bytes+st.Lost, len(want["stdout"]))
	}
}

// A process the exporter can no longer read (its sandbox gone) is left
// without an end record: its exit was not observed.
func TestGoneProcessHasNoEnd(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout)
	src.add("p1", p)
	gone := newLogWatch(t, "cannot be read any more")
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src, Log: slogOf(gone)})
	x.Follow(sandbox, proc("p1"))
	p.write(api.StreamStdout, []byte("hello\n"))
	want := p.want()
	waitExported(ctx, t, js, node, sandbox, "p1", want, map[string]int64{"stdout": 6})
	p.mu.Lock()
	p.gone = true
	p.mu.Unlock()
	// The conn the exporter holds breaks, as an agent's does when its
	// sandbox stops.
	src.breakAll("p1")
	select {
	case <-gone.seen:
	case <-ctx.Done():
		t.Fatal("the exporter did not give up")
	}
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{}, want)
	if got.exit != nil || len(got.ends) != 0 || got.delivered["stdout"] != 6 {
		t.Errorf("read %+v", got)
	}
	checkLogs(ctx, t, js, node, sandbox, "p1", "interrupted", got)
	if logs, err := Logs(ctx, js, "n2", sandbox); err != nil || len(logs) != 0 {
		t.Errorf("Logs of a node that never exported: %+v, %v", logs, err)
	}
	// A message no exporter wrote, on another process's subject, makes
	// that process's log corrupted, and no other's.
	if _, err := js.Publish(ctx, Subject(node, sandbox, "p2"), []byte("not an exporter's")); err != nil {
		t.Fatal(err)
	}
	logs, err := Logs(ctx, js, node, sandbox)
	if err != nil || len(logs) != 2 || logs[0].Process != "p1" || logs[0].Runs[0].State != "interrupted" ||
		logs[1].Process != "p2" || logs[1].Runs[0].State != "corrupted" || len(logs[1].Runs[0].Problems) != 1 || logs[1].Complete {
		t.Errorf("Logs with a foreign message: %+v, %v", logs, err)
	}
	if _, err := NewReader(ctx, js, node, sandbox, "nope", ReadOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a process never exported: %v", err)
	}
	if _, err := NewReader(ctx, js, "n2", sandbox, "p1", ReadOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a node that never exported: %v", err)
	}
}

// Deleting a sandbox purges its processes' subjects, and no other's.
func TestPurge(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
	wants := map[string]map[string][]byte{}
	for _, id := range []string{"a1", "a2", "b1"} {
		p := newFakeProc(0, api.StreamStdout)
		src.add(id, p)
		sbx := "sa"
		if id[0] == 'b' {
			sbx = "sb"
		}
		x.Follow(sbx, proc(id))
		p.write(api.StreamStdout, []byte(id))
		p.finish(0)
		wants[id] = p.want()
		readBack(ctx, t, js, node, sbx, id, ReadOptions{Follow: true}, wants[id])
	}
	if err := x.Purge(ctx, "sa"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a1", "a2"} {
		if _, err := NewReader(ctx, js, node, "sa", id, ReadOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s after the purge: %v", id, err)
		}
	}
	checkWhole(t, readBack(ctx, t, js, node, "sb", "b1", ReadOptions{}, wants["b1"]), wants["b1"], 0)
}

// Two exporters on one process: one of them is fenced out and says so;
// the other exports it to its end, and the subject stays one chain.
func TestSecondExporterFenced(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout, api.StreamStderr)
	src.add("p1", p)
	fenced := newLogWatch(t, "another writer holds")
	a := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src, Log: slogOf(fenced)})
	a.Follow(sandbox, proc("p1"))
	p.write(api.StreamStdout, []byte("first\n"))
	waitExported(ctx, t, js, node, sandbox, "p1", p.want(), map[string]int64{"stdout": 6})
	b := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src, Log: slogOf(fenced)})
	b.Follow(sandbox, proc("p1"))
	// The process writes on until one of them gives way: both read it,
	// both publish it.
	r := rand.New(rand.NewPCG(8, 9))
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-fenced.seen:
		case <-tick.C:
			p.write(byte(1+r.IntN(2)), []byte(time.Now().String()+"\n"))
			if i < 20000 {
				continue
			}
			t.Fatal("neither exporter was fenced")
		}
		break
	}
	writeRandom(p, 10, 50, 500)
	p.finish(0)
	want := p.want()
	checkWhole(t, readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want), want, 0)
	ms := subjectMessages(ctx, t, js, node, sandbox, "p1")
	checkChain(t, ms)
	if fa, fb := a.Stats().Fenced, b.Stats().Fenced; fa+fb != 1 {
		t.Errorf("fenced: a %d, b %d; want one of them", fa, fb)
	}
	writers := map[string]int{}
	for _, m := range ms {
		writers[m.writer]++
	}
	t.Logf("messages by writer: %v (a %s, b %s); stats a %+v, b %+v", writers, a.writer, b.writer, a.Stats(), b.Stats())
}

// An exporter stopped in the middle of a process's output and started
// again (a kilnd restart) resumes from the subject's last message: the
// subject holds every byte once, or a gap record of exactly what the
// ring let go meanwhile.
func TestResumeAfterRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		while int // bytes written while no exporter runs
	}{
		{"caught up from the ring", 64 << 10},
		{"ring evicted", 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t, 2*time.Minute)
			srv := natstest.Server(t)
			_, js := connect(t, srv.ClientURL())
			src := &fakeSource{}
			p := newFakeProc(256<<10, api.StreamStdout, api.StreamStderr)
			src.add("p1", p)
			a := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
			a.Follow(sandbox, proc("p1"))
			writeRandom(p, 11, 100, 2000) // less than the ring holds
			want := p.want()
			waitExported(ctx, t, js, node, sandbox, "p1", want, map[string]int64{"stdout": int64(len(want["stdout"])) / 2})
			a.Close()
			writeRandom(p, 12, tc.while/1000, 2000)
			want = p.want()
			b := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
			b.Follow(sandbox, proc("p1"))
			waitExported(ctx, t, js, node, sandbox, "p1", want, map[string]int64{"stdout": int64(len(want["stdout"])), "stderr": int64(len(want["stderr"]))})
			writeRandom(p, 13, 100, 2000)
			p.finish(0)
			want = p.want()
			got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
			checkWhole(t, got, want, 0)
			gaps := checkChain(t, subjectMessages(ctx, t, js, node, sandbox, "p1"))
			lost := got.lost["stdout"] + got.lost["stderr"]
			if tc.while < 256<<10 && lost != 0 || tc.while > 256<<10 && lost == 0 {
				t.Errorf("%d bytes lost with %d written while no exporter ran, in a ring of 256 KiB", lost, tc.while)
			}
			for _, g := range gaps {
				if g.Cause != CauseExportDown {
					t.Errorf("gap record %+v: cause %q", g, g.Cause)
				}
			}
			if a.Stats().Fenced+b.Stats().Fenced != 0 {
				t.Errorf("fenced: %+v %+v", a.Stats(), b.Stats())
			}
		})
	}
}

// NATS stopped while a process writes, then started again: the exporter
// catches up from the ring, or records exactly what the ring let go.
func TestNATSDownMidRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		while int
	}{
		{"caught up from the ring", 64 << 10},
		{"ring evicted", 4 << 20}, // more than the ring and the exporter's read-ahead
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t, 2*time.Minute)
			c := natstest.Cluster(t, 1)
			_, js := connect(t, c.URLs()...)
			src := &fakeSource{}
			p := newFakeProc(256<<10, api.StreamStdout, api.StreamStderr)
			src.add("p1", p)
			x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
			x.Follow(sandbox, proc("p1"))
			writeRandom(p, 21, 100, 2000)
			want := p.want()
			waitExported(ctx, t, js, node, sandbox, "p1", want, map[string]int64{"stdout": int64(len(want["stdout"]))})
			c.Stop(0)
			writeRandom(p, 22, tc.while/1000, 2000)
			c.Restart(0)
			writeRandom(p, 23, 50, 2000)
			p.finish(0)
			want = p.want()
			got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
			checkWhole(t, got, want, 0)
			gaps := checkChain(t, subjectMessages(ctx, t, js, node, sandbox, "p1"))
			lost := got.lost["stdout"] + got.lost["stderr"]
			if tc.while < 256<<10 && lost != 0 || tc.while > 256<<10 && lost == 0 {
				t.Errorf("%d bytes lost with %d written while NATS was down, in a ring of 256 KiB", lost, tc.while)
			}
			// The writes are faster than any exporter: the ring may
			// have let them go before NATS went (ring-evicted) or while
			// it was gone (export-down); the count is exact either way.
			for _, g := range gaps {
				if g.Cause != CauseExportDown && g.Cause != CauseRingEvicted {
					t.Errorf("gap record %+v: cause %q", g, g.Cause)
				}
			}
			t.Logf("stats %+v", x.Stats())
		})
	}
}

// NATS not up when the exporter starts: it waits, then exports.
func TestNATSDownAtStart(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	c := natstest.Cluster(t, 1)
	c.Stop(0)
	_, js := connect(t, c.URLs()...)
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout)
	src.add("p1", p)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
	x.Follow(sandbox, proc("p1"))
	writeRandom(p, 31, 100, 1000)
	p.finish(0)
	c.Restart(0)
	want := p.want()
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, waitStream(ctx, t, js, want))
	checkWhole(t, got, want, 0)
	if got.lost["stdout"] != 0 {
		t.Errorf("lost %d", got.lost["stdout"])
	}
}

// waitStream waits until the node's stream exists (the exporter sets it
// up once NATS answers) and returns want.
func waitStream(ctx context.Context, t *testing.T, js jetstream.JetStream, want map[string][]byte) map[string][]byte {
	t.Helper()
	waitExported(ctx, t, js, node, sandbox, "p1", want, map[string]int64{"stdout": 1})
	return want
}

// On a cluster of three with the stream replicated three times, one
// server (the stream's leader) stopped mid-run loses nothing the
// exporter had acknowledged: every message it counted stored is there,
// one chain, and the output reads back whole.
func TestR3StopOneServer(t *testing.T) {
	if testing.Short() {
		t.Skip("an election takes seconds")
	}
	ctx := ctxT(t, 3*time.Minute)
	c := natstest.Cluster(t, 3)
	_, js := connect(t, c.URLs()...)
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout, api.StreamStderr)
	src.add("p1", p)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src, Replicas: 3})
	x.Follow(sandbox, proc("p1"))
	writeRandom(p, 41, 300, 4000)
	want := p.want()
	waitExported(ctx, t, js, node, sandbox, "p1", want, map[string]int64{"stdout": int64(len(want["stdout"]))})
	s, err := js.Stream(ctx, StreamName(node))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := -1
	for i := range 3 {
		if c.Server(i).Name() == info.Cluster.Leader {
			stopped = i
		}
	}
	if stopped < 0 {
		t.Fatalf("leader %q", info.Cluster.Leader)
	}
	// Stopped while the exporter is busy with more.
	writeRandom(p, 42, 300, 4000)
	c.Stop(stopped)
	writeRandom(p, 43, 300, 4000)
	p.finish(0)
	want = p.want()
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
	checkWhole(t, got, want, 0)
	if l := got.lost["stdout"] + got.lost["stderr"]; l != 0 {
		t.Errorf("%d bytes lost", l)
	}
	ms := subjectMessages(ctx, t, js, node, sandbox, "p1")
	checkChain(t, ms)
	if st := x.Stats(); int64(len(ms)) != st.Messages {
		t.Errorf("the subject holds %d messages; the exporter had %d acknowledged", len(ms), st.Messages)
	}
	t.Logf("stopped server %d, the stream's leader; stats %+v", stopped, x.Stats())
}

// A node stream made before with settings the exporter cannot change
// (memory storage) takes the export all the same, and says so.
func TestStreamWithOtherSettings(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: StreamName(node), Subjects: []string{"kiln." + node + ".out.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	kept := newLogWatch(t, "keeps settings other than")
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamStdout)
	src.add("p1", p)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src, Log: slogOf(kept)})
	x.Follow(sandbox, proc("p1"))
	p.write(api.StreamStdout, []byte("kept\n"))
	p.finish(0)
	want := p.want()
	checkWhole(t, readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want), want, 0)
	select {
	case <-kept.seen:
	default:
		t.Error("the exporter did not say the stream's settings are not its own")
	}
}

// A terminal process's one stream exports and reads back as its own.
func TestTerminalProcess(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	srv := natstest.Server(t)
	_, js := connect(t, srv.ClientURL())
	src := &fakeSource{}
	p := newFakeProc(0, api.StreamTerminal)
	src.add("p1", p)
	x := startExporter(t, Config{Node: node, Conn: js.Conn(), Source: src})
	tp := proc("p1")
	tp.Terminal = true
	x.Follow(sandbox, tp)
	writeRandom(p, 51, 200, 500)
	p.finish(0)
	want := p.want()
	got := readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{Follow: true}, want)
	checkWhole(t, got, want, 0)
	if _, ok := got.hello.Streams["terminal"]; len(got.hello.Streams) != 1 || !ok {
		t.Errorf("hello %+v", got.hello)
	}
	ms := subjectMessages(ctx, t, js, node, sandbox, "p1")
	checkChain(t, ms)
	if b := ms[0]; b.rec.Event != eventBegin || !b.rec.Terminal || len(b.rec.Streams) != 1 || b.rec.Streams[0] != "terminal" || b.rec.Argv[0] != "sh" {
		t.Errorf("begin record %+v", b.rec)
	}
	got = readBack(ctx, t, js, node, sandbox, "p1", ReadOptions{From: Offsets{"terminal": 100}}, want)
	checkWhole(t, got, want, 0)
	if h := got.hello.Streams["terminal"]; h.Total != int64(len(want["terminal"])) {
		t.Errorf("hello %+v, want a total of %d", got.hello, len(want["terminal"]))
	}
}

// What the tests of package outexport_test (those that run a real kilnd,
// whose daemon imports this package) use of these tests' helpers.
const Node = node

var (
	CtxT              = ctxT
	Connect           = connect
	StartExporter     = startExporter
	ReadBack          = readBack
	WaitExported      = waitExported
	CheckWhole        = checkWhole
	SubjectMessages   = subjectMessages
	CheckChain        = checkChain
	CheckRecordedLoss = checkRecordedLoss
	CheckLogs         = checkLogs
)

// LostOf is what a read back lost, by stream.
func LostOf(r replayed) map[string]int64 { return r.lost }

// WriterOf is the exporter that published m.
func WriterOf(m *message) string { return m.writer }

// ExporterWriter is the writer x's messages name.
func ExporterWriter(x *Exporter) string { return x.writer }
