package daemon_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestRefusals sends the whole table of hostile input through kilnd's API,
// as a client would, each row with the answer it must get: a value out of
// its documented range is 400 and its message names the field, the range
// and the value; what the host lacks is 507; a path that is not there,
// 404. No row is answered with any other 5xx, and no answer names the
// state directory or carries the words of the cgroup files or of /proc.
func TestRefusals(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	// The image store on a file system of 1 MiB: an import fills it.
	store := filepath.Join(state, "oci")
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	faultMount(t, store, 1<<20)
	k := startConfig(t, daemon.Config{StateDir: state})
	defer k.cleanup()
	disks := sandbox.DisksAvailable() == nil
	create := api.CreateSandbox{}
	if disks {
		create.Limits.DiskBytes = new(int64(api.MinDiskBytes))
	}
	var info api.Sandbox
	k.json("POST", "/sandboxes", create, &info)
	sb := "/sandboxes/" + info.ID
	var st api.Started
	k.json("POST", sb+"/exec-stream", api.ExecRequest{Command: "sleep", Args: []string{"1000"}}, &st)
	proc := sb + "/exec-stream/" + st.ID

	cpus := runtime.NumCPU()
	type row struct {
		name, method, path string
		body               any
		want               int
		// says are words the message must have (the field, its range, the
		// value), for a 400 of a range.
		says []string
	}
	rows := []row{
		// Limits, each against its documented range.
		{"cpus below the kernel's least quota", "POST", "/sandboxes", `{"limits":{"cpus":0.001}}`, 400, []string{"limits.cpus", "0.001", "0.01", fmt.Sprint(cpus)}},
		{"cpus beyond the host's", "POST", "/sandboxes", fmt.Sprintf(`{"limits":{"cpus":%d}}`, cpus+1), 400, []string{"limits.cpus", fmt.Sprint(cpus + 1), fmt.Sprint(cpus)}},
		{"cpus 500", "POST", "/sandboxes", `{"limits":{"cpus":500}}`, 400, []string{"limits.cpus", "500"}},
		{"cpus negative", "POST", "/sandboxes", `{"limits":{"cpus":-1}}`, 400, []string{"limits.cpus", "-1"}},
		{"cpus as text", "POST", "/sandboxes", `{"limits":{"cpus":"1"}}`, 400, nil},
		{"memory of 5 bytes", "POST", "/sandboxes", `{"limits":{"memory_bytes":5}}`, 400, []string{"limits.memory_bytes", "5", "4194304"}},
		{"memory beyond the host's", "POST", "/sandboxes", fmt.Sprintf(`{"limits":{"memory_bytes":%d}}`, int64(math.MaxInt64)), 400, []string{"limits.memory_bytes", fmt.Sprint(int64(math.MaxInt64))}},
		{"memory negative", "POST", "/sandboxes", `{"limits":{"memory_bytes":-1}}`, 400, []string{"limits.memory_bytes", "-1"}},
		{"pids 2^40", "POST", "/sandboxes", `{"limits":{"pids":1099511627776}}`, 400, []string{"limits.pids", "1099511627776", "1 to 4194304"}},
		{"pids just past 2^22", "POST", "/sandboxes", `{"limits":{"pids":4194305}}`, 400, []string{"limits.pids", "4194305", "1 to 4194304"}},
		{"pids negative", "POST", "/sandboxes", `{"limits":{"pids":-5}}`, 400, []string{"limits.pids", "-5"}},
		{"pids a fraction", "POST", "/sandboxes", `{"limits":{"pids":1.5}}`, 400, nil},
		{"pids past int64", "POST", "/sandboxes", `{"limits":{"pids":99999999999999999999}}`, 400, nil},
		{"disk of a byte", "POST", "/sandboxes", `{"limits":{"disk_bytes":1}}`, 400, []string{"limits.disk_bytes", "1", "67108864"}},
		{"disk past 16 TiB", "POST", "/sandboxes", fmt.Sprintf(`{"limits":{"disk_bytes":%d}}`, int64(api.MaxDiskBytes)+1), 400, []string{"limits.disk_bytes", fmt.Sprint(int64(api.MaxDiskBytes) + 1)}},
		{"idle timeout negative", "POST", "/sandboxes", `{"idle_timeout_seconds":-1}`, 400, []string{"idle_timeout_seconds", "-1"}},
		{"idle timeout past a year", "POST", "/sandboxes", fmt.Sprintf(`{"idle_timeout_seconds":%d}`, api.MaxIdleTimeoutSeconds+1), 400, []string{"idle_timeout_seconds", fmt.Sprint(api.MaxIdleTimeoutSeconds + 1)}},
		{"log files of a byte", "POST", "/sandboxes", `{"logs":{"max_size_bytes":1}}`, 400, []string{"logs.max_size_bytes", "1"}},
		{"a thousand log files", "POST", "/sandboxes", `{"logs":{"max_files":1000}}`, 400, []string{"logs.max_files", "1000"}},
		{"an init with a timeout", "POST", "/sandboxes", `{"init":{"command":"sh","timeout_ms":5}}`, 400, nil},
		{"an init with no command", "POST", "/sandboxes", `{"init":{"command":""}}`, 400, nil},
		{"a hostname with a space", "POST", "/sandboxes", `{"hostname":"a b"}`, 400, nil},
		{"a name not a DNS label", "POST", "/sandboxes", `{"name":"A_B"}`, 400, nil},
		{"a runtime not known", "POST", "/sandboxes", `{"runtime":"vm"}`, 400, nil},
		{"an on_oom not known", "POST", "/sandboxes", `{"on_oom":"restart"}`, 400, []string{"on_oom", "restart", "end_sandbox", "kill_process"}},
		{"a gvisor sandbox that would lose one process", "POST", "/sandboxes", `{"runtime":"gvisor","on_oom":"kill_process"}`, 400, []string{"on_oom", "kill_process", "end_sandbox"}},
		{"an unknown field", "POST", "/sandboxes", `{"limits":{"cpu":1}}`, 400, nil},
		{"a rootfs not there", "POST", "/sandboxes", `{"rootfs":"missing"}`, 404, nil},
		{"a rootfs outside the images", "POST", "/sandboxes", `{"rootfs":"/etc"}`, 400, nil},
		{"a rootfs up and out", "POST", "/sandboxes", `{"rootfs":"` + strings.Repeat("../", 32) + `etc"}`, 400, nil},
		{"an image not there", "POST", "/sandboxes", `{"image":"missing:latest"}`, 404, nil},
		{"an image and a rootfs", "POST", "/sandboxes", `{"image":"busybox","rootfs":"x"}`, 400, nil},
		{"a limit out of range, before its image is looked for", "POST", "/sandboxes", `{"image":"missing:latest","limits":{"pids":-1}}`, 400, []string{"limits.pids", "-1"}},
		{"an init with no command, and an image not there", "POST", "/sandboxes", `{"image":"missing:latest","init":{"args":["x"]}}`, 404, nil},
		{"an egress not known", "POST", "/sandboxes", `{"network":{"egress":"some"}}`, 400, nil},
		{"an egress range not a range", "POST", "/sandboxes", `{"network":{"allow":["300.0.0.0/8"]}}`, 400, nil},
		{"a body not JSON", "POST", "/sandboxes", `{"limits":`, 400, nil},
		{"a body past its bound", "POST", "/sandboxes", `{"hostname":"` + strings.Repeat("x", api.MaxBody) + `"}`, 413, nil},

		// A finite exec's fields.
		{"timeout_ms that overflows", "POST", sb + "/exec", `{"command":"true","timeout_ms":9223372036855}`, 400, []string{"timeout_ms", "9223372036855", fmt.Sprint(api.MaxTimeoutMS)}},
		{"timeout_ms past int64", "POST", sb + "/exec", `{"command":"true","timeout_ms":9223372036854775808}`, 400, nil},
		{"timeout_ms negative", "POST", sb + "/exec", `{"command":"true","timeout_ms":-1}`, 400, []string{"timeout_ms", "-1"}},
		{"max_output_bytes past its ceiling", "POST", sb + "/exec", `{"command":"true","max_output_bytes":2097152}`, 400, []string{"max_output_bytes", "2097152", "1048576"}},
		{"drain_ms past its ceiling", "POST", sb + "/exec", `{"command":"true","drain_ms":60001}`, 400, []string{"drain_ms", "60001", "60000"}},
		{"a terminal of no size", "POST", sb + "/exec", `{"command":"true","tty":{"cols":0,"rows":0}}`, 400, nil},
		{"a terminal too large", "POST", sb + "/exec", `{"command":"true","tty":{"cols":65535,"rows":10}}`, 400, nil},
		{"a working directory not there", "POST", sb + "/exec", `{"command":"true","cwd":"/nonexistent/dir"}`, 404, nil},
		{"a command not there", "POST", sb + "/exec", `{"command":"/nonexistent/cmd"}`, 400, nil},
		{"a finite exec's stdin", "POST", sb + "/exec", `{"command":"true","stdin":"pipe"}`, 400, nil},
		{"an environment name with =", "POST", sb + "/exec", `{"command":"true","env":{"A=B":"c"}}`, 400, nil},
		{"a user not there", "POST", sb + "/exec", `{"command":"true","user":"nobody-at-all"}`, 400, nil},
		{"a NUL in an argument", "POST", sb + "/exec", `{"command":"echo","args":["a\u0000b"]}`, 400, nil},
		{"no command", "POST", sb + "/exec", `{"command":""}`, 400, nil},
		{"a working directory that is a file", "POST", sb + "/exec", `{"command":"true","cwd":"/etc/passwd"}`, 400, nil},

		// A detached process's fields, and calls on one.
		{"a detached process's timeout", "POST", sb + "/exec-stream", `{"command":"true","timeout_ms":5}`, 400, nil},
		{"a flow not known", "POST", sb + "/exec-stream", `{"command":"true","flow":"fast"}`, 400, nil},
		{"a signal not known", "POST", proc + "/signal", `{"signal":"NOPE"}`, 400, nil},
		{"a signal number too high", "POST", proc + "/signal", `{"signal":"4096"}`, 400, nil},
		{"a process not there", "GET", sb + "/exec-stream/nope", nil, 404, nil},
		{"a resize of no terminal", "POST", proc + "/resize", `{"cols":80,"rows":24}`, 400, nil},
		{"stdin of a process without it", "POST", proc + "/stdin?offset=0", "data", 400, nil},

		// Files and archives.
		{"a file not there", "GET", sb + "/files/nonexistent/file", nil, 404, nil},
		{"an archive of a path not there", "GET", sb + "/archive?path=/nonexistent", nil, 404, nil},
		{"an archive into a directory not there", "PUT", sb + "/archive?path=/nonexistent/dir", refusalsTar(t), 404, nil},
		{"a directory of a bad mode", "POST", sb + "/files/workspace/d?op=mkdir&mode=99999", nil, 400, nil},

		// Images.
		{"an import that is no tar", "POST", "/images/import", "not a tar", 400, nil},
		{"an import on a full store", "POST", "/images/import", strings.Repeat("x", 2<<20), 507, nil},
		{"an image not there", "GET", "/images/missing", nil, 404, nil},
		{"a pull of no reference", "POST", "/images/pull", `{"ref":"::"}`, 400, nil},

		// Sandboxes.
		{"a sandbox not there", "GET", "/sandboxes/missing", nil, 404, nil},
		{"a sandbox id not there", "GET", "/sandboxes/01a22779-5cfd-7451-9354-2e19949d5c7f", nil, 404, nil},
		{"a sandbox not there, its processes", "GET", "/sandboxes/nope/exec-stream", nil, 404, nil},
		{"a route not there", "GET", "/nothing", nil, 404, nil},
		{"a delete's remove_logs not a boolean", "DELETE", sb + "?remove_logs=maybe", nil, 400, nil},
		{"a preview of port 0", "POST", sb + "/previews", `{"port":0}`, 400, nil},
		{"a preview of port 70000", "POST", sb + "/previews", `{"port":70000}`, 400, nil},
		{"a preview kept past its bound", "POST", sb + "/previews", `{"port":80,"ttl_seconds":99999999999}`, 400, nil},
	}
	if disks {
		rows = append(rows,
			row{"a disk the state directory cannot hold", "POST", "/sandboxes", fmt.Sprintf(`{"limits":{"disk_bytes":%d}}`, int64(api.MaxDiskBytes)), 507, []string{"limits.disk_bytes"}},
			row{"a file past the sandbox's disk", "PUT", sb + "/files/workspace/big", strings.Repeat("x", 2*api.MinDiskBytes), 507, nil},
			row{"an archive past the sandbox's disk", "PUT", sb + "/archive?path=/workspace", refusalsTar(t, bytes.Repeat([]byte("x"), 2*api.MinDiskBytes)), 507, nil},
		)
	}
	tok := k.d.Token()
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			code, body := k.do(r.method, r.path, tok, r.body)
			var e api.Error
			if code != r.want || json.Unmarshal(body, &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("%s %s: %d %s, want %d with an error body", r.method, r.path, code, clip(body), r.want)
			}
			for _, word := range r.says {
				if !strings.Contains(e.Error.Message, word) {
					t.Errorf("message %q does not say %q", e.Error.Message, word)
				}
			}
			for _, host := range []string{k.state, "/sys/fs/cgroup", "/proc/"} {
				if bytes.Contains(body, []byte(host)) {
					t.Errorf("the answer names %q: %s", host, clip(body))
				}
			}
		})
	}
	// Nothing was made: the one sandbox is still alone, and serves.
	var list []api.Sandbox
	k.json("GET", "/sandboxes", nil, &list)
	if len(list) != 1 || list[0].ID != info.ID || list[0].State != api.SandboxRunning {
		t.Errorf("sandboxes after the refusals: %+v", list)
	}
	var res api.ExecResult
	k.json("POST", sb+"/exec", api.ExecRequest{Command: "echo", Args: []string{"fine"}}, &res)
	if res.Stdout != "fine\n" {
		t.Errorf("exec after the refusals: %+v", res)
	}
}

// refusalsTar is a tar of one file, a.txt, of content (a line if none).
func refusalsTar(t *testing.T, content ...[]byte) string {
	t.Helper()
	b := []byte("a line\n")
	if len(content) > 0 {
		b = content[0]
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(b)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}
