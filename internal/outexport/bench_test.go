package outexport

import (
	"fmt"
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
