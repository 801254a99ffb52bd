package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Faults through kilnd's API, beside those of daemon_test.go (kilnd or an
// agent killed) and of the packages below (capture, process, sandbox).
// Every wait is on an event kilnd or the kernel reports, bounded by
// faultDeadline. The workloads write apitest.Line's pattern, so that a
// watcher checks every byte it is given against where it says it belongs.

const faultDeadline = 2 * time.Minute

// faultMount mounts a tmpfs of size bytes at dir, unmounted when the test
// ends, whatever way it ends.
func faultMount(t *testing.T, dir string, size int) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// faultSandboxes is kilnd's directory of sandboxes. A sandbox's agent opens
// its capture directory (logs/ in there) when the sandbox is made and keeps
// that descriptor: a mount over the capture directory itself, made later,
// would not be seen. A file system meant to hold a sandbox's captured logs
// is mounted here before the sandbox is made.
func (k *kilnd) faultSandboxes() string { return filepath.Join(k.state, "sandboxes") }

// faultStart starts an exec-stream.
func (k *kilnd) faultStart(sb string, req api.ExecRequest) string {
	k.t.Helper()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", req, &st)
	return st.ID
}

// faultWait waits, bounded, for a process's exit.
func (k *kilnd) faultWait(sb, pid string) api.Exit {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+k.addr+"/sandboxes/"+sb+"/exec-stream/"+pid+"/wait", nil)
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatalf("wait for %s: %v", pid, err)
	}
	defer resp.Body.Close()
	var e api.Exit
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || json.Unmarshal(b, &e) != nil {
		k.t.Fatalf("wait for %s: %d %s", pid, resp.StatusCode, b)
	}
	return e
}

func (k *kilnd) faultStatus(sb, pid string) api.Process {
	k.t.Helper()
	var p api.Process
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+pid, nil, &p)
	return p
}

// faultAlive checks that kilnd answers and that sandbox sb runs a finite
// exec with the right output.
func (k *kilnd) faultAlive(sb string) {
	k.t.Helper()
	if code, b := k.do("GET", "/healthz", "", nil); code != 200 {
		k.t.Errorf("kilnd health: %d %s", code, b)
	}
	var info api.Sandbox
	k.json("GET", "/sandboxes/"+sb, nil, &info)
	if info.State != api.SandboxRunning {
		k.t.Errorf("sandbox %s is %s: %s", sb, info.State, info.Reason)
	}
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "echo", Args: []string{"fine"}}, &res)
	if res.Stdout != "fine\n" || res.ExitCode == nil || *res.ExitCode != 0 {
		k.t.Errorf("exec in sandbox %s: %+v", sb, res)
	}
}

// faultCapturedLog reads a captured log through the API: the body, and the
// runs of its Kiln-Runs trailer.
func (k *kilnd) faultCapturedLog(sb, pid, query string) (int, []byte, []api.Run) {
	k.t.Helper()
	req, _ := http.NewRequest("GET", "http://"+k.addr+"/sandboxes/"+sb+"/logs/"+pid+query, nil)
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		k.t.Fatalf("read the log of %s: %v", pid, err)
	}
	var runs []api.Run
	if rj := resp.Trailer.Get("Kiln-Runs"); rj != "" {
		if err := json.Unmarshal([]byte(rj), &runs); err != nil {
			k.t.Fatalf("Kiln-Runs %q: %v", rj, err)
		}
	}
	return resp.StatusCode, body, runs
}

// faultDial opens a kiln.v1 watcher of a process, from the offsets in query.
func (k *kilnd) faultDial(ctx context.Context, sb, pid, query string) *websocket.Conn {
	k.t.Helper()
	c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+sb+"/exec-stream/"+pid+"/logs"+query,
		&websocket.DialOptions{Subprotocols: []string{api.ProtocolV1, api.TokenProtocolPrefix + k.d.Token()}})
	if err != nil {
		k.t.Fatalf("watch %s: %v", pid, err)
	}
	c.SetReadLimit(-1)
	return c
}

