package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/mcp"
	"github.com/sandkiln/sandkiln/internal/roles"
)

func TestMain(m *testing.M) {
	roles.PlayIfReexecuted()
	daemontest.NoRaceExitSleep()
	goleak.VerifyTestMain(m)
}

// kilnd is a kilnd serving the MCP server at /mcp over TCP, and that
// server's own client, closed with the test.
type kilnd struct {
	k *daemontest.Kilnd
	c *client.Client
}

func startKilnd(t *testing.T) *kilnd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	state := t.TempDir()
	c, err := client.New(client.Options{Addr: "unix://" + filepath.Join(state, daemon.SocketName)})
	if err != nil {
		t.Fatal(err)
	}
	k, err := daemontest.StartConfig(daemon.Config{StateDir: state, Listen: "127.0.0.1:0", MCP: mcp.New(c).Handler()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if err := k.Close(); err != nil {
			t.Errorf("kilnd: %v", err)
		}
	})
	return &kilnd{k: k, c: c}
}

// The two ways a client reaches the server: a session of its own, as
// kiln mcp serves one on stdio, and kilnd's /mcp with the token.
var transports = []struct {
	name    string
	connect func(t *testing.T, k *kilnd) *sdk.ClientSession
}{
	{"session", func(t *testing.T, k *kilnd) *sdk.ClientSession {
		st, ct := sdk.NewInMemoryTransports()
		ss, err := mcp.New(k.c).Connect(t.Context(), st)
		if err != nil {
			t.Fatal(err)
		}
		cs := connect(t, ct)
		t.Cleanup(func() { cs.Close(); ss.Wait() })
		return cs
	}},
	{"http", func(t *testing.T, k *kilnd) *sdk.ClientSession {
		hc := &http.Client{Transport: bearer{k.k.Daemon.Token(), http.DefaultTransport}}
		cs := connect(t, &sdk.StreamableClientTransport{Endpoint: "http://" + k.k.Daemon.TCPAddr() + "/mcp", HTTPClient: hc, DisableStandaloneSSE: true})
		t.Cleanup(func() { cs.Close(); hc.CloseIdleConnections() })
		return cs
	}},
}

func connect(t *testing.T, tr sdk.Transport) *sdk.ClientSession {
	t.Helper()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// bearer adds kilnd's token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// call calls a tool that must succeed and decodes its structured result.
func call[Out any](t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) Out {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s %v: tool error: %s", name, args, textOf(res))
	}
	var out Out
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %v in %s", name, err, b)
	}
	return out
}

