package daemon_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	// The URL names the old listener's port: the same host and path with
	// the new one's.
	_, oldPort, _ := net.SplitHostPort(k.addr)
	_, newPort, _ := net.SplitHostPort(k2.addr)
	u := strings.Replace(pv.URL, ".localhost:"+oldPort+"/", ".localhost:"+newPort+"/", 1) + "hostname"
	if r := fetch(t, atLoopback(t, k2.addr), "GET", u, ""); r.code != 200 || r.body == "" {
		t.Errorf("the preview after the restart: %d %q", r.code, r.body)
	}
}

// rawPut starts a PUT of target that announces length bytes of body and
// sends part of it, and returns the connection, to cut or to read the
// answer from.
func (k *kilnd) rawPut(t *testing.T, target string, length int, part []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", k.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := "PUT " + target + " HTTP/1.1\r\nHost: " + k.addr + "\r\nAuthorization: Bearer " + k.d.Token() +
		"\r\nContent-Length: " + strconv.Itoa(length) + "\r\n\r\n"
	if _, err := c.Write(append([]byte(head), part...)); err != nil {
		t.Fatal(err)
	}
	return c
}

// sandboxOf creates a sandbox of runtime; a test of gVisor's is skipped
// where there is none, outside CI.
func (k *kilnd) sandboxOf(t *testing.T, runtime string) string {
	t.Helper()
	code, b := k.do("POST", "/sandboxes", k.d.Token(), `{"runtime":"`+runtime+`"}`)
	if code == http.StatusServiceUnavailable && runtime == sandbox.RuntimeGVisor && os.Getenv("CI") == "" {
		t.Skipf("no gVisor here: %s", b)
	}
	var info daemon.Info
	if code/100 != 2 || json.Unmarshal(b, &info) != nil {
		t.Fatalf("create: %d %s", code, b)
	}
	return info.ID
}

// runtimes are the sandboxes' runtimes, for table tests.
var runtimes = []string{sandbox.RuntimeNamespaces, sandbox.RuntimeGVisor}

// watchFiles watches dir in sandbox sb through the files API, as a user
// would: the events come on the channel until the test ends.
func (k *kilnd) watchFiles(t *testing.T, sb, dir string) <-chan api.FileEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+sb+"/files"+dir+"?watch=true",
		&websocket.DialOptions{Subprotocols: []string{api.ProtocolWatch, api.TokenProtocolPrefix + k.d.Token()}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var hello api.WatchHello
	if _, b, err := c.Read(ctx); err != nil || json.Unmarshal(b, &hello) != nil || hello.Type != "hello" {
		c.CloseNow()
		cancel()
		t.Fatalf("the watch's hello: %v", err)
	}
	ch := make(chan api.FileEvent, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			var e api.FileEvent
			if json.Unmarshal(b, &e) == nil {
				select {
				case ch <- e:
				default: // the test stopped listening
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		c.CloseNow()
		<-done
	})
	return ch
}

// awaitEvent waits for a watch's event of op on a path that matches, and
// returns the path.
func awaitEvent(t *testing.T, events <-chan api.FileEvent, op string, match func(string) bool) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("the watch ended before a %s event", op)
			}
			if e.Op == op && match(e.Path) {
				return e.Path
			}
		case <-timeout:
			t.Fatalf("no %s event in 30 s", op)
		}
	}
}

