package daemon

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// FuzzValidateCreate decodes arbitrary JSON as a create request and checks
// it: never a panic, and what passes is within bounds.
func FuzzValidateCreate(f *testing.F) {
	f.Add([]byte(`{"hostname":"box","limits":{"memory_bytes":67108864,"pids":64,"cpus":1.5},"idle_timeout_seconds":60}`))
	f.Add([]byte(`{"init":{"command":"sh","args":["-c","exit 3"]},"rootfs":"/"}`))
	f.Add([]byte(`{"limits":{"memory_bytes":0,"pids":0,"cpus":0}}`))
	f.Add([]byte(`{"logs":{"max_size_bytes":65536,"max_files":3}}`))
	f.Add([]byte(`{"logs":{"max_size_bytes":1,"max_files":1000}}`))
	f.Add([]byte(`{"limits":{"cpus":0.001,"pids":1099511627776,"memory_bytes":9223372036854775807,"disk_bytes":1}}`))
	f.Add([]byte(`{"limits":{"cpus":0.01,"pids":1,"memory_bytes":4194304,"disk_bytes":67108864}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req CreateRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		l := req.Limits.Apply(DefaultLimits)
		if validateCreate(req, l) != nil {
			return
		}
		h := host()
		switch {
		case l.MemoryBytes < 0 || l.Pids < 0 || l.CPUs < 0 || l.DiskBytes < 0,
			l.CPUs > 0 && (l.CPUs < api.MinCPUs || l.CPUs > float64(h.cpus)),
			l.MemoryBytes > 0 && (l.MemoryBytes < api.MinMemoryBytes || l.MemoryBytes > h.memory),
			l.Pids > api.MaxPids,
			l.DiskBytes > 0 && (l.DiskBytes < api.MinDiskBytes || l.DiskBytes > api.MaxDiskBytes),
			req.IdleTimeoutSeconds < 0 || req.IdleTimeoutSeconds > api.MaxIdleTimeoutSeconds,
			len(req.Hostname) > 63 || strings.ContainsAny(req.Hostname, " /\x00"),
			req.Init != nil && req.Init.Command == "" && req.Image == "",
			req.Logs != nil && (req.Logs.MaxSizeBytes != 0 && (req.Logs.MaxSizeBytes < api.MinLogFileSize || req.Logs.MaxSizeBytes > api.MaxLogFileSize) ||
				req.Logs.MaxFiles != 0 && (req.Logs.MaxFiles < api.MinLogFiles || req.Logs.MaxFiles > api.MaxLogFiles)):
			t.Fatalf("accepted %+v", req)
		}
	})
}

func TestLimitListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := limitListener(l, 2)
	defer ll.Close()
	for range 3 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	a, err := ll.Accept()
	if err != nil {
		t.Fatal(err)
	}
	b, err := ll.Accept()
	if err != nil {
		t.Fatal(err)
	}
	// Every slot is taken: a third Accept waits for one.
	if lim := ll.(*limited); len(lim.slots) != cap(lim.slots) {
		t.Fatalf("%d of %d slots taken after two accepts", len(lim.slots), cap(lim.slots))
	}
	third := make(chan net.Conn)
	go func() {
		c, _ := ll.Accept()
		third <- c
	}()
	a.Close()
	a.Close() // frees its slot once
	c := <-third
	if c == nil {
		t.Fatal("no third connection after one closed")
	}
	c.Close()
	b.Close()
}