// TestCaptureDirectoryFull: the file system holding a sandbox's captured
// logs fills up under a captured exec-stream. The workload runs to its
// end with its own exit code; the log reads back lossy, and its dropped
// count is exactly what was written and not kept; the sandbox and kilnd
// go on.
func TestCaptureDirectoryFull(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	faultMount(t, k.faultSandboxes(), 2<<20)
	defer k.cleanup()
	sb := k.sandbox()
	const written = 8 << 20
	pid := k.faultStart(sb, api.ExecRequest{Command: "sh", Args: []string{"-c", apitest.Line.Shell(written) + "; exit 7"}, Capture: true})
	if e := k.faultWait(sb, pid); e.ExitCode == nil || *e.ExitCode != 7 {
		t.Fatalf("exit %+v, want code 7", e)
	}
	// The exit is observed before the drain: the output is all in once
	// the capture has ended.
	k.faultCaptureEnded(sb, pid)
	code, persisted, runs := k.faultCapturedLog(sb, pid, "?stream=stdout&source=log")
	if code != 200 || len(runs) != 1 {
		t.Fatalf("GET logs: %d, runs %+v", code, runs)
	}
	dropped := runs[0].Dropped["stdout"]
	t.Logf("written %d, persisted %d, dropped %d (stderr %d)", written, len(persisted), dropped, runs[0].Dropped["stderr"])
	if len(persisted) == 0 || len(persisted) >= written {
		t.Fatalf("persisted %d of %d bytes: the file system did not fill", len(persisted), written)
	}
	if runs[0].State != "lossy" || dropped != int64(written-len(persisted)) || runs[0].Dropped["stderr"] != 0 {
		t.Errorf("run %+v: want lossy with stdout %d dropped (written %d - persisted %d)", runs[0], written-len(persisted), written, len(persisted))
	}
	// Read as the output, it has what the ring still held beside the log:
	// more than the log alone, the pattern at every offset, and what
	// neither held is no more than what the log dropped.
	if code, best, _ := k.faultCapturedLog(sb, pid, "?stream=stdout"); code != 200 || len(best) <= len(persisted) || len(best) > written {
		t.Errorf("the output read from the log and the ring: %d, %d bytes (the log alone has %d)", code, len(best), len(persisted))
	}
	// The process's status says the same.
	if st := k.faultStatus(sb, pid).Streams["stdout"]; st.TotalBytes != written || !st.Ended || st.CaptureDropped != dropped {
		t.Errorf("stdout %+v, want %d bytes, ended, %d dropped from the capture", st, written, dropped)
	}
	// A record the full disk cut short stays the last line of its file,
	// torn: the writer goes on in a new file, never writing over it.
	var list []api.CapturedLog
	k.json("GET", "/sandboxes/"+sb+"/logs", nil, &list)
	if len(list) != 1 || list[0].Process != pid || list[0].Complete || len(list[0].Runs) != 1 || list[0].Runs[0].State != "lossy" ||
		list[0].Stats.Corrupt != 0 || list[0].Stats.Torn > 1 {
		t.Errorf("captured logs %+v", list)
	}
	k.faultAlive(sb)
	// A watcher after the run is told of its output and exit.
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	c := k.faultDial(ctx, sb, pid, "")
	defer c.CloseNow()
	w := &apitest.Checker{Check: apitest.Line.Check}
	if err := w.Read(ctx, c); err != nil {
		t.Errorf("a watcher after the run: %v", err)
	} else if out := w.Stream("stdout"); out.Delivered+out.Lost != written || w.Exit.ExitCode == nil || *w.Exit.ExitCode != 7 {
		t.Errorf("a watcher after the run: %d bytes + %d lost, exit %v", out.Delivered, out.Lost, w.Exit)
	}
}

// faultCaptureEnded waits until process pid's captured log has its end
// record: the exit is observed before the drain ends the capture.
func (k *kilnd) faultCaptureEnded(sb, pid string) {
	k.t.Helper()
	faultAwait(k.t, "the end of the capture of "+pid, func() bool {
		var list []api.CapturedLog
		k.json("GET", "/sandboxes/"+sb+"/logs", nil, &list)
		for _, l := range list {
			if l.Process == pid && len(l.Runs) == 1 && l.Runs[0].State != "interrupted" {
				return true
			}
		}
		return false
	})
}

// faultRefused checks that a captured exec-stream in sb is refused with a
// JSON error naming the capture, and that nothing of it ran; it returns
// the status.
func (k *kilnd) faultRefused(sb string) int {
	k.t.Helper()
	req := api.ExecRequest{Command: "sh", Args: []string{"-c", "echo ran > /tmp/ran; echo out"}, Capture: true}
	code, b := k.do("POST", "/sandboxes/"+sb+"/exec-stream", k.d.Token(), req)
	var e api.Error
	if code < 400 || json.Unmarshal(b, &e) != nil || e.Error.Code == "" || !strings.Contains(e.Error.Message, "capture") {
		k.t.Errorf("captured exec-stream: %d %s, want a JSON error about the capture", code, b)
	}
	k.t.Logf("refused: %d %s", code, bytes.TrimSpace(b))
	var ps []api.Process
	k.json("GET", "/sandboxes/"+sb+"/exec-stream", nil, &ps)
	if len(ps) != 0 {
		k.t.Errorf("processes after a refused start: %+v", ps)
	}
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c", "test -e /tmp/ran && echo ran || echo absent"}}, &res)
	if res.Stdout != "absent\n" {
		k.t.Errorf("the refused process ran: %q", res.Stdout)
	}
	return code
}

// faultImmutable is FS_IMMUTABLE_FL of linux/fs.h.
const faultImmutable = 0x10