func textOf(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*sdk.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

func newSandbox(t *testing.T, cs *sdk.ClientSession) string {
	t.Helper()
	return call[mcp.SandboxOutput](t, cs, "sandbox_create", map[string]any{}).ID
}

func TestTools(t *testing.T) {
	k := startKilnd(t)
	want := []string{"exec", "file_list", "file_read", "file_write", "preview_url", "process_output", "process_signal",
		"process_start", "process_write_stdin", "sandbox_create", "sandbox_delete", "sandbox_list", "sandbox_start", "sandbox_stop"}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cs := tr.connect(t, k)
			res, err := cs.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tool := range res.Tools {
				names = append(names, tool.Name)
				schema, _ := tool.InputSchema.(map[string]any)
				if len(tool.Description) < 100 || schema["type"] != "object" {
					t.Errorf("%s: description %q, input schema %v", tool.Name, tool.Description, tool.InputSchema)
				}
			}
			slices.Sort(names)
			if diff := cmp.Diff(want, names); diff != "" {
				t.Errorf("tools (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPagesEveryLineOnce: a build's 10,000 lines, on both streams, read
// by polling process_output from the offsets each result gives, come
// exactly once each, no result over its bound.
func TestPagesEveryLineOnce(t *testing.T) {
	k := startKilnd(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cs := tr.connect(t, k)
			sb := newSandbox(t, cs)
			build := `i=1; while [ $i -le 10000 ]; do if [ $((i % 100)) -eq 0 ]; then echo "warning $i" >&2; else echo "compiling unit $i"; fi; i=$((i+1)); done; exit 3`
			p := call[mcp.StartOutput](t, cs, "process_start", map[string]any{"sandbox": sb, "command": build})
			var stdout, stderr strings.Builder
			offsets := p.Offsets
			pages := 0
			for {
				r := call[mcp.OutputOutput](t, cs, "process_output", map[string]any{"sandbox": sb, "pid": p.PID, "offsets": offsets, "max_bytes": 4096, "wait_ms": 10000})
				pages++
				if r.Bytes > 4096 || len(r.Stdout)+len(r.Stderr) != r.Bytes || r.MaxBytes != 4096 || !strings.Contains(r.Note, "at most 4096") {
					t.Fatalf("page %d: %d bytes (%d+%d), bound %d, note %q", pages, r.Bytes, len(r.Stdout), len(r.Stderr), r.MaxBytes, r.Note)
				}
				if len(r.LostBytes) > 0 {
					t.Fatalf("lost %v", r.LostBytes)
				}
				stdout.WriteString(r.Stdout)
				stderr.WriteString(r.Stderr)
				offsets = r.NextOffsets
				if r.Exited {
					if r.ExitCode == nil || *r.ExitCode != 3 || r.More {
						t.Fatalf("exit %v, more %v", r.ExitCode, r.More)
					}
					break
				}
			}
			var wantOut, wantErr strings.Builder
			for i := 1; i <= 10000; i++ {
				if i%100 == 0 {
					fmt.Fprintf(&wantErr, "warning %d\n", i)
				} else {
					fmt.Fprintf(&wantOut, "compiling unit %d\n", i)
				}
			}
			if stdout.String() != wantOut.String() || stderr.String() != wantErr.String() {
				t.Errorf("stdout %d bytes (want %d), stderr %d bytes (want %d)", stdout.Len(), wantOut.Len(), stderr.Len(), wantErr.Len())
			}
			if pages < (wantOut.Len()+wantErr.Len())/4096 {
				t.Errorf("%d pages for %d bytes at 4096 a page", pages, wantOut.Len()+wantErr.Len())
			}
			// Read again from the beginning, after the exit: the same.
			r := call[mcp.OutputOutput](t, cs, "process_output", map[string]any{"sandbox": sb, "pid": p.PID, "max_bytes": 65536})
			if !strings.HasPrefix(wantOut.String(), r.Stdout) || !r.More || r.Exited {
				t.Errorf("reread: %d bytes, more %v, exited %v", len(r.Stdout), r.More, r.Exited)
			}
		})
	}
}

// TestCharactersNeverSplit: a page that ends inside a UTF-8 character
// gives it back, and the next page starts with it.
func TestCharactersNeverSplit(t *testing.T) {
	k := startKilnd(t)
	_, cs := k, transports[0].connect(t, k)
	sb := newSandbox(t, cs)
	want := strings.Repeat("é€", 500)
	p := call[mcp.StartOutput](t, cs, "process_start", map[string]any{"sandbox": sb, "argv": []string{"printf", "%s", want}})
	var got strings.Builder
	offsets := p.Offsets
	for {
		r := call[mcp.OutputOutput](t, cs, "process_output", map[string]any{"sandbox": sb, "pid": p.PID, "offsets": offsets, "max_bytes": 257, "wait_ms": 10000})
		got.WriteString(r.Stdout)
		offsets = r.NextOffsets
		if r.Exited {
			break
		}
	}
	if got.String() != want {
		t.Errorf("got %d bytes, %d replacement characters", got.Len(), strings.Count(got.String(), "\uFFFD"))
	}
}

// TestBadArguments: every bad argument is a tool error the model reads,
// saying what was wrong, never a protocol failure.
func TestBadArguments(t *testing.T) {
	k := startKilnd(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cs := tr.connect(t, k)
			sb := newSandbox(t, cs)
			p := call[mcp.StartOutput](t, cs, "process_start", map[string]any{"sandbox": sb, "command": "echo hi"})
			for _, c := range []struct {
				tool string
				args map[string]any
				want string
			}{
				{"exec", map[string]any{"command": "true"}, `missing properties: ["sandbox"]`},
				{"exec", map[string]any{"sandbox": "", "command": "true"}, "sandbox is required"},
				{"exec", map[string]any{"sandbox": sb}, "command or argv is required"},
				{"exec", map[string]any{"sandbox": sb, "command": "true", "argv": []string{"true"}}, "exclude each other"},
				{"exec", map[string]any{"sandbox": sb, "command": "true", "timeout_ms": "soon"}, "timeout_ms"},
				{"exec", map[string]any{"sandbox": sb, "command": "true", "max_output_bytes": 10}, "max_output_bytes 10: want 256 to 65536"},
				{"exec", map[string]any{"sandbox": "no-such-sandbox", "command": "true"}, "no-such-sandbox"},
				{"process_output", map[string]any{"sandbox": sb, "pid": p.PID, "offsets": map[string]any{"stdout": 1 << 20}}, "the process has written"},
				{"process_output", map[string]any{"sandbox": sb, "pid": p.PID, "offsets": map[string]any{"stdout": -1}}, "offsets.stdout -1"},
				{"process_output", map[string]any{"sandbox": sb, "pid": p.PID, "offsets": map[string]any{"terminal": 0}}, `no stream "terminal"`},
				{"process_output", map[string]any{"sandbox": sb, "pid": "no-such-process"}, "no-such-process"},
				{"process_output", map[string]any{"sandbox": sb, "pid": p.PID, "wait_ms": 60000}, "wait_ms 60000"},
				{"sandbox_create", map[string]any{"limits": map[string]any{"memory": "lots"}}, `limits.memory "lots"`},
				{"sandbox_create", map[string]any{"egress": map[string]any{"mode": "open"}}, `egress.mode "open"`},
				{"file_read", map[string]any{"sandbox": sb, "path": "notes.txt"}, "absolute path"},
				{"file_read", map[string]any{"sandbox": sb, "path": "/workspace/none"}, "/workspace/none"},
				{"file_write", map[string]any{"sandbox": sb, "path": "/workspace/x", "content": "!", "encoding": "base64"}, "not base64"},
				{"preview_url", map[string]any{"sandbox": sb, "port": 70000}, "port 70000"},
				{"process_signal", map[string]any{"sandbox": sb, "pid": p.PID, "signal": "NOPE"}, "NOPE"},
				{"sandbox_stop", map[string]any{"sandbox": sb, "timeout_seconds": 601}, "timeout_seconds 601: want 0 to 600"},
				{"sandbox_start", map[string]any{"sandbox": "no-such-sandbox"}, "no-such-sandbox"},
			} {
				res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
				if err != nil {
					t.Errorf("%s %v: a protocol error: %v", c.tool, c.args, err)
					continue
				}
				t.Logf("%s %v: %s", c.tool, c.args, textOf(res))
				if !res.IsError || !strings.Contains(textOf(res), c.want) {
					t.Errorf("%s %v: error %v, %q; want one saying %q", c.tool, c.args, res.IsError, textOf(res), c.want)
				}
			}
		})
	}
}

