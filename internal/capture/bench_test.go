package capture

import (
	"testing"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// BenchmarkWriter measures the writer alone: chunks of a real ring pushed
// (paced, so nothing is dropped) and written to a log in a temporary
// directory, with the default rotation.
func BenchmarkWriter(b *testing.B) {
	for _, sh := range []struct {
		name string
		line int
	}{{"16KiB-lines", 16 << 10}, {"100B-lines", 100}} {
		b.Run(sh.name, func(b *testing.B) {
			chunk := make([]byte, 256<<10/sh.line*sh.line)
			for i := range chunk {
				chunk[i] = 'a' + byte(i%26)
				if i%sh.line == sh.line-1 {
					chunk[i] = '\n'
				}
			}
			d, err := OpenDir(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			w, err := Begin(d, newRunID(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			f := &feeder{r: ring.New(ring.Config{Capacity: 4 << 20, Streams: []ring.Stream{ring.Stdout}}), w: w, paced: true}
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			for range b.N {
				f.write(ring.Stdout, chunk)
			}
			w.Sink().Close()
			<-w.Done()
			b.StopTimer()
			if res := w.Result(); res.Dropped != [NumLogStreams]int64{} || !res.Ended {
				b.Fatalf("result %+v", res)
			}
		})
	}
}