// faultSetImmutable sets or clears the immutable attribute of dir.
func faultSetImmutable(dir string, on bool) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	if on {
		flags |= faultImmutable
	} else {
		flags &^= faultImmutable
	}
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags))
}

// TestCaptureDirectoryReadOnly: a sandbox's capture directory that cannot
// be written. A captured exec-stream is refused before anything runs, as
// a failure of the host, not of the request; once writable again, capture
// works. The directory is made immutable: the agent is root, which mode
// bits do not stop, and its file system cannot be remounted read-only
// while the agent holds its own log open for writing there.
func TestCaptureDirectoryReadOnly(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	logs := filepath.Join(k.faultSandboxes(), sb, sandbox.LogsName)
	if err := faultSetImmutable(logs, true); err != nil {
		t.Skipf("cannot make %s immutable: %v", logs, err)
	}
	// Writable again before kilnd deletes the sandbox, whatever happens.
	defer func() {
		if err := faultSetImmutable(logs, false); err != nil {
			t.Errorf("make %s writable again: %v", logs, err)
		}
	}()
	if code := k.faultRefused(sb); code != http.StatusServiceUnavailable {
		t.Errorf("refused with %d, want %d: the request is good, the storage is not", code, http.StatusServiceUnavailable)
	}
	if ents, _ := os.ReadDir(logs); len(ents) != 0 {
		t.Errorf("the read-only capture directory holds %v", ents)
	}
	k.faultAlive(sb)
	if err := faultSetImmutable(logs, false); err != nil {
		t.Fatal(err)
	}
	pid := k.faultStart(sb, api.ExecRequest{Command: "echo", Args: []string{"kept"}, Capture: true})
	k.faultCaptureEnded(sb, pid)
	if code, body, runs := k.faultCapturedLog(sb, pid, ""); code != 200 || string(body) != "kept\n" || len(runs) != 1 || runs[0].State != "lossless" {
		t.Errorf("capture once writable: %d %q %+v", code, body, runs)
	}
}

