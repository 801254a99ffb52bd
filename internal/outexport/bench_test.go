package outexport

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/natstest"
)

// BenchmarkExportReplay exports 64 MiB of one process, written at once in
// 64 KiB chunks by an in-memory process that keeps it all, to a single
// JetStream server (R1), and replays it: MB/s of each (export: from
// Follow to its end record read back; a reader follows meanwhile).
func BenchmarkExportReplay(b *testing.B) {
	const size, chunk = 64 << 20, 64 << 10
	ctx := ctxT(b, 10*time.Minute)
	srv := natstest.Server(b)
	_, js := connect(b, srv.ClientURL())
	src := &fakeSource{}
	x := startExporter(b, Config{Node: node, Conn: js.Conn(), Source: src})
	data := make([]byte, chunk)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var export, replay time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("p%d", i)
		p := newFakeProc(0, api.StreamStdout)
		src.add(id, p)
		for range size / chunk {
			p.write(api.StreamStdout, data)
		}
		p.finish(0)
		want := p.want()
		began := time.Now()
		x.Follow(sandbox, proc(id))
		readBack(ctx, b, js, node, sandbox, id, ReadOptions{Follow: true}, want)
		export += time.Since(began)
		began = time.Now()
		readBack(ctx, b, js, node, sandbox, id, ReadOptions{}, want)
		replay += time.Since(began)
	}
	b.ReportMetric(float64(size)*float64(b.N)/export.Seconds()/1e6, "export-MB/s")
	b.ReportMetric(float64(size)*float64(b.N)/replay.Seconds()/1e6, "replay-MB/s")
}

// BenchmarkExportCPU exports 64 MiB of one process, written at once in
// 64 KiB chunks, to a 3-server cluster in this process (R3, as kilnd's
// embedded cluster) and reports what the export cost: MB/s from Follow to
// the end record stored, and the CPU time of the whole process (the
// exporter and the three servers) per byte exported. The CPU per byte is
// what a burst on a node pays for its export while it runs. Zeros are
// what the cluster benchmark's burst writes, and compress in the
// servers' replication; text compresses less.
func BenchmarkExportCPU(b *testing.B) {
	const size, chunk = 64 << 20, 64 << 10
	zeros := make([]byte, chunk)
	var text []byte
	for i := 0; len(text) < chunk; i++ {
		text = fmt.Appendf(text, "%08d the quick brown fox %x\n", i, uint32(i)*2654435761)
	}
	text = text[:chunk]
	for _, bc := range []struct {
		name string
		data []byte
	}{{"zeros", zeros}, {"text", text}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := ctxT(b, 10*time.Minute)
			c := natstest.Cluster(b, 3)
			_, js := connect(b, c.URLs()...)
			src := &fakeSource{}
			x := startExporter(b, Config{Node: node, Conn: js.Conn(), Source: src, Replicas: 3})
			var took, cpu time.Duration
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("p%d", i)
				p := newFakeProc(0, api.StreamStdout)
				src.add(id, p)
				for range size / chunk {
					p.write(api.StreamStdout, bc.data)
				}
				p.finish(0)
				ended := x.Stats().Ended
				began, cpu0 := time.Now(), cpuTime()
				x.Follow(sandbox, proc(id))
				for x.Stats().Ended == ended {
					select {
					case <-ctx.Done():
						b.Fatalf("not exported: %+v", x.Stats())
					case <-time.After(time.Millisecond):
					}
				}
				took += time.Since(began)
				cpu += cpuTime() - cpu0
			}
			b.ReportMetric(float64(size)*float64(b.N)/took.Seconds()/1e6, "export-MB/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(size)/float64(b.N), "cpu-ns/B")
			s := x.Stats()
			b.ReportMetric(float64(s.Bytes)/float64(s.Messages), "B/msg")
		})
	}
}

// cpuTime is the CPU time this process has taken, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