func TestExecBounded(t *testing.T) {
	k := startKilnd(t)
	cs := transports[0].connect(t, k)
	sb := newSandbox(t, cs)
	r := call[mcp.ExecOutput](t, cs, "exec", map[string]any{"sandbox": sb, "command": "head -c 100000 /dev/zero | tr '\\0' x; echo oops >&2; exit 4", "max_output_bytes": 1000})
	if r.ExitCode != 4 || !r.Truncated || len(r.Stdout)+len(r.Stderr) > 1000 || !strings.Contains(r.Note, "at most 1000 bytes") || !strings.Contains(r.Note, "wrote more") {
		t.Errorf("exit %d, truncated %v, %d+%d bytes, note %q", r.ExitCode, r.Truncated, len(r.Stdout), len(r.Stderr), r.Note)
	}
	r = call[mcp.ExecOutput](t, cs, "exec", map[string]any{"sandbox": sb, "argv": []string{"sh", "-c", "echo out; echo err >&2"}})
	if diff := cmp.Diff(mcp.ExecOutput{Stdout: "out\n", Stderr: "err\n", MaxBytes: mcp.DefaultOutputBytes, Note: "at most 16384 bytes of output are returned"}, r); diff != "" {
		t.Errorf("exec (-want +got):\n%s", diff)
	}
	r = call[mcp.ExecOutput](t, cs, "exec", map[string]any{"sandbox": sb, "command": "sleep 30", "timeout_ms": 200})
	if !r.TimedOut || r.Signal != "KILL" || r.ExitCode != 137 {
		t.Errorf("timed out: %+v", r)
	}
}

