package interop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	crilogs "k8s.io/cri-client/pkg/logs"
	"k8s.io/klog/v2"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// These tests read captured logs with kubelet's own reader, the code
// behind kubectl logs: a captured log is to read as a container's does,
// every byte of stdout and stderr and nothing else.

const timeout = 2 * time.Minute

// captured runs script with capture into a fresh directory, and returns
// the path of the active log file once the run has ended, with what the
// script wrote on each stream when run directly.
func captured(t *testing.T, opt capture.Options, script string) (path string, stdout, stderr []byte) {
	t.Helper()
	dir, w := begin(t, opt)
	p, err := process.Start("p", process.Spec{Argv: []string{"sh", "-c", script}, Capture: w})
	if err != nil {
		t.Fatal(err)
	}
	ended(t, p)
	stdout, stderr = direct(t, script)
	return filepath.Join(dir, capture.ActiveName), stdout, stderr
}

// begin starts a run in a fresh directory.
func begin(t *testing.T, opt capture.Options) (string, *capture.Writer) {
	t.Helper()
	dir := t.TempDir()
	d, err := capture.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	w, err := capture.Begin(d, uuid.Must(uuid.NewV7()).String(), opt)
	if err != nil {
		t.Fatal(err)
	}
	return dir, w
}

// ended waits for p's capture to end cleanly, with nothing dropped.
func ended(t *testing.T, p *process.Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(timeout):
		t.Fatal("the process did not finish")
	}
	if st := p.Status(); st.Capture == nil || !st.Capture.Ended || st.Capture.Dropped != [capture.NumLogStreams]int64{} {
		t.Fatalf("capture %+v: want ended with nothing dropped", st.Capture)
	}
}

// direct runs script without sandkiln.
func direct(t *testing.T, script string) (stdout, stderr []byte) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := exec.Command("sh", "-c", script)
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return o.Bytes(), e.Bytes()
}

// quiet gives kubelet's reader a logger that drops what it says of the
// lines it passes over (the kiln stream's).
func quiet(ctx context.Context) context.Context { return klog.NewContext(ctx, logr.Discard()) }

// readLogs is kubectl logs without a cluster: kubelet's reader on path.
func readLogs(t *testing.T, path string, opts *crilogs.LogOptions, rt internalapi.RuntimeService) (stdout, stderr []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(quiet(t.Context()), timeout)
	defer cancel()
	var o, e bytes.Buffer
	if err := crilogs.ReadLogs(ctx, path, "c", opts, rt, &o, &e); err != nil {
		t.Fatalf("kubelet's reader: %v", err)
	}
	return o.Bytes(), e.Bytes()
}

func diff(what string, got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	clip := func(b []byte) []byte { return b[min(i, len(b)):min(i+40, len(b))] }
	return fmt.Errorf("%s: %d bytes, want %d; first difference at byte %d: %q, want %q", what, len(got), len(want), i, clip(got), clip(want))
}

// TestKubeletRefusesAFileThatBeginsWithMetadata: kubelet's reader takes
// a file's first line to choose between the CRI and Docker formats
// (getParseFunc in k8s.io/cri-client/pkg/logs) and refuses a file whose
// first line is neither; every captured file begins with its header, a
// line of the kiln stream. This pins that known limit: if kubelet comes
// to pass over such a line, the tests below can read whole files.
func TestKubeletRefusesAFileThatBeginsWithMetadata(t *testing.T) {
	path, _, _ := captured(t, capture.Options{}, `echo hello`)
	var o, e bytes.Buffer
	err := crilogs.ReadLogs(t.Context(), path, "c", &crilogs.LogOptions{}, nil, &o, &e)
	if err == nil || !strings.Contains(err.Error(), "unsupported log format") {
		t.Fatalf("kubelet's reader: %v (stdout %q), want it to refuse the format", err, o.Bytes())
	}
}

