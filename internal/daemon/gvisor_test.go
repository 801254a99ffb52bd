package daemon_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/pidfd/pidfdtest"
)

// createGVisor creates a gVisor sandbox with the create request body, or
// skips the test where this host has no runsc (outside CI).
func createGVisor(t *testing.T, k *kilnd, body string) daemon.Info {
	t.Helper()
	code, b := k.do("POST", "/sandboxes", k.d.Token(), body)
	if code == http.StatusServiceUnavailable && os.Getenv("CI") == "" {
		k.cleanup()
		t.Skipf("no gVisor here: %s", b)
	}
	var info daemon.Info
	k.json("GET", "/sandboxes/"+idOf(t, code, b), nil, &info)
	return info
}

// TestStatsSameOnBothRuntimes runs the same workload in a namespace
// sandbox and a gVisor one with the same limits, and holds their stats,
// as kilnd answers them, to each other: the limits asked for (not the
// room gVisor's sandbox has beyond them), the sandbox's own tasks (not
// gVisor's kernel's threads), its memory, and its disk; its metrics say
// the same.
func TestStatsSameOnBothRuntimes(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	const (
		memory = 512 << 20
		pids   = 256
		disk   = 256 << 20
		// The workload: 128 MiB held by a process, 32 MiB in /dev/shm,
		// 24 MiB on the disk (written past the page cache); a shell and
		// four sleeps beside it.
		held, shm, written = 128 << 20, 32 << 20, 24 << 20
		tasks              = 6 // python, sh, 4 × sleep
		// What the two backends may differ by: the tasks of the spawner
		// (its forking thread alone, on a hybrid host's namespace
		// sandbox; every thread of it in gVisor's kernel's group), the
		// memory each kernel counts beyond the workload's own (the
		// interpreter's, page tables, a kernel's own structures: 4 to
		// 10 MiB here), and the disk's metadata.
		pidsSlack, memorySlack, diskSlack = 12, 16 << 20, 4 << 20
	)
	// Python's files in the host's page cache, charged to this test's
	// group: not to the first sandbox to read them (the namespace
	// sandbox's memory counts the host's page cache of what it reads).
	if out, err := exec.Command("python3", "-c", "import time").CombinedOutput(); err != nil {
		t.Fatalf("python3 on the host: %v: %s", err, out)
	}
	limits := fmt.Sprintf(`"limits":{"memory_bytes":%d,"pids":%d,"disk_bytes":%d}`, memory, pids, disk)
	gv := createGVisor(t, k, `{"runtime":"gvisor",`+limits+`}`)
	var ns daemon.Info
	k.json("POST", "/sandboxes", `{`+limits+`}`, &ns)
	defer k.cleanup()

	stats := map[string]api.SandboxStats{}
	for _, sb := range []daemon.Info{ns, gv} {
		var st api.Started
		k.json("POST", "/sandboxes/"+sb.ID+"/exec-stream", api.ExecRequest{Command: "python3", Args: []string{"-c", fmt.Sprintf(`
import time
b = bytearray(%d)
for i in range(0, len(b), 4096):
    b[i] = 1
with open("/dev/shm/fill", "wb") as f:
    f.write(bytes(%d))
open("/tmp/ready", "w").close()
time.sleep(3600)
`, held, shm)}}, &st)
		k.json("POST", "/sandboxes/"+sb.ID+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c",
			// Past the page cache, which only a namespace sandbox's
			// memory counts (docs/operations.md says so).
			fmt.Sprintf("dd if=/dev/zero of=/workspace/fill bs=1M count=%d oflag=direct 2>/dev/null; ", written>>20) +
				"for i in 1 2 3 4; do sleep 3600 & done; touch /tmp/slept; wait"}}, &st)
		// Inside, until the workload says it is all there (the exec's
		// own shell and sleep end before the stats are read).
		var res api.ExecResult
		k.json("POST", "/sandboxes/"+sb.ID+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c",
			"until [ -e /tmp/ready ] && [ -e /tmp/slept ]; do sleep 0.05; done; sync"}}, &res)
		if res.ExitCode == nil || *res.ExitCode != 0 {
			t.Fatalf("%s: waiting for the workload: %+v", sb.Runtime, res)
		}
		var s api.SandboxStats
		k.json("GET", "/sandboxes/"+sb.ID+"/stats", nil, &s)
		if s.Counts == nil {
			t.Errorf("%s: no counts from the agent", sb.Runtime)
			s.Counts = &api.AgentCounts{}
		}
		stats[sb.Runtime] = s
	}

	// The metrics are the same figures.
	body := k.scrape()
	for _, sb := range []daemon.Info{ns, gv} {
		label := `sandbox="` + sb.ID + `"`
		s := stats[sb.Runtime]
		for _, m := range []struct {
			name string
			want int64
		}{
			{"kilnd_sandbox_memory_limit_bytes", memory},
			{"kilnd_sandbox_pids_limit", pids},
			{"kilnd_sandbox_disk_size_bytes", val(s.Counts.DiskSizeBytes)},
		} {
			if v, ok := sample(body, m.name, label); !ok || int64(v) != m.want {
				t.Errorf("%s: %s = %v (%v), want %d", sb.Runtime, m.name, v, ok, m.want)
			}
		}
		for _, m := range []struct {
			name string
			want int64
		}{{"kilnd_sandbox_memory_bytes", val(s.MemoryBytes)}, {"kilnd_sandbox_pids", val(s.Pids)}} {
			// Read again, a moment later: the same within the slack.
			slack := float64(memorySlack)
			if m.name == "kilnd_sandbox_pids" {
				slack = pidsSlack
			}
			if v, ok := sample(body, m.name, label); !ok || v < float64(m.want)-slack || v > float64(m.want)+slack {
				t.Errorf("%s: %s = %v (%v), the stats said %d", sb.Runtime, m.name, v, ok, m.want)
			}
		}
	}

	n, g := stats["namespaces"], stats["gvisor"]
	for rt, s := range stats {
		t.Logf("%s: memory %v of %v, pids %v of %v, disk %v of %v, oom kills %v", rt, val(s.MemoryBytes), val(s.MemoryLimitBytes),
			val(s.Pids), val(s.PidsLimit), val(s.Counts.DiskUsedBytes), val(s.Counts.DiskSizeBytes), val(s.OOMKills))
		if val(s.MemoryLimitBytes) != memory || val(s.PidsLimit) != pids {
			t.Errorf("%s: limits %v bytes, %v pids, want the %d and %d asked for", rt, val(s.MemoryLimitBytes), val(s.PidsLimit), memory, pids)
		}
		if m := val(s.MemoryBytes); m < held+shm || m > memory {
			t.Errorf("%s: memory %d, want at least the %d held and in /dev/shm", rt, m, held+shm)
		}
		if p := val(s.Pids); p < tasks || p > tasks+pidsSlack {
			t.Errorf("%s: %d tasks, want the workload's %d and at most %d more", rt, p, tasks, pidsSlack)
		}
		if val(s.Counts.DiskUsedBytes) < written || val(s.Counts.DiskSizeBytes) > disk || val(s.Counts.DiskSizeBytes) < disk/2 {
			t.Errorf("%s: disk counts %+v, want %d written on a disk of about %d", rt, s.Counts, written, disk)
		}
		if val(s.OOMKills) != 0 {
			t.Errorf("%s: %d out-of-memory kills", rt, val(s.OOMKills))
		}
	}
	if d := val(n.MemoryBytes) - val(g.MemoryBytes); d < -memorySlack || d > memorySlack {
		t.Errorf("memory: %d in the namespace sandbox, %d in gVisor's: more than %d apart", val(n.MemoryBytes), val(g.MemoryBytes), memorySlack)
	}
	if d := val(n.Pids) - val(g.Pids); d < -pidsSlack || d > pidsSlack {
		t.Errorf("tasks: %d in the namespace sandbox, %d in gVisor's: more than %d apart", val(n.Pids), val(g.Pids), pidsSlack)
	}
	if d := val(n.Counts.DiskUsedBytes) - val(g.Counts.DiskUsedBytes); d < -diskSlack || d > diskSlack ||
		val(n.Counts.DiskSizeBytes) != val(g.Counts.DiskSizeBytes) {
		t.Errorf("disk: %v of %v in the namespace sandbox, %v of %v in gVisor's", val(n.Counts.DiskUsedBytes), val(n.Counts.DiskSizeBytes),
			val(g.Counts.DiskUsedBytes), val(g.Counts.DiskSizeBytes))
	}
}

