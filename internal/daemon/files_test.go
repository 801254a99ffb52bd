package daemon_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// raw sends a request line as written (no client cleans its path) and
// returns the status code and body.
func (k *kilnd) raw(method, target string, body []byte) (int, string) {
	k.t.Helper()
	c, err := net.Dial("tcp", k.addr)
	if err != nil {
		k.t.Fatal(err)
	}
	defer c.Close()
	req := method + " " + target + " HTTP/1.1\r\nHost: " + k.addr + "\r\nAuthorization: Bearer " + k.d.Token() +
		"\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body)
	if _, err := io.WriteString(c, req); err != nil {
		k.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestFilesHostile: the files routes act with the sandbox's root's
// privileges, whatever the sandbox has laid in their way: links into the
// agent's /proc entries and the kernel's settings lead nowhere, a path
// that climbs is refused before it reaches anything, and a file past the
// disk quota is refused with the space it had.
func TestFilesHostile(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c",
		"cd /workspace && ln -s /proc/1/environ env && ln -s /proc/1/fd/4 fd && ln -s /proc/1/root agentroot && " +
			"ln -s /proc/sys/kernel/hostname sysctl && ln -s / top && hostname"}}, &res)
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("setting up: %+v", res)
	}
	hostname := res.Stdout
	for _, tc := range []struct {
		name, method, path string
		want               int
	}{
		{"the agent's environment", "GET", "/files/workspace/env", http.StatusForbidden},
		{"the agent's descriptor of the capture directory", "GET", "/files/workspace/fd", http.StatusForbidden},
		{"the agent's root", "GET", "/files/workspace/agentroot/etc/passwd", http.StatusForbidden},
		{"a kernel setting, through a link", "PUT", "/files/workspace/sysctl", http.StatusPreconditionFailed},
		{"a kernel setting", "PUT", "/files/proc/sys/kernel/hostname", http.StatusForbidden},
		{"a path that climbs", "GET", "/files/workspace/../etc/passwd", http.StatusBadRequest},
		{"a climb escaped", "GET", "/files/workspace/%2e%2e/etc/passwd", http.StatusBadRequest},
		{"the read-only /usr", "PUT", "/files/usr/bin/planted", http.StatusForbidden},
		// The sandbox's root may open it; the agent, host root, does not
		// read a kernel file's descriptor for it.
		{"a /proc file of the sandbox's own", "GET", "/files/proc/self/status", http.StatusForbidden},
		{"a cgroup file", "GET", "/files/proc/self/cgroup", http.StatusForbidden},
	} {
		code, body := k.raw(tc.method, "/sandboxes/"+sb+tc.path, []byte("c"))
		if code != tc.want {
			t.Errorf("%s (%s %s): %d %s, want %d", tc.name, tc.method, tc.path, code, body, tc.want)
		}
	}
	// A link to / is the sandbox's root: its own hostname.
	if code, body := k.raw("GET", "/sandboxes/"+sb+"/files/workspace/top/etc/hostname", nil); code != 200 || body != hostname {
		t.Errorf("through a link to /: %d %q, want the sandbox's hostname %q", code, body, hostname)
	}
	if _, err := os.Stat("/planted"); err == nil {
		t.Error("a file landed on the host")
	}
	// kilnd served that GET with the file the agent handed over, and a
	// range of it too.
	req, _ := http.NewRequest("GET", "http://"+k.addr+"/sandboxes/"+sb+"/files/etc/hostname", nil)
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	req.Header.Set("Range", "bytes=1-3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || string(b) != hostname[1:4] {
		t.Errorf("a range of a file: %d %q, want 206 %q", resp.StatusCode, b, hostname[1:4])
	}
	code, metrics := k.do("GET", "/metrics", k.d.Token(), nil)
	if code != 200 || !regexp.MustCompile(`kilnd_file_transfers_total\{how="handover",method="GET"\} [1-9]`).Match(metrics) {
		t.Errorf("no GET handed over: %s", grepLines(metrics, "kilnd_file_transfers"))
	}
}