// withoutHeader copies a log file from its first line of output on (past
// its header, and a run's begin record) to a file of its own: what
// kubelet's reader is given to read.
func withoutHeader(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	header, rest, ok := bytes.Cut(b, []byte{'\n'})
	if !ok || !bytes.Contains(header, []byte(" kiln F {\"event\":\"file\"")) {
		t.Fatalf("%s begins with %q, not a header", path, header)
	}
	for {
		line, after, ok := bytes.Cut(rest, []byte{'\n'})
		if !ok || !bytes.Contains(line, []byte(" kiln F ")) {
			break
		}
		rest = after
	}
	out := filepath.Join(t.TempDir(), "0.log")
	if err := os.WriteFile(out, rest, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKubeletReadsEveryByte: past its header, a captured file is a log
// kubelet's reader reads whole, passing over the kiln stream's lines
// (begin, end) as lines it cannot parse: short lines on both streams, a
// line longer than a record (partial records), bytes that are not UTF-8,
// and a last line without its newline, read back exactly.
func TestKubeletReadsEveryByte(t *testing.T) {
	script := `for i in $(seq 1 300); do echo "out $i"; echo "err $i" >&2; done
head -c 40000 /dev/zero | tr '\0' L; echo
printf 'caf\303\251 \377\376 \r\n'
printf 'no newline at the end'`
	path, wantOut, wantErr := captured(t, capture.Options{}, script)
	gotOut, gotErr := readLogs(t, withoutHeader(t, path), &crilogs.LogOptions{}, nil)
	for _, err := range []error{diff("stdout", gotOut, wantOut), diff("stderr", gotErr, wantErr)} {
		if err != nil {
			t.Error(err)
		}
	}
}

// runtime is the container runtime kubelet's reader asks, when following,
// whether the container still runs.
type runtime struct {
	internalapi.RuntimeService
	running atomic.Bool
}

func (r *runtime) ContainerStatus(ctx context.Context, id string, verbose bool) (*runtimeapi.ContainerStatusResponse, error) {
	state := runtimeapi.ContainerState_CONTAINER_EXITED
	if r.running.Load() {
		state = runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{State: state}}, nil
}

// counter is an io.Writer that says when it has taken n bytes.
type counter struct {
	mu      sync.Mutex
	b       bytes.Buffer
	n       int
	reached chan struct{}
}

// await returns a channel closed once n bytes were written.
func (c *counter) await(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n, c.reached = n, make(chan struct{})
	if c.b.Len() >= n {
		close(c.reached)
	}
	return c.reached
}

func (c *counter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.b.Len()
	c.b.Write(p)
	if was < c.n && c.b.Len() >= c.n {
		close(c.reached)
	}
	return len(p), nil
}

// awaitWatched waits until this process has an inotify watch on path's
// directory. kubelet's reader, following, makes one once it has read to
// the file's end, and reads on from there: from then on, whatever is
// written is its to read.
func awaitWatched(ctx context.Context, t *testing.T, path string, followed <-chan error) {
	t.Helper()
	fi, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(" ino:%x ", fi.Sys().(*syscall.Stat_t).Ino)
	for {
		fds, _ := os.ReadDir("/proc/self/fd")
		for _, fd := range fds {
			if link, _ := os.Readlink("/proc/self/fd/" + fd.Name()); link != "anon_inode:inotify" {
				continue
			}
			if info, _ := os.ReadFile("/proc/self/fdinfo/" + fd.Name()); strings.Contains(string(info), want) {
				return
			}
		}
		select {
		case err := <-followed:
			t.Fatalf("kubelet's reader ended before it watched %s: %v", path, err)
		case <-ctx.Done():
			t.Fatalf("kubelet's reader never watched %s", path)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestKubeletFollowsAcrossRotation: kubectl logs -f --tail 0 from the
// start of a run whose file rotates every 64 KiB gets every line once, in
// order: a rotation links the full file as an archive and renames a new one
// over the name, which kubelet's reader follows as it does kubelet's own
// rotation. (With --tail 0 the first line it parses is output, which sets
// its format; the header lines of the files after it are lines it passes
// over.) (Like kubelet's, it reopens the name when told of the new
// file; it keeps up as long as a rotation does not come while it is still
// busy with the one before, as with kubelet's own 10 MiB files. Here each
// step's lines wait until it has read those before.)
func TestKubeletFollowsAcrossRotation(t *testing.T) {
	dir, w := begin(t, capture.Options{MaxSize: 64 << 10, MaxFiles: 1000})
	rt := &runtime{}
	rt.running.Store(true)
	out := &counter{}
	ctx, cancel := context.WithTimeout(quiet(t.Context()), timeout)
	defer cancel()
	followed := make(chan error, 1)
	go func() {
		var none int64
		followed <- crilogs.ReadLogs(ctx, filepath.Join(dir, capture.ActiveName), "c", &crilogs.LogOptions{Follow: true, TailLines: &none}, rt, out, os.Stderr)
	}()
	// With --tail 0 it reads from where the file ends when it opens it:
	// what is written before that is not for it to read.
	awaitWatched(ctx, t, filepath.Join(dir, capture.ActiveName), followed)
	r := ring.New(ring.Config{Streams: []ring.Stream{ring.Stdout}})
	var want []byte
	// Each step's lines take about 46 KiB of log, less than a file: a
	// step rotates at most once.
	for step := range 40 {
		var b []byte
		for i := range 400 {
			b = fmt.Appendf(b, "line %d of step %d, about 75 bytes long, 400 of them filling 46 KiB\n", i, step)
		}
		for rest := b; len(rest) > 0; {
			n := copy(r.Buffer(ring.Stdout), rest)
			c := r.Commit(ring.Stdout, n, false)
			w.Sink().Push(c)
			c.Release()
			rest = rest[n:]
		}
		want = append(want, b...)
		select {
		case <-out.await(len(want)):
		case <-ctx.Done():
			t.Fatalf("step %d: kubelet's reader has %d of %d bytes", step, out.b.Len(), len(want))
		}
	}
	w.Sink().Close()
	if err := w.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	rt.running.Store(false)
	if err := <-followed; err != nil {
		t.Fatalf("kubelet's reader: %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, capture.ActiveName+".*")); len(files) < 20 {
		t.Fatalf("%d archives: want a rotation in most steps", len(files))
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if err := diff("followed stdout", out.b.Bytes(), want); err != nil {
		t.Error(err)
	}
}

// TestKubeletReadsEachFile: every file of a rotated log, archives and the
// active one, past its header, is a log kubelet's reader takes on its own;
// in order they hold the whole output.
func TestKubeletReadsEachFile(t *testing.T) {
	script := `i=0; while [ $i -lt 5000 ]; do echo "line $i"; echo "error $i" >&2; i=$((i+1)); done`
	path, wantOut, wantErr := captured(t, capture.Options{MaxSize: 16 << 10, MaxFiles: 1000}, script)
	archives := archivesOf(t, path)
	if len(archives) < 3 {
		t.Fatalf("%d archives", len(archives))
	}
	var gotOut, gotErr []byte
	for _, f := range append(archives, path) {
		o, e := readLogs(t, withoutHeader(t, f), &crilogs.LogOptions{}, nil)
		gotOut, gotErr = append(gotOut, o...), append(gotErr, e...)
	}
	for _, err := range []error{diff("stdout", gotOut, wantOut), diff("stderr", gotErr, wantErr)} {
		if err != nil {
			t.Error(err)
		}
	}
}

// archivesOf lists the archives of the log whose active file is path,
// oldest first.
func archivesOf(t *testing.T, path string) []string {
	t.Helper()
	archives, err := filepath.Glob(path + ".*")
	if err != nil {
		t.Fatal(err)
	}
	seq := func(name string) int {
		n, _ := strconv.Atoi(name[strings.LastIndexByte(name, '.')+1:])
		return n
	}
	slices.SortFunc(archives, func(a, b string) int { return seq(a) - seq(b) })
	return archives
}