// TestCaptureDirectoryReplacedByLink: a sandbox's capture directory
// replaced by a symbolic link to another directory. Nothing is ever
// written or read through the link.
func TestCaptureDirectoryReplacedByLink(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	t.Cleanup(k.cleanup) // after the subtests, which run side by side
	// forged is a valid captured log in the link's target, that kilnd
	// must not serve as the sandbox's.
	forged := uuid.Must(uuid.NewV7()).String()
	target := t.TempDir()
	fd, err := capture.OpenDir(target)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := fd.Sub(forged)
	fd.Close()
	if err != nil {
		t.Fatal(err)
	}
	w, err := capture.Begin(sub, uuid.Must(uuid.NewV7()).String(), capture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Sink().Close()
	if err := w.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
	sub.Close()
	snapshot := func() []string {
		var names []string
		filepath.WalkDir(target, func(p string, d os.DirEntry, err error) error {
			fi, _ := os.Lstat(p)
			if fi != nil {
				names = append(names, fmt.Sprintf("%s %d", p, fi.Size()))
			}
			return nil
		})
		return names
	}
	before := snapshot()
	notThroughLink := func(t *testing.T, sb string) {
		t.Helper()
		if after := snapshot(); strings.Join(after, "\n") != strings.Join(before, "\n") {
			t.Errorf("the link's target changed:\n%s\nwas\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
		}
		code, b := k.do("GET", "/sandboxes/"+sb+"/logs", k.d.Token(), nil)
		if strings.Contains(string(b), forged) {
			t.Errorf("kilnd listed the link's target: %d %s", code, b)
		}
		code, b = k.do("GET", "/sandboxes/"+sb+"/logs/"+forged, k.d.Token(), nil)
		var e api.Error
		if code < 400 || json.Unmarshal(b, &e) != nil {
			t.Errorf("kilnd read the link's target: %d %s", code, b)
		}
		t.Logf("reading through the link: %d %s", code, bytes.TrimSpace(b))
	}
	t.Run("removed", func(t *testing.T) {
		t.Parallel()
		// The directory the agent holds is gone: nothing can be begun in it.
		k := *k
		k.t = t
		sb := k.sandbox()
		logs := filepath.Join(k.faultSandboxes(), sb, sandbox.LogsName)
		if err := os.RemoveAll(logs); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, logs); err != nil {
			t.Fatal(err)
		}
		if code := k.faultRefused(sb); code != http.StatusServiceUnavailable {
			t.Errorf("refused with %d, want %d: the request is good, the storage is not", code, http.StatusServiceUnavailable)
		}
		notThroughLink(t, sb)
		k.faultAlive(sb)
	})
	t.Run("moved aside", func(t *testing.T) {
		t.Parallel()
		// The agent holds the directory, not its path: capture goes on in
		// the moved directory, never through the link.
		k := *k
		k.t = t
		sb := k.sandbox()
		logs := filepath.Join(k.faultSandboxes(), sb, sandbox.LogsName)
		if err := os.Rename(logs, logs+".moved"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, logs); err != nil {
			t.Fatal(err)
		}
		pid := k.faultStart(sb, api.ExecRequest{Command: "echo", Args: []string{"kept"}, Capture: true})
		k.faultWait(sb, pid)
		// kilnd cannot read this log (the link is in the way): read it here.
		var l capture.Log
		faultAwait(t, "the end of the capture", func() bool {
			d, err := capture.OpenDir(filepath.Join(logs+".moved", pid))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if l, err = capture.ReadLog(context.Background(), d, capture.Filter{Tail: -1}); err != nil {
				t.Fatal(err)
			}
			return len(l.Runs) != 1 || l.Runs[0].State != capture.Interrupted
		})
		if len(l.Entries) != 1 || string(l.Entries[0].Payload()) != "kept\n" || len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless {
			t.Errorf("log in the moved directory: %+v, runs %+v", l.Entries, l.Runs)
		}
		// kilnd does not follow the link either: it says so.
		if code, b := k.do("GET", "/sandboxes/"+sb+"/logs/"+pid, k.d.Token(), nil); code != http.StatusServiceUnavailable ||
			!strings.Contains(string(b), "no longer a directory") {
			t.Errorf("reading the log through the link: %d %s, want 503 saying why", code, b)
		}
		notThroughLink(t, sb)
		k.faultAlive(sb)
	})
}

// TestWatcherStallsMidReplay: a watcher stops reading in the middle of its
// replay while the process writes 32 MiB more. Another watcher gets every
// byte or a gap for it, and the exit; the process is not held up; kilnd
// and the sandbox answer; the stalled watcher, reading again, is told
// exactly what it missed.
func TestWatcherStallsMidReplay(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	const first, second = 512 << 10, 32 << 20
	pid := k.faultStart(sb, api.ExecRequest{Command: "sh", Stdin: api.StdinPipe,
		Args: []string{"-c", apitest.Line.Shell(first) + "; read go; " + apitest.Line.Shell(second)}})
	faultAwait(t, "the first part written", func() bool { return k.faultStatus(sb, pid).Streams["stdout"].TotalBytes == first })
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	stalled := k.faultDial(ctx, sb, pid, "")
	defer stalled.CloseNow()
	sw := &apitest.Checker{Check: apitest.Line.Check}
	for sw.Stream("stdout").Delivered == 0 {
		if _, err := sw.Next(ctx, stalled); err != nil {
			t.Fatalf("stalled watcher, before it stalls: %v", err)
		}
	}
	stalledAt := time.Now()
	// From here on nothing reads the stalled watcher's connection.
	fast := k.faultDial(ctx, sb, pid, "")
	defer fast.CloseNow()
	fw := &apitest.Checker{Check: apitest.Line.Check}
	k.json("POST", "/sandboxes/"+sb+"/exec-stream/"+pid+"/stdin", "go\n", nil)
	if err := fw.Read(ctx, fast); err != nil {
		t.Fatalf("the other watcher: %v", err)
	}
	const total = first + second
	fo := fw.Stream("stdout")
	t.Logf("other watcher: %d bytes, %d lost in gaps", fo.Delivered, fo.Lost)
	if fo.Delivered+fo.Lost != total || !fo.Ended || fo.Total != total || fw.Exit == nil || fw.Exit.ExitCode == nil || *fw.Exit.ExitCode != 0 {
		t.Fatalf("the other watcher: %d bytes + %d lost, end %d (ended %v), exit %v; want %d and exit 0", fo.Delivered, fo.Lost, fo.Total, fo.Ended, fw.Exit, total)
	}
	// The exit came while the stalled watcher had read one frame.
	if e := k.faultWait(sb, pid); e.ExitCode == nil || *e.ExitCode != 0 {
		t.Errorf("exit %+v", e)
	}
	if st := k.faultStatus(sb, pid).Streams["stdout"]; st.TotalBytes != total {
		t.Errorf("stdout total %d, want %d", st.TotalBytes, total)
	}
	k.faultAlive(sb)
	stalledFor := time.Since(stalledAt)
	// Reading again, the stalled watcher accounts for every byte: what
	// the buffers on the way held, then a gap for what the ring evicted
	// meanwhile. (Stalled past the 30 s write timeout it would have been
	// dropped instead.)
	if err := sw.Read(ctx, stalled); err != nil {
		if stalledFor > 25*time.Second {
			t.Skipf("stalled for %v, near the write timeout: %v", stalledFor, err)
		}
		t.Fatalf("the stalled watcher, reading again after %v: %v", stalledFor, err)
	}
	so := sw.Stream("stdout")
	t.Logf("stalled watcher: %d bytes, %d lost in gaps, stalled for %v", so.Delivered, so.Lost, stalledFor.Round(time.Millisecond))
	if so.Delivered+so.Lost != total || so.Lost == 0 || sw.Exit == nil {
		t.Errorf("the stalled watcher: %d bytes + %d lost, exit %v; want %d with a gap", so.Delivered, so.Lost, sw.Exit, total)
	}
}

// faultPosts is how many POST requests kilnd has answered, from its
// metrics: a request whose client left is answered (to nobody) too.
func (k *kilnd) faultPosts() int {
	k.t.Helper()
	code, b := k.do("GET", "/metrics", k.d.Token(), nil)
	if code != 200 {
		k.t.Fatalf("metrics: %d", code)
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "kilnd_api_request_duration_seconds_count{") && strings.Contains(line, `method="POST"`) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += int(v)
		}
	}
	return n
}

