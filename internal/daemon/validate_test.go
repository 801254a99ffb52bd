package daemon

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzValidateCreate decodes arbitrary JSON as a create request and checks
// it: never a panic, and what passes is within bounds.
func FuzzValidateCreate(f *testing.F) {
	f.Add([]byte(`{"hostname":"box","limits":{"memory_bytes":67108864,"pids":64,"cpus":1.5},"idle_timeout_seconds":60}`))
	f.Add([]byte(`{"init":{"command":"sh","args":["-c","exit 3"]},"rootfs":"/"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req CreateRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		if validateCreate(req) != nil {
			return
		}
		l := req.Limits
		switch {
		case l.MemoryBytes < 0 || l.Pids < 0 || l.CPUs < 0 || l.CPUs > maxCPUs,
			req.IdleTimeoutSeconds < 0 || req.IdleTimeoutSeconds > maxIdleTimeout,
			len(req.Hostname) > 63 || strings.ContainsAny(req.Hostname, " /\x00"),
			req.Init != nil && req.Init.Command == "":
			t.Fatalf("accepted %+v", req)
		}
	})
}