// TestStdinAndSignals: a process reads what process_write_stdin writes
// and ends at its end of input; another ends with the signal sent.
func TestStdinAndSignals(t *testing.T) {
	k := startKilnd(t)
	cs := transports[0].connect(t, k)
	sb := newSandbox(t, cs)
	p := call[mcp.StartOutput](t, cs, "process_start", map[string]any{"sandbox": sb, "command": "tr a-z A-Z", "stdin": true})
	// Nothing written yet: at once, and after a wait that runs out, an
	// empty page of a running process, not an error.
	for _, wait := range []int{0, 100} {
		r := call[mcp.OutputOutput](t, cs, "process_output", map[string]any{"sandbox": sb, "pid": p.PID, "offsets": p.Offsets, "wait_ms": wait})
		if r.Bytes != 0 || r.Exited || r.More || !strings.Contains(r.Note, "is running") || !cmp.Equal(r.NextOffsets, p.Offsets) {
			t.Errorf("wait_ms %d before any output: %+v", wait, r)
		}
	}
	call[mcp.StdinOutput](t, cs, "process_write_stdin", map[string]any{"sandbox": sb, "pid": p.PID, "data": "hello\n"})
	if w := call[mcp.StdinOutput](t, cs, "process_write_stdin", map[string]any{"sandbox": sb, "pid": p.PID, "data": "again\n", "close": true}); w.Written != 6 || !w.Closed {
		t.Errorf("write: %+v", w)
	}
	if got := readAll(t, cs, sb, p.PID); got.Stdout != "HELLO\nAGAIN\n" || *got.ExitCode != 0 {
		t.Errorf("output %q, exit %d", got.Stdout, *got.ExitCode)
	}
	p = call[mcp.StartOutput](t, cs, "process_start", map[string]any{"sandbox": sb, "argv": []string{"sleep", "600"}})
	call[mcp.SignalOutput](t, cs, "process_signal", map[string]any{"sandbox": sb, "pid": p.PID})
	if got := readAll(t, cs, sb, p.PID); got.Signal != "TERM" || *got.ExitCode != 143 {
		t.Errorf("after TERM: signal %q, exit %d", got.Signal, *got.ExitCode)
	}
}

// readAll reads a process's output to its exit, waiting for it.
func readAll(t *testing.T, cs *sdk.ClientSession, sb, pid string) mcp.OutputOutput {
	t.Helper()
	var all mcp.OutputOutput
	var offsets map[string]int64 // null at first, as a model may send it
	for {
		r := call[mcp.OutputOutput](t, cs, "process_output", map[string]any{"sandbox": sb, "pid": pid, "offsets": offsets, "wait_ms": 10000})
		all.Stdout += r.Stdout
		all.Stderr += r.Stderr
		offsets = r.NextOffsets
		if r.Exited {
			all.ExitCode, all.Signal = r.ExitCode, r.Signal
			return all
		}
	}
}