// faultSendStdin sends a stdin write's request over a connection of its
// own, only the first sent bytes of its body, and returns the connection.
func (k *kilnd) faultSendStdin(sb, pid string, offset int, body []byte, sent int) net.Conn {
	k.t.Helper()
	c, err := net.Dial("tcp", k.addr)
	if err != nil {
		k.t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /sandboxes/%s/exec-stream/%s/stdin?offset=%d HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n",
		sb, pid, offset, k.addr, k.d.Token(), len(body))
	if _, err := c.Write(body[:sent]); err != nil {
		k.t.Fatal(err)
	}
	return c
}

// faultAwait polls cond until it holds, bounded.
func faultAwait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(faultDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, faultDeadline)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStdinRetryAfterDisconnect: clients that go away in the middle of a
// stdin write, or before its answer, and write again at the same offset:
// every byte reaches the process once.
func TestStdinRetryAfterDisconnect(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	pid := k.faultStart(sb, api.ExecRequest{Command: "cat", Stdin: api.StdinPipe})
	chunk := func(name string) []byte {
		var b []byte
		for i := 0; len(b) < api.MaxStdin-32; i++ {
			b = fmt.Appendf(b, "%s %05d\n", name, i)
		}
		return b
	}
	a, b, c := chunk("first"), chunk("second"), chunk("third")
	accepted := func() int64 {
		if in := k.faultStatus(sb, pid).Stdin; in != nil {
			return in.Accepted
		}
		return -1
	}
	write := func(offset int, data []byte) int64 {
		t.Helper()
		var acc api.StdinAccepted
		k.json("POST", fmt.Sprintf("/sandboxes/%s/exec-stream/%s/stdin?offset=%d", sb, pid, offset), string(data), &acc)
		return acc.Accepted
	}
	// Gone halfway through the body: nothing of it is taken.
	posts := k.faultPosts()
	k.faultSendStdin(sb, pid, 0, a, len(a)/2).Close()
	faultAwait(t, "the cut write answered", func() bool { return k.faultPosts() > posts })
	if n := accepted(); n != 0 {
		t.Fatalf("a write cut halfway: %d bytes accepted", n)
	}
	if n := write(0, a); n != int64(len(a)) {
		t.Fatalf("the retry: %d accepted, want %d", n, len(a))
	}
	// Gone right after the body: taken or not, the retry makes it once.
	posts = k.faultPosts()
	k.faultSendStdin(sb, pid, len(a), b, len(b)).Close()
	faultAwait(t, "the abandoned write answered", func() bool { return k.faultPosts() > posts })
	t.Logf("a write abandoned after its body: %d of %d bytes accepted", accepted()-int64(len(a)), len(b))
	if n := write(len(a), b); n != int64(len(a)+len(b)) {
		t.Fatalf("the retry: %d accepted, want %d", n, len(a)+len(b))
	}
	// Taken, its answer never read: the retry changes nothing.
	abandoned := k.faultSendStdin(sb, pid, len(a)+len(b), c, len(c))
	faultAwait(t, "the write taken", func() bool { return accepted() == int64(len(a)+len(b)+len(c)) })
	abandoned.Close()
	for _, r := range []struct {
		offset int
		data   []byte
	}{{len(a) + len(b), c}, {0, a}, {len(a) + len(b) - 100, slices.Concat(b[len(b)-100:], c[:100])}} {
		if n := write(r.offset, r.data); n != int64(len(a)+len(b)+len(c)) {
			t.Errorf("a retry at %d: %d accepted", r.offset, n)
		}
	}
	k.json("POST", "/sandboxes/"+sb+"/exec-stream/"+pid+"/stdin/close", nil, nil)
	if e := k.faultWait(sb, pid); e.ExitCode == nil || *e.ExitCode != 0 {
		t.Fatalf("cat: %+v", e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	conn := k.faultDial(ctx, sb, pid, "")
	defer conn.CloseNow()
	w := &apitest.Checker{Keep: true}
	if err := w.Read(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if out, want := w.Stream("stdout"), slices.Concat(a, b, c); !bytes.Equal(out.Data, want) || out.Lost != 0 {
		t.Errorf("cat wrote %d bytes (%d lost), want %d: the input, once", len(out.Data), out.Lost, len(want))
	}
	if in := k.faultStatus(sb, pid).Stdin; in == nil || in.Delivered != int64(len(a)+len(b)+len(c)) {
		t.Errorf("stdin %+v", in)
	}
}

// TestStdoutClosedWhileRunning: a process closes its stdout and goes on.
// A kiln.v1 watcher is told that stdout ended while the process runs and
// stderr goes on, and gets the exit when it comes.
func TestStdoutClosedWhileRunning(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	pid := k.faultStart(sb, api.ExecRequest{Command: "sh", Stdin: api.StdinPipe,
		Args: []string{"-c", "echo before; exec >&-; echo still >&2; read x; echo after-$x >&2; exit 3"}})
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	c := k.faultDial(ctx, sb, pid, "")
	defer c.CloseNow()
	w := &apitest.Checker{Keep: true}
	for !w.Stream("stdout").Ended || string(w.Stream("stderr").Data) != "still\n" {
		if _, err := w.Next(ctx, c); err != nil {
			t.Fatalf("before the input: %v", err)
		}
	}
	if w.Exit != nil {
		t.Fatalf("an exit before the process was given its input: %v", w.Exit)
	}
	p := k.faultStatus(sb, pid)
	if p.State != api.StateRunning || !p.Streams["stdout"].Ended || p.Streams["stderr"].Ended || p.Streams["stdout"].TotalBytes != 7 {
		t.Fatalf("process %+v, want running, stdout ended after 7 bytes, stderr open", p)
	}
	k.json("POST", "/sandboxes/"+sb+"/exec-stream/"+pid+"/stdin", "x\n", nil)
	if err := w.Read(ctx, c); err != nil {
		t.Fatal(err)
	}
	out, errs := w.Stream("stdout"), w.Stream("stderr")
	if string(out.Data) != "before\n" || string(errs.Data) != "still\nafter-x\n" || errs.Total != 14 ||
		w.Exit.ExitCode == nil || *w.Exit.ExitCode != 3 {
		t.Errorf("watcher got stdout %q, stderr %q, ends at %d and %d, exit %v", out.Data, errs.Data, out.Total, errs.Total, w.Exit)
	}
}

// faultCgroups reads a sandbox's control groups from its record.
func (k *kilnd) faultCgroups(sb string) *sandbox.Cgroups {
	k.t.Helper()
	b, err := os.ReadFile(filepath.Join(k.faultSandboxes(), sb, "sandbox.json"))
	if err != nil {
		k.t.Fatal(err)
	}
	var rec struct {
		Sandbox *sandbox.Sandbox `json:"sandbox"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Sandbox == nil || rec.Sandbox.Cgroups == nil {
		k.t.Fatalf("record of %s: %v", sb, err)
	}
	return rec.Sandbox.Cgroups
}

// oomKills counts the kernel's OOM kills in a sandbox.
func oomKills(cg *sandbox.Cgroups) int64 {
	if cg.V1["memory"] != "" {
		return cg.ReadEvent("memory", "memory.oom_control", "oom_kill")
	}
	return cg.ReadEvent("memory", "memory.events", "oom_kill")
}

// TestLimitsSpareOtherSandboxes: while one sandbox runs a fork bomb into
// its pids limit and another keeps running out of memory, a third
// sandbox's execs and kilnd's API go on answering. (That the limits hold
// and the agent survives is TestLimits', in the sandbox package.)
func TestLimitsSpareOtherSandboxes(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("the bomb and the hog are python3 programs")
	}
	k := start(t, "")
	defer k.cleanup()
	var bombed, starved, other api.Sandbox
	// Half a core each: the faults are to starve their own sandboxes, not
	// the machine the test runs on.
	k.json("POST", "/sandboxes", api.CreateSandbox{Limits: api.LimitsRequest{Pids: new(int64(64)), CPUs: new(0.5)}}, &bombed)
	k.json("POST", "/sandboxes", api.CreateSandbox{Limits: api.LimitsRequest{MemoryBytes: new(int64(64 << 20)), CPUs: new(0.5)}, OnOOM: api.OnOOMKillProcess}, &starved)
	k.json("POST", "/sandboxes", api.CreateSandbox{}, &other)
	bombCG, starvedCG := k.faultCgroups(bombed.ID), k.faultCgroups(starved.ID)
	bomb := k.faultStart(bombed.ID, api.ExecRequest{Command: "python3", Args: []string{"-c", faultBomb}})
	hog := k.faultStart(starved.ID, api.ExecRequest{Command: "sh",
		Args: []string{"-c", `while :; do python3 -c "b = b'x' * (256 << 20)" 2>/dev/null; done`}})
	faultAwait(t, "the bomb at its pids limit", func() bool { return bombCG.ReadEvent("pids", "pids.events", "max") > 0 })
	faultAwait(t, "the hog out of memory", func() bool { return oomKills(starvedCG) > 0 })
	// The bombed sandbox itself refuses an exec by its limit's name, after
	// trying for a moment: the bomb's copies never end.
	if code, b := k.do("POST", "/sandboxes/"+bombed.ID+"/exec", k.d.Token(), `{"command":"echo","args":["no room"]}`); code != http.StatusPreconditionFailed ||
		!strings.Contains(string(b), `"failed_precondition"`) || !strings.Contains(string(b), "limits.pids") || strings.Contains(string(b), "temporarily") {
		t.Errorf("exec in the bombed sandbox: %d %s", code, b)
	}
	// Execs in the other sandbox until both faults have struck again since
	// the first began, so that they ran during them.
	forks, ooms := bombCG.ReadEvent("pids", "pids.events", "max"), oomKills(starvedCG)
	execs := 0
	for deadline := time.Now().Add(faultDeadline); ; execs++ {
		if execs >= 3 && bombCG.ReadEvent("pids", "pids.events", "max") > forks && oomKills(starvedCG) > ooms {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d execs: forks refused %d → %d, OOM kills %d → %d", execs, forks,
				bombCG.ReadEvent("pids", "pids.events", "max"), ooms, oomKills(starvedCG))
		}
		var res api.ExecResult
		k.json("POST", "/sandboxes/"+other.ID+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c", "echo ok-" + strconv.Itoa(execs)}}, &res)
		if want := "ok-" + strconv.Itoa(execs) + "\n"; res.Stdout != want || res.ExitCode == nil || *res.ExitCode != 0 {
			t.Fatalf("exec %d in the other sandbox: %+v", execs, res)
		}
		var list []api.Sandbox
		k.json("GET", "/sandboxes", nil, &list)
		if len(list) != 3 {
			t.Fatalf("sandboxes %+v", list)
		}
	}
	t.Logf("%d execs in the other sandbox; forks refused %d → %d, OOM kills %d → %d", execs, forks,
		bombCG.ReadEvent("pids", "pids.events", "max"), ooms, oomKills(starvedCG))
	k.json("DELETE", "/sandboxes/"+bombed.ID+"/exec-stream/"+bomb, nil, nil)
	k.json("DELETE", "/sandboxes/"+starved.ID+"/exec-stream/"+hog, nil, nil)
	k.faultWait(bombed.ID, bomb)
	k.faultWait(starved.ID, hog)
	for _, sb := range []string{bombed.ID, starved.ID, other.ID} {
		k.faultAlive(sb)
	}
}

// faultBomb is a fork bomb that stays at its limit: every copy forks in a
// loop and lives on when a fork fails (a shell's copies exit then, and
// with the pids their unreaped children hold, all of them can fail at
// once: the bomb dies out in a second).
const faultBomb = `import os
while True:
    try:
        os.fork()
    except OSError:
        pass
`

// TestDefaultLimits: a sandbox created with {} has kilnd's default limits,
// in its record and in its cgroups; a limit given as 0 is none, and one
// left out is still the default.
func TestDefaultLimits(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	cases := []struct {
		body string
		want api.Limits
	}{
		{`{}`, daemon.DefaultLimits},
		{`{"limits":{"memory_bytes":0}}`, api.Limits{Pids: daemon.DefaultLimits.Pids, CPUs: daemon.DefaultLimits.CPUs, DiskBytes: daemon.DefaultLimits.DiskBytes}},
		{`{"limits":{"memory_bytes":0,"pids":0,"cpus":0,"disk_bytes":0}}`, api.Limits{}},
		{`{"limits":{"pids":64}}`, api.Limits{MemoryBytes: daemon.DefaultLimits.MemoryBytes, Pids: 64, CPUs: daemon.DefaultLimits.CPUs, DiskBytes: daemon.DefaultLimits.DiskBytes}},
	}
	for _, tc := range cases {
		status, b := k.do("POST", "/sandboxes", k.d.Token(), tc.body)
		var sb api.Sandbox
		if status != http.StatusCreated || json.Unmarshal(b, &sb) != nil {
			t.Fatalf("POST %s: %d %s", tc.body, status, b)
		}
		if sb.Limits != tc.want {
			t.Errorf("POST %s: limits %+v, want %+v", tc.body, sb.Limits, tc.want)
		}
		cg := k.faultCgroups(sb.ID)
		if dir := cg.MemoryProcs; dir != "" {
			got, _ := os.ReadFile(filepath.Join(dir, "memory.limit_in_bytes"))
			if n, _ := strconv.ParseInt(strings.TrimSpace(string(got)), 10, 64); (tc.want.MemoryBytes == 0) != (n > 1<<50) || tc.want.MemoryBytes != 0 && n != tc.want.MemoryBytes {
				t.Errorf("POST %s: memory.limit_in_bytes %s, want %d", tc.body, got, tc.want.MemoryBytes)
			}
		} else if tc.want.MemoryBytes != 0 && cg.V1["memory"] != "" {
			t.Errorf("POST %s: no limited memory group", tc.body)
		}
	}
}

// diskUsage is what the sandboxes' disk images hold on the host's disk
// (templates left out), and the images.
func (k *kilnd) diskUsage() (int64, []string) {
	images, _ := filepath.Glob(filepath.Join(k.state, "disks", "*.img"))
	var used int64
	for _, img := range images {
		if fi, err := os.Stat(img); err == nil && !strings.Contains(img, "template") {
			used += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
	}
	return used, images
}

// TestDiskQuota: a sandbox's writable layers are a filesystem of its quota's
// size: writing past it gives ENOSPC inside, the host's disk holds no more
// than the quota, the sandbox's mount table names no host path, and
// deleting the sandbox gives the space back.
func TestDiskQuota(t *testing.T) {
	t.Parallel()
	if err := sandbox.DisksAvailable(); err != nil {
		t.Skip(err)
	}
	k := start(t, "")
	defer k.cleanup()
	var sb api.Sandbox
	k.json("POST", "/sandboxes", api.CreateSandbox{Limits: api.LimitsRequest{DiskBytes: new(int64(64 << 20))}}, &sb)
	if sb.Limits.DiskBytes != 64<<20 {
		t.Fatalf("limits %+v", sb.Limits)
	}
	// fill writes 128 MiB to path in sandbox id: ENOSPC, and no mention
	// of the state directory in the mount table.
	fill := func(id, path string) {
		t.Helper()
		var res api.ExecResult
		k.json("POST", "/sandboxes/"+id+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c",
			"dd if=/dev/zero of=" + path + " bs=1M count=128; echo dd=$?; grep -c " + k.state + " /proc/self/mountinfo; true"}}, &res)
		if !strings.Contains(res.Stderr, "No space left on device") || !strings.Contains(res.Stdout, "dd=1") {
			t.Errorf("128 MiB into %s on a 64 MiB disk: stdout %q, stderr %q; want ENOSPC", path, res.Stdout, res.Stderr)
		}
		if !strings.HasSuffix(strings.TrimSpace(res.Stdout), "\n0") {
			t.Errorf("the sandbox's mount table names the state directory: %q", res.Stdout)
		}
	}
	fill(sb.ID, "/workspace/fill")
	// The spare disks kilnd makes in the background are counted once
	// made, here and after the delete.
	k.d.SettleDisks()
	used, images := k.diskUsage()
	// The spare disks of the default size hold a few MiB of metadata each.
	if used > 64<<20+32<<20 {
		t.Errorf("the disks hold %d bytes on the host", used)
	}
	// With an image, its writable layer is on the disk too.
	if busybox, err := os.ReadFile("/bin/busybox"); err == nil {
		img := filepath.Join(k.state, "images", "busybox", "bin")
		if err := os.MkdirAll(img, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(img, "busybox"), busybox, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, applet := range []string{"sh", "dd", "echo", "grep"} {
			os.Symlink("busybox", filepath.Join(img, applet))
		}
		var ib api.Sandbox
		k.json("POST", "/sandboxes", api.CreateSandbox{Rootfs: "busybox", Limits: api.LimitsRequest{DiskBytes: new(int64(64 << 20))}}, &ib)
		fill(ib.ID, "/fill")
		k.json("DELETE", "/sandboxes/"+ib.ID, nil, nil)
	}
	k.json("DELETE", "/sandboxes/"+sb.ID, nil, nil)
	k.d.SettleDisks()
	after, _ := filepath.Glob(filepath.Join(k.state, "disks", "*.img"))
	if len(after) >= len(images) {
		t.Errorf("disk images before the delete %d, after %d", len(images), len(after))
	}
}

// TestCreateWhoseRequestEnded: a create whose request ends before the
// agent answers (its client hung up; kilnd stopping, for a sandbox made
// ahead) leaves nothing of the sandbox, and is not logged as the host's
// failure: an operator reading kilnd's log after a Ctrl-C finds no error.
func TestCreateWhoseRequestEnded(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := k.d.Create(ctx, daemon.CreateRequest{Name: "gone"})
	if err == nil || !strings.Contains(err.Error(), "its request ended first") {
		t.Fatalf("a create whose request had ended: %v", err)
	}
	if ids := k.ids(); len(ids) != 0 {
		t.Errorf("sandboxes after it: %v, want none", ids)
	}
	if ents, _ := os.ReadDir(k.faultSandboxes()); len(ents) != 0 {
		t.Errorf("left in the sandboxes' directory: %v", ents)
	}
	// Its name is free again.
	var info daemon.Info
	k.json("POST", "/sandboxes", api.CreateSandbox{Name: "gone"}, &info)
	if log := k.dk.Log(); strings.Contains(log, "level=ERROR") {
		t.Errorf("kilnd logged an error:\n%s", log)
	}
}
