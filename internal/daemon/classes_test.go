package daemon_test

import (
	"errors"
	"math"
	"testing"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// TestRefusalsKeepTheirClass walks the errors of the hostile create
// requests as kilnd's Go API returns them, before any transport: each
// is of the class its answer's code stands for (errors.Is, and ClassOf
// finding that class first), whatever it wraps beneath, so that a cause
// wrapped with %w never turns a refusal into another kind of failure.
func TestRefusalsKeepTheirClass(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	n := func(v int64) *int64 { return &v }
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name string
		req  api.CreateSandbox
		want *errdefs.Class
	}{
		{"cpus below the least quota", api.CreateSandbox{Limits: api.LimitsRequest{CPUs: f(0.001)}}, errdefs.ErrInvalidArgument},
		{"cpus NaN", api.CreateSandbox{Limits: api.LimitsRequest{CPUs: f(math.NaN())}}, errdefs.ErrInvalidArgument},
		{"memory of 5 bytes", api.CreateSandbox{Limits: api.LimitsRequest{MemoryBytes: n(5)}}, errdefs.ErrInvalidArgument},
		{"pids 2^40", api.CreateSandbox{Limits: api.LimitsRequest{Pids: n(1 << 40)}}, errdefs.ErrInvalidArgument},
		{"disk of a byte", api.CreateSandbox{Limits: api.LimitsRequest{DiskBytes: n(1)}}, errdefs.ErrInvalidArgument},
		{"idle timeout negative", api.CreateSandbox{IdleTimeoutSeconds: -1}, errdefs.ErrInvalidArgument},
		{"a thousand log files", api.CreateSandbox{Logs: &api.LogRotation{MaxFiles: 1000}}, errdefs.ErrInvalidArgument},
		{"an on_oom not known", api.CreateSandbox{OnOOM: "restart"}, errdefs.ErrInvalidArgument},
		{"a gvisor sandbox losing one process", api.CreateSandbox{Runtime: "gvisor", OnOOM: api.OnOOMKillProcess}, errdefs.ErrInvalidArgument},
		{"a runtime not known", api.CreateSandbox{Runtime: "vm"}, errdefs.ErrInvalidArgument},
		{"a name not a DNS label", api.CreateSandbox{Name: "A_B"}, errdefs.ErrInvalidArgument},
		{"an init with no command", api.CreateSandbox{Init: &api.ExecRequest{}}, errdefs.ErrInvalidArgument},
		{"an egress not known", api.CreateSandbox{Network: &api.Network{Egress: "some"}}, errdefs.ErrInvalidArgument},
		{"an egress range not a range", api.CreateSandbox{Network: &api.Network{Allow: []string{"300.0.0.0/8"}}}, errdefs.ErrInvalidArgument},
		{"a rootfs not there", api.CreateSandbox{Rootfs: "missing"}, errdefs.ErrNotFound},
		{"a rootfs outside the images", api.CreateSandbox{Rootfs: "/etc"}, errdefs.ErrInvalidArgument},
		{"an image not there", api.CreateSandbox{Image: "missing:latest"}, errdefs.ErrNotFound},
		{"an image and a rootfs", api.CreateSandbox{Image: "busybox", Rootfs: "x"}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k.d.Create(t.Context(), tc.req)
			if err == nil {
				t.Fatal("created")
			}
			if !errors.Is(err, tc.want) || errdefs.ClassOf(err) != tc.want {
				t.Errorf("%v: class %v, want %v", err, errdefs.ClassOf(err), tc.want)
			}
		})
	}
}