// TestFilesUploadInterrupted: through kilnd, as a user calls it, an
// upload cut half way (its socket closed) and one that stops coming
// until kilnd's read timeout leave the file as it was and no temporary
// file; the stalled one is answered 400. In a sandbox of each runtime:
// kilnd writes the body into the file the agent hands over, or for
// gVisor's the agent writes it, kilnd proxying.
func TestFilesUploadInterrupted(t *testing.T) {
	t.Parallel()
	k := startConfig(t, daemon.Config{ReadTimeout: 3 * time.Second})
	t.Cleanup(k.cleanup) // after the subtests, which run side by side
	for _, runtime := range runtimes {
		t.Run(runtime, func(t *testing.T) {
			t.Parallel()
			k := *k
			k.t = t
			sb := k.sandboxOf(t, runtime)
			route := "/sandboxes/" + sb + "/files/workspace/file"
			if code, body := k.raw("PUT", route, []byte("old")); code != 200 {
				t.Fatalf("PUT: %d %s", code, body)
			}
			events := k.watchFiles(t, sb, "/workspace")
			isTemp := func(p string) bool { return strings.HasPrefix(p, "/workspace/.kiln-put-") }
			unchanged := func(when string) {
				t.Helper()
				if code, body := k.raw("GET", route, nil); code != 200 || body != "old" {
					t.Errorf("%s: the file: %d %.20q", when, code, body)
				}
				var res api.ExecResult
				k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "ls", Args: []string{"-A", "/workspace"}}, &res)
				if res.Stdout != "file\n" {
					t.Errorf("%s: /workspace holds %q", when, res.Stdout)
				}
			}
			half := bytes.Repeat([]byte("x"), 512<<10)
			// awaitGone waits until the temporary file p is no longer
			// there, as the sandbox's own ls sees it (bounded): what a
			// user would find. gVisor's file events now and then miss a
			// removal, so the watch is not what says it went.
			awaitGone := func(p string) {
				t.Helper()
				for deadline := time.Now().Add(30 * time.Second); ; {
					var res api.ExecResult
					k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "ls", Args: []string{"-A", "/workspace"}}, &res)
					if !strings.Contains(res.Stdout, path.Base(p)) {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s still there after 30 s: /workspace holds %q", p, res.Stdout)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}

			c := k.rawPut(t, route, 1<<20, half)
			temp := awaitEvent(t, events, api.FileCreated, isTemp)
			awaitEvent(t, events, api.FileWritten, func(p string) bool { return p == temp })
			c.Close()
			awaitGone(temp)
			unchanged("cut half way")

			c = k.rawPut(t, route, 1<<20, half)
			temp = awaitEvent(t, events, api.FileCreated, isTemp)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "the body broke off after") ||
				!strings.Contains(string(body), "it stopped coming") {
				t.Errorf("stalled: %d %s", resp.StatusCode, body)
			}
			awaitGone(temp)
			unchanged("stalled")
		})
	}
}