func TestFiles(t *testing.T) {
	k := startKilnd(t)
	cs := transports[1].connect(t, k)
	sb := newSandbox(t, cs)
	content := strings.Repeat("a line of text\n", 100) // 1500 bytes
	w := call[mcp.FileOutput](t, cs, "file_write", map[string]any{"sandbox": sb, "path": "/workspace/src/notes.txt", "content": content})
	if w.Size != int64(len(content)) || w.Mode != "0644" {
		t.Errorf("written: %+v", w)
	}
	call[mcp.FileOutput](t, cs, "file_write", map[string]any{"sandbox": sb, "path": "/workspace/run.sh", "content": "#!/bin/sh\necho ran\n", "mode": "0755"})
	if r := call[mcp.ExecOutput](t, cs, "exec", map[string]any{"sandbox": sb, "argv": []string{"/workspace/run.sh"}}); r.Stdout != "ran\n" {
		t.Errorf("script: %+v", r)
	}
	var got strings.Builder
	var off int64
	for {
		r := call[mcp.ReadOutput](t, cs, "file_read", map[string]any{"sandbox": sb, "path": "/workspace/src/notes.txt", "offset": off, "max_bytes": 256})
		if r.Bytes > 256 || r.Size != int64(len(content)) || r.Encoding != "utf-8" {
			t.Fatalf("read: %+v", r)
		}
		got.WriteString(r.Content)
		off = r.NextOffset
		if r.EOF {
			break
		}
	}
	if got.String() != content {
		t.Errorf("read back %q", got.String())
	}
	call[mcp.FileOutput](t, cs, "file_write", map[string]any{"sandbox": sb, "path": "/workspace/blob", "content": "AP8=", "encoding": "base64"})
	if r := call[mcp.ReadOutput](t, cs, "file_read", map[string]any{"sandbox": sb, "path": "/workspace/blob"}); r.Content != "AP8=" || r.Encoding != "base64" {
		t.Errorf("binary: %+v", r)
	}
	l := call[mcp.ListFilesOutput](t, cs, "file_list", map[string]any{"sandbox": sb})
	var names []string
	for _, e := range l.Entries {
		names = append(names, e.Name+":"+e.Type)
	}
	if diff := cmp.Diff([]string{"blob:file", "run.sh:file", "src:dir"}, names); diff != "" || l.Path != "/workspace" {
		t.Errorf("list of %s (-want +got):\n%s", l.Path, diff)
	}
}

func TestSandboxes(t *testing.T) {
	k := startKilnd(t)
	cs := transports[0].connect(t, k)
	created := call[mcp.SandboxOutput](t, cs, "sandbox_create", map[string]any{"name": "agent-box", "limits": map[string]any{"memory": "256MiB", "pids": 64}})
	if created.Name != "agent-box" || created.Limits.MemoryBytes != 256<<20 || created.Limits.Pids != 64 || created.State != "running" {
		t.Errorf("created: %+v", created)
	}
	l := call[mcp.ListOutput](t, cs, "sandbox_list", nil)
	if len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != created.ID || l.Omitted != 0 || l.Note != "1 sandboxes; at most 500 per call." {
		t.Errorf("list: %+v", l)
	}
	other := call[mcp.SandboxOutput](t, cs, "sandbox_create", map[string]any{"labels": map[string]any{"task": "fix-42"}, "ttl_seconds": 3600})
	if other.Labels["task"] != "fix-42" {
		t.Errorf("created with labels: %+v", other)
	}
	if l := call[mcp.ListOutput](t, cs, "sandbox_list", map[string]any{"label": []string{"task=fix-42"}}); len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != other.ID {
		t.Errorf("list by label: %+v", l)
	}
	// Stopped, its files stay and nothing runs in it; started, it runs on them.
	call[mcp.FileOutput](t, cs, "file_write", map[string]any{"sandbox": other.ID, "path": "/workspace/kept", "content": "kept\n"})
	if s := call[mcp.SandboxOutput](t, cs, "sandbox_stop", map[string]any{"sandbox": other.ID, "timeout_seconds": 0}); s.State != "stopped" || s.Reason != "stopped by request" {
		t.Errorf("stopped: %+v", s)
	}
	if s := call[mcp.SandboxOutput](t, cs, "sandbox_stop", map[string]any{"sandbox": other.ID}); s.State != "stopped" {
		t.Errorf("stopped again: %+v", s)
	}
	if res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox": other.ID, "command": "true"}}); err != nil || !res.IsError || !strings.Contains(textOf(res), "stopped") {
		t.Errorf("exec in a stopped sandbox: %v %v", err, res)
	}
	if s := call[mcp.SandboxOutput](t, cs, "sandbox_start", map[string]any{"sandbox": other.ID}); s.State != "running" || s.ID != other.ID {
		t.Errorf("started: %+v", s)
	}
	if r := call[mcp.ExecOutput](t, cs, "exec", map[string]any{"sandbox": other.ID, "command": "cat /workspace/kept"}); r.Stdout != "kept\n" {
		t.Errorf("after the start: %+v", r)
	}
	call[mcp.DeleteOutput](t, cs, "sandbox_delete", map[string]any{"sandbox": other.ID})
	if d := call[mcp.DeleteOutput](t, cs, "sandbox_delete", map[string]any{"sandbox": "agent-box"}); d.Deleted != created.ID {
		t.Errorf("deleted %q", d.Deleted)
	}
	if l := call[mcp.ListOutput](t, cs, "sandbox_list", nil); len(l.Sandboxes) != 0 {
		t.Errorf("after delete: %+v", l)
	}
}