// val is *p, or -1 for nil.
func val(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}

// idOf is the id of the sandbox a create answered with code and body b.
func idOf(t *testing.T, code int, b []byte) string {
	t.Helper()
	var info daemon.Info
	if code != http.StatusCreated && code != http.StatusOK || json.Unmarshal(b, &info) != nil || info.ID == "" {
		t.Fatalf("create: %d %s", code, b)
	}
	return info.ID
}

// awaitStopped polls the sandbox's record until it is no longer running,
// within faultDeadline.
func (k *kilnd) awaitStopped(id string) daemon.Info {
	k.t.Helper()
	deadline := time.Now().Add(faultDeadline)
	for {
		var info daemon.Info
		k.json("GET", "/sandboxes/"+id, nil, &info)
		if info.State != daemon.StateRunning {
			return info
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("sandbox %s still running after %v", id, faultDeadline)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Memory hogs, each past a 128 MiB limit and the process the shell
// becomes: in one allocation; a little at
// a time (the host's killer then picks the stub of gVisor's that maps the
// most, one process's, rather than gVisor's kernel); and a file in /tmp
// that no process holds, with a process's allocation on top.
var memoryHogs = []struct{ name, script string }{
	{"at once", `exec python3 -c 'b = bytearray(512 << 20); print(len(b))'`},
	{"gradually", `exec python3 -c '
l = []
for i in range(64):
    l.append(bytearray(16 << 20))
'`},
	{"a file and a process", `head -c 120M /dev/zero > /tmp/fill; exec python3 -c 'b = bytearray(160 << 20); print(len(b))'`},
}

// TestOutOfMemory: what docs/security.md says happens past a sandbox's memory
// limit, through kilnd. By default the whole sandbox ends the same way on
// both runtimes: stopped with the reason "out of memory", its agent gone,
// whichever process was picked and however the memory was filled; an
// exec under way answers either its process's kill for its memory or
// that the sandbox went, never a plain exit. A namespace sandbox created
// with on_oom kill_process loses the process alone, reported with
// oom_killed, and goes on; a gVisor one cannot be asked to.
func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	limits := fmt.Sprintf(`"limits":{"memory_bytes":%d}`, 128<<20)
	for _, runtime := range []string{"namespaces", "gvisor"} {
		t.Run(runtime, func(t *testing.T) {
			t.Parallel()
			k := start(t, "")
			defer k.cleanup()
			for _, hog := range memoryHogs {
				sb := createGVisor(t, k, `{"runtime":"`+runtime+`",`+limits+`}`)
				if sb.OnOOM != api.OnOOMEndSandbox {
					t.Fatalf("on_oom %q, want %s by default", sb.OnOOM, api.OnOOMEndSandbox)
				}
				agent := pidfdtest.Watch(t, sb.AgentPID)
				code, b := k.do("POST", "/sandboxes/"+sb.ID+"/exec", k.d.Token(), api.ExecRequest{Command: "sh", Args: []string{"-c", hog.script}})
				if code == http.StatusOK {
					var res api.ExecResult
					if err := json.Unmarshal(b, &res); err != nil || res.Signal != "KILL" || !res.OOMKilled {
						t.Errorf("%s: the exec answered %s", hog.name, b)
					}
				}
				info := k.awaitStopped(sb.ID)
				if info.State != daemon.StateStopped || !strings.HasPrefix(info.Reason, "out of memory") {
					t.Errorf("%s: %s, reason %q; want stopped, out of memory", hog.name, info.State, info.Reason)
				}
				if !agent.Exited(0) {
					t.Errorf("%s: the agent %d still runs", hog.name, sb.AgentPID)
				}
			}
		})
	}
	t.Run("namespaces kill_process", func(t *testing.T) {
		t.Parallel()
		k := start(t, "")
		defer k.cleanup()
		for _, hog := range memoryHogs {
			var sb daemon.Info
			k.json("POST", "/sandboxes", `{"on_oom":"kill_process",`+limits+`}`, &sb)
			if sb.OnOOM != api.OnOOMKillProcess {
				t.Fatalf("on_oom %q, want %s", sb.OnOOM, api.OnOOMKillProcess)
			}
			var res api.ExecResult
			k.json("POST", "/sandboxes/"+sb.ID+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c", hog.script}}, &res)
			if res.Signal != "KILL" || !res.OOMKilled {
				t.Errorf("%s: %+v, want killed for its memory", hog.name, res)
			}
			var st api.SandboxStats
			k.json("GET", "/sandboxes/"+sb.ID+"/stats", nil, &st)
			if val(st.OOMKills) < 1 {
				t.Errorf("%s: %v out-of-memory kills counted", hog.name, val(st.OOMKills))
			}
			k.json("POST", "/sandboxes/"+sb.ID+"/exec", api.ExecRequest{Command: "echo", Args: []string{"alive"}}, &res)
			if res.Stdout != "alive\n" {
				t.Errorf("%s: the sandbox after: %+v", hog.name, res)
			}
		}
	})
}