// gnuSparse is an archive of one GNU sparse file (type 'S'): Go's writer
// writes the type and no sparse map, so the map (512 bytes of data at
// 4 KiB) and the real size (8 KiB) go into the header after it, as GNU
// tar lays them out, and its checksum is made again.
func gnuSparse(t *testing.T, name string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeGNUSparse, Mode: 0o644, Size: 512, Format: tar.FormatGNU}); err != nil {
		t.Fatal(err)
	}
	tw.Write(bytes.Repeat([]byte("d"), 512))
	tw.Close()
	blk := b.Bytes()[:512]
	octal := func(off, size int, v int64) { copy(blk[off:off+size], fmt.Sprintf("%0*o\x00", size-1, v)) }
	octal(386, 12, 4096) // sparse[0].offset
	octal(398, 12, 512)  // sparse[0].numbytes
	octal(483, 12, 8192) // realsize
	copy(blk[148:156], "        ")
	sum := 0
	for _, c := range blk {
		sum += int(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
	if h, err := tar.NewReader(bytes.NewReader(b.Bytes())).Next(); err != nil || h.Typeflag != tar.TypeGNUSparse || h.Size != 8192 {
		t.Fatalf("the sparse archive reads as %+v, %v", h, err)
	}
	return b.Bytes()
}

// tarOf writes hs with archive/tar, a regular file's content its body.
func tarOf(t *testing.T, hs []tar.Header, bodies map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hs {
		if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeCont {
			h.Size = int64(len(bodies[h.Name]))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, bodies[h.Name])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestFilesArchiveAtomic: through kilnd, a tar's files, directories and
// links go into a sandbox with their modes and times and come back out
// the same; a tar holding a GNU sparse file and then a FIFO, or a
// contiguous file, or a symbolic link that leads out, is refused whole,
// naming the member, and nothing of it is written.
func TestFilesArchiveAtomic(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	t.Cleanup(k.cleanup) // after the subtests, which run side by side
	for _, runtime := range runtimes {
		t.Run(runtime, func(t *testing.T) {
			t.Parallel()
			k := *k
			k.t = t
			sb := k.sandboxOf(t, runtime)
			mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
			in := []tar.Header{
				{Name: "proj/", Typeflag: tar.TypeDir, Mode: 0o750, ModTime: mtime},
				{Name: "proj/main.go", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: mtime},
				{Name: "proj/bin/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime},
				{Name: "proj/bin/run", Typeflag: tar.TypeReg, Mode: 0o755, ModTime: mtime},
				{Name: "proj/latest", Typeflag: tar.TypeSymlink, Linkname: "main.go", ModTime: mtime},
				{Name: "proj/hard", Typeflag: tar.TypeLink, Linkname: "proj/main.go", ModTime: mtime},
			}
			bodies := map[string]string{"proj/main.go": "package main\n", "proj/bin/run": "#!/bin/sh\necho run\n"}
			extract := func(archive []byte) (int, string) {
				return k.raw("PUT", "/sandboxes/"+sb+"/archive?path=/workspace", archive)
			}
			if code, body := extract(tarOf(t, in, bodies)); code != 200 {
				t.Fatalf("extract: %d %s", code, body)
			}
			var res api.ExecResult
			k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c",
				"cd /workspace/proj && stat -c '%n %u %a %Y %h' . main.go bin bin/run && readlink latest && cat hard"}}, &res)
			want := fmt.Sprintf(". 0 750 %[1]d 3\nmain.go 0 644 %[1]d 2\nbin 0 755 %[1]d 2\nbin/run 0 755 %[1]d 1\nmain.go\npackage main\n", mtime.Unix())
			if res.Stdout != want {
				t.Errorf("inside:\n%s\nwant:\n%s", res.Stdout, want)
			}
			// And back out, as it went in (a hard link comes out as the file).
			code, out := k.raw("GET", "/sandboxes/"+sb+"/archive?path=/workspace/proj", nil)
			if code != 200 {
				t.Fatalf("archive: %d %s", code, out)
			}
			got := map[string]string{}
			tr := tar.NewReader(strings.NewReader(out))
			for {
				h, err := tr.Next()
				if err != nil {
					if err != io.EOF {
						t.Fatal(err)
					}
					break
				}
				b, _ := io.ReadAll(tr)
				d := fmt.Sprintf("%c %04o %q", h.Typeflag, h.Mode, b)
				if h.Typeflag == tar.TypeSymlink {
					d = "-> " + h.Linkname
				} else {
					d += " " + h.ModTime.UTC().Format(time.DateTime)
				}
				got[h.Name] = d
			}
			at := mtime.Format(time.DateTime)
			wantBack := map[string]string{
				"proj/":        `5 0750 "" ` + at,
				"proj/main.go": `0 0644 "package main\n" ` + at,
				"proj/bin/":    `5 0755 "" ` + at,
				"proj/bin/run": `0 0755 "#!/bin/sh\necho run\n" ` + at,
				"proj/latest":  "-> main.go",
				"proj/hard":    `0 0644 "package main\n" ` + at,
			}
			if diff := cmp.Diff(wantBack, got); diff != "" {
				t.Errorf("read back (-want +got):\n%s", diff)
			}

			snapshot := func() string {
				var res api.ExecResult
				k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c",
					"find /workspace -mindepth 1 -printf '%p %y %m %s %T@\\n' | sort"}}, &res)
				return res.Stdout
			}
			before := snapshot()
			fifo := tarOf(t, []tar.Header{{Name: "proj/pipe", Typeflag: tar.TypeFifo, Mode: 0o644}}, nil)
			newFiles := tarOf(t, []tar.Header{
				{Name: "proj/main.go", Typeflag: tar.TypeReg, Mode: 0o644},
				{Name: "new/", Typeflag: tar.TypeDir, Mode: 0o755},
				{Name: "new/a.txt", Typeflag: tar.TypeReg, Mode: 0o644},
			}, map[string]string{"proj/main.go": "replaced", "new/a.txt": "new"})
			// The archives' members, joined: each archive's end mark but the
			// last's left out.
			cat := func(archives ...[]byte) []byte {
				var b []byte
				for i, a := range archives {
					if i < len(archives)-1 {
						a = a[:len(a)-1024]
					}
					b = append(b, a...)
				}
				return b
			}
			for _, tc := range []struct {
				name    string
				archive []byte
				want    int
				says    string
			}{
				{"a GNU sparse file, then a FIFO", cat(newFiles, gnuSparse(t, "new/disk.img"), fifo), 400,
					`archive member "new/disk.img" is a sparse file (GNU's type 'S')`},
				{"a FIFO", cat(newFiles, fifo), 400, `archive member "proj/pipe" is a FIFO (type '6')`},
				{"a contiguous file", cat(newFiles, tarOf(t, []tar.Header{{Name: "new/cont", Typeflag: tar.TypeCont, Mode: 0o644}}, map[string]string{"new/cont": "c"})), 400,
					`archive member "new/cont" is a contiguous file (type '7')`},
				{"a link that leads out", cat(newFiles, tarOf(t, []tar.Header{{Name: "new/etc", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}}, nil)), 403,
					`archive member "new/etc": a link to "../../etc" leads out of /workspace`},
			} {
				code, body := extract(tc.archive)
				var e api.Error
				json.Unmarshal([]byte(body), &e)
				if code != tc.want || !strings.Contains(e.Error.Message, tc.says) {
					t.Errorf("%s: %d %s, want %d saying %q", tc.name, code, body, tc.want, tc.says)
				}
				if after := snapshot(); after != before {
					t.Errorf("%s: /workspace changed:\n%s\nwas:\n%s", tc.name, after, before)
				}
			}
		})
	}
}