// TestFilesQuota: a file past the sandbox's disk quota is refused as no
// space (507), saying how much of the body came, in the API's words; the
// file it was to replace is as it was, no temporary file stays, and the
// host's disk holds no more than the quota.
func TestFilesQuota(t *testing.T) {
	if err := sandbox.DisksAvailable(); err != nil {
		t.Skip(err)
	}
	k := start(t, "")
	defer k.cleanup()
	var sb api.Sandbox
	k.json("POST", "/sandboxes", api.CreateSandbox{Limits: api.LimitsRequest{DiskBytes: new(int64(64 << 20))}}, &sb)
	if code, body := k.raw("PUT", "/sandboxes/"+sb.ID+"/files/workspace/big", []byte("old")); code != 200 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	req, _ := http.NewRequest("PUT", "http://"+k.addr+"/sandboxes/"+sb.ID+"/files/workspace/big", io.LimitReader(zeroReader{}, 128<<20))
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(b), "the sandbox's disk is full (its quota) after ") ||
		strings.Contains(string(b), "no space left on device") {
		t.Errorf("128 MiB on a 64 MiB disk: %d %s", resp.StatusCode, b)
	}
	if code, body := k.raw("GET", "/sandboxes/"+sb.ID+"/files/workspace/big", nil); code != 200 || body != "old" {
		t.Errorf("the file after: %d %.20q", code, body)
	}
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+sb.ID+"/exec", api.ExecRequest{Command: "ls", Args: []string{"-A", "/workspace"}}, &res)
	if res.Stdout != "big\n" {
		t.Errorf("left in /workspace: %q", res.Stdout)
	}
	used, _ := k.diskUsage()
	if used > 64<<20+32<<20 {
		t.Errorf("the disks hold %d bytes on the host", used)
	}
}

// TestFilesAfterRestart: a restarted kilnd serves the files of the
// sandboxes it adopted.
func TestFilesAfterRestart(t *testing.T) {
	k := start(t, "")
	sb := k.sandbox()
	if code, body := k.raw("PUT", "/sandboxes/"+sb+"/files/workspace/kept.txt", []byte("before the restart")); code != 200 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	k.stop()
	k2 := start(t, k.state)
	defer k2.cleanup()
	if code, body := k2.raw("GET", "/sandboxes/"+sb+"/files/workspace/kept.txt", nil); code != 200 || body != "before the restart" {
		t.Errorf("after the restart: %d %q", code, body)
	}
	if code, body := k2.raw("GET", "/sandboxes/"+sb+"/archive?path=/workspace", nil); code != 200 || !strings.Contains(body, "workspace/kept.txt") {
		t.Errorf("archive after the restart: %d %.200q", code, body)
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// TestPortsAfterRestart: a restarted kilnd proxies the ports of the
// sandboxes it adopted, and their preview URLs still work (kilnd kept
// their hashes).
func TestPortsAfterRestart(t *testing.T) {
	k := start(t, "")
	sb := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "python3", Args: []string{"-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/etc"}}, &st)
	ready := func(k *kilnd) int {
		deadline := time.Now().Add(15 * time.Second)
		for {
			code, _ := k.raw("GET", "/sandboxes/"+sb+"/ports/8000/hostname", nil)
			if code != http.StatusBadGateway || time.Now().After(deadline) {
				return code
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if code := ready(k); code != 200 {
		t.Fatalf("the server: %d", code)
	}
	var pv api.Preview
	k.json("POST", "/sandboxes/"+sb+"/previews", api.CreatePreview{Port: 8000}, &pv)
	k.stop()
	k2 := start(t, k.state)
	defer k2.cleanup()
	if code := ready(k2); code != 200 {
		t.Errorf("after the restart, the port: %d", code)
	}
	// The URL names the old listener's port: the same path on the new one.
	u := "http://" + k2.addr + strings.TrimPrefix(pv.URL, "http://"+k.addr) + "hostname"
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(b) == 0 {
		t.Errorf("the preview after the restart: %d %q", resp.StatusCode, b)
	}
}