func TestPreviewURL(t *testing.T) {
	k := startKilnd(t)
	cs := transports[1].connect(t, k)
	sb := newSandbox(t, cs)
	p := call[mcp.PreviewOutput](t, cs, "preview_url", map[string]any{"sandbox": sb, "port": 8000, "ttl_seconds": 60})
	if !strings.HasPrefix(p.URL, "http://") || time.Until(p.Expires) > time.Minute+time.Second {
		t.Errorf("preview: %+v", p)
	}
}

// TestLogResources: a process's captured output is a resource, listed
// and read.
func TestLogResources(t *testing.T) {
	k := startKilnd(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cs := tr.connect(t, k)
			sb := newSandbox(t, cs)
			p := call[mcp.StartOutput](t, cs, "process_start", map[string]any{"sandbox": sb, "command": "echo captured; echo also >&2"})
			readAll(t, cs, sb, p.PID)
			list, err := cs.ListResources(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(list.Resources, func(r *sdk.Resource) bool { return r.URI == p.Log }) {
				t.Errorf("%s is not among %d resources", p.Log, len(list.Resources))
			}
			templates, err := cs.ListResourceTemplates(t.Context(), nil)
			if err != nil || len(templates.ResourceTemplates) != 1 {
				t.Errorf("templates: %v %v", templates, err)
			}
			r, err := cs.ReadResource(t.Context(), &sdk.ReadResourceParams{URI: p.Log})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Contents) != 1 || !strings.Contains(r.Contents[0].Text, "captured\n") || !strings.Contains(r.Contents[0].Text, "also\n") {
				t.Errorf("read %s: %+v", p.Log, r.Contents)
			}
		})
	}
}

// TestHTTPNeedsTheToken: /mcp is kilnd's like every other route.
func TestHTTPNeedsTheToken(t *testing.T) {
	k := startKilnd(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+k.k.Daemon.TCPAddr()+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the token: %s", resp.Status)
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestOutputAfterExit: output a process's child writes after the process
// exited is read, not cut off by an exit reported first: process_output
// says exited only once every stream has ended.
func TestOutputAfterExit(t *testing.T) {
	k := startKilnd(t)
	cs := transports[0].connect(t, k)
	sb := newSandbox(t, cs)
	p := call[mcp.StartOutput](t, cs, "process_start", map[string]any{"sandbox": sb,
		"command": "(until [ -e /tmp/go ]; do sleep 0.01; done; echo late) &"})
	h, err := k.c.Handle(sb).Process(t.Context(), p.PID, client.ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Detach()
	// The shell has exited; its child holds the pipe until /tmp/go is
	// there.
	if _, err := h.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, err := h.Status(t.Context()); err != nil || st.Process.Streams["stdout"].Ended {
		t.Fatalf("after the exit: %+v, %v; want stdout not ended yet", st, err)
	}
	r := call[mcp.OutputOutput](t, cs, "process_output", map[string]any{"sandbox": sb, "pid": p.PID})
	if r.Exited {
		t.Errorf("exited before the child's output: %+v", r)
	}
	call[mcp.FileOutput](t, cs, "file_write", map[string]any{"sandbox": sb, "path": "/tmp/go", "content": ""})
	if got := readAll(t, cs, sb, p.PID); got.Stdout != "late\n" || *got.ExitCode != 0 {
		t.Errorf("output %q, exit %d", got.Stdout, *got.ExitCode)
	}
}
