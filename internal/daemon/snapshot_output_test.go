package daemon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
)

// capturedLog reads process pid's captured log in sandbox sb's
// directory, as it is now, whole: records, metadata and runs.
func (k *kilnd) capturedLog(t *testing.T, sb, pid string) capture.Log {
	t.Helper()
	d, err := capture.OpenDir(filepath.Join(k.state, "sandboxes", sb, "logs", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l, err := capture.ReadLog(t.Context(), d, capture.All)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// processOf is process pid as sandbox sb lists it.
func (k *kilnd) processOf(t *testing.T, sb, pid string) api.Process {
	t.Helper()
	var p api.Process
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+pid, nil, &p)
	return p
}

// counted checks that out is the counter's lines, 1 on, without a gap or
// a repeat (the last may be cut short), and says how many.
func counted(t *testing.T, what string, out []byte) int {
	t.Helper()
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		if want := strconv.Itoa(i + 1); l != want && !(i == len(lines)-1 && strings.HasPrefix(want, l)) {
			t.Fatalf("%s: line %d is %q, want %s", what, i+1, l, want)
		}
	}
	return len(lines)
}

// TestMemoryForkCapture: a captured gVisor process counting on stdout
// (and every fifth count on stderr) is saved in a memory snapshot, and
// two sandboxes are made from it. In each, the process's log holds the
// snapshot's run up to exactly the snapshot's offsets, byte for byte the
// original's, then a new run whose begin names that run and those
// offsets, in which the process counts on; the log reads back from offset
// 0 through the continuation without a gap or a repeat, as bytes and as
// records at their offsets, from the log alone and from the best source.
// The sandbox snapshotted goes on in its one run.
func TestMemoryForkCapture(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	sb := createGVisor(t, k, `{"runtime":"gvisor","limits":{"memory_bytes":268435456}}`).ID
	var started api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Capture: true, Command: "python3", Args: []string{"-u", "-c",
		"import sys, time\ni = 0\nwhile True:\n    i += 1\n    print(i)\n    if i % 5 == 0:\n        print(i, file=sys.stderr)\n    time.sleep(0.01)"}}, &started)
	pid := started.ID
	for k.processOf(t, sb, pid).Streams["stdout"].TotalBytes < 100 {
		time.Sleep(50 * time.Millisecond)
	}

	code, b := k.do("POST", "/sandboxes/"+sb+"/snapshots", k.d.Token(), api.SnapshotRequest{Memory: true})
	var snap api.Snapshot
	if code != http.StatusCreated || json.Unmarshal(b, &snap) != nil {
		t.Fatalf("memory snapshot: %d %s", code, b)
	}
	at := map[string]int64{}
	for _, p := range snap.Processes {
		if p.ID == pid {
			at["stdout"], at["stderr"] = p.Streams["stdout"].TotalBytes, p.Streams["stderr"].TotalBytes
		}
	}
	if at["stdout"] < 100 || at["stderr"] == 0 {
		t.Fatalf("the snapshot's process: %+v, want it with its offsets", snap.Processes)
	}
	parent := k.capturedLog(t, sb, pid)
	if len(parent.Runs) != 1 {
		t.Fatalf("the original's runs: %+v", parent.Runs)
	}
	run := parent.Runs[0].ID

	// The original's output up to the snapshot, from its own log.
	var original [capture.NumLogStreams][]byte
	for ; int64(len(original[capture.LogStdout])) < at["stdout"]+50; time.Sleep(50 * time.Millisecond) {
		original = [capture.NumLogStreams][]byte{}
		for _, e := range k.capturedLog(t, sb, pid).Entries {
			if e.Stream != capture.LogMeta {
				original[e.Stream] = append(original[e.Stream], e.Payload()...)
			}
		}
	}

	continued := map[string]bool{}
	for i := range 2 {
		f := k.createFrom(t, snap.ID)
		if p := k.processOf(t, f, pid); p.State != api.StateRunning || p.ForkedFrom != nil {
			t.Fatalf("fork %d: the process is %+v, want it running on", i, p)
		}
		for k.processOf(t, f, pid).Streams["stdout"].TotalBytes < at["stdout"]+100 {
			time.Sleep(50 * time.Millisecond)
		}
		l := k.capturedLog(t, f, pid)
		// Every record where its stream stood; the new run's begin where
		// the snapshot's offsets are, the old run's records up to it.
		var pos, begun [capture.NumLogStreams]int64
		var out [capture.NumLogStreams][]byte
		var cont *capture.Meta
		for _, e := range l.Entries {
			switch {
			case e.Gap != 0 || e.Lost != [capture.NumLogStreams]int64{}:
				t.Fatalf("fork %d: a loss in the log: %+v", i, e)
			case e.Stream == capture.LogMeta:
				var m capture.Meta
				if err := json.Unmarshal(e.Content, &m); err != nil {
					t.Fatal(err)
				}
				if m.Event == "begin" && m.Parent != "" {
					if cont != nil {
						t.Fatalf("fork %d: a second continuation: %s", i, e.Content)
					}
					cont, begun = &m, pos
				}
			default:
				if e.Offset != pos[e.Stream] {
					t.Fatalf("fork %d: a record of %v at %d, its stream at %d", i, e.Stream, e.Offset, pos[e.Stream])
				}
				out[e.Stream] = append(out[e.Stream], e.Payload()...)
				pos[e.Stream] += int64(e.PayloadLen())
			}
		}
		want := &capture.Positions{Stdout: at["stdout"], Stderr: at["stderr"]}
		if cont == nil || cont.Parent != run || cont.Run == run || *cont.At != *want || begun != [capture.NumLogStreams]int64{want.Stdout, want.Stderr} {
			t.Fatalf("fork %d: the continuation %+v, the old run's records ending at %v; want one naming run %s at %+v, where they end", i, cont, begun, run, *want)
		}
		continued[cont.Run] = true
		for s, n := range begun {
			if !bytes.Equal(out[s][:n], original[s][:n]) {
				t.Errorf("fork %d: %v up to the snapshot is not the original's", i, capture.LogStream(s))
			}
		}
		counted(t, fmt.Sprintf("fork %d's log", i), out[capture.LogStdout])
		if len(l.Runs) != 2 || l.Runs[0].ID != run || l.Runs[0].State != capture.Lossless || l.Runs[0].ContinuedBy != cont.Run ||
			l.Runs[1].ID != cont.Run || l.Runs[1].Parent != run || l.Runs[1].State != capture.Interrupted {
			t.Errorf("fork %d: runs %+v, want %s continued by %s, which runs on", i, l.Runs, run, cont.Run)
		}

		// Read back through the API: the log alone, and the best source.
		for _, q := range []string{"?stream=stdout&source=log", "?stream=stdout"} {
			code, b := k.do("GET", "/sandboxes/"+f+"/logs/"+pid+q, k.d.Token(), nil)
			if code != http.StatusOK {
				t.Fatalf("fork %d: logs%s: %d %s", i, q, code, b)
			}
			if n := counted(t, fmt.Sprintf("fork %d: logs%s", i, q), b); int64(len(b)) < at["stdout"] || n < 2 {
				t.Errorf("fork %d: logs%s: %d bytes", i, q, len(b))
			}
		}
		next := int64(0)
		k.ndjson(t, t.Context(), "/sandboxes/"+f+"/logs/"+pid+"?stream=stdout", func(r api.LogRecord) bool {
			if r.LostBytes != 0 || r.Offset == nil || *r.Offset != next {
				t.Fatalf("fork %d: record %+v, the stream at %d", i, r, next)
			}
			next += int64(len(r.Text))
			if !r.Partial {
				next++
			}
			return true
		})
		if next < at["stdout"] {
			t.Errorf("fork %d: the records end at %d", i, next)
		}
		var logs []api.CapturedLog
		k.json("GET", "/sandboxes/"+f+"/logs", nil, &logs)
		for _, cl := range logs {
			if cl.Process == pid && (len(cl.Runs) != 2 || cl.Runs[0].ContinuedBy != cont.Run || cl.Runs[1].Parent != run) {
				t.Errorf("fork %d: the API's runs %+v", i, cl.Runs)
			}
		}
	}
	if len(continued) != 2 {
		t.Errorf("the forks' new runs: %v, want one of its own each", continued)
	}
	l := k.capturedLog(t, sb, pid)
	if len(l.Runs) != 1 || l.Runs[0].ID != run {
		t.Errorf("the original's runs after the snapshot: %+v, want its one run going on", l.Runs)
	}
	var out []byte
	for _, e := range l.Entries {
		if e.Stream == capture.LogStdout {
			out = append(out, e.Payload()...)
		}
	}
	counted(t, "the original's log", out)
}

// keptOutput reads process pid's captured log in sandbox sb through GET
// …/logs/{pid} as records, checking that every record and every loss
// stands where its stream had come, and returns each stream's bytes
// read, its bytes lost before them, and where it ended.
func (k *kilnd) keptOutput(t *testing.T, sb, pid string) (out map[string][]byte, lost, end map[string]int64) {
	t.Helper()
	out, lost, end = map[string][]byte{}, map[string]int64{}, map[string]int64{}
	k.ndjson(t, t.Context(), "/sandboxes/"+sb+"/logs/"+pid, func(r api.LogRecord) bool {
		if r.Gap != 0 || r.Offset == nil || *r.Offset != end[r.Stream] {
			t.Fatalf("%s: record %+v, its stream at %d", sb, r, end[r.Stream])
		}
		if r.LostBytes > 0 {
			lost[r.Stream] += r.LostBytes
			end[r.Stream] += r.LostBytes
			return true
		}
		b := []byte(r.Text)
		if !r.Partial {
			b = append(b, '\n')
		}
		out[r.Stream] = append(out[r.Stream], b...)
		end[r.Stream] += int64(len(b))
		return true
	})
	return out, lost, end
}

// TestSnapshotKeepsUncapturedOutput: a snapshot of a running sandbox's
// files keeps, of each process not captured, what its ring still holds up
// to the snapshot's offsets; a sandbox made from it, and the sandbox
// rolled back to it, read that as the history's output, at its offsets,
// the bytes the ring no longer held counted lost before them, exactly.
func TestSnapshotKeepsUncapturedOutput(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	sb := k.made(t, "{}")
	// More than the ring holds (1 MiB): the oldest is gone, the two
	// lines of stderr first among it.
	const lines = 200000
	var big, small api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "python3", Args: []string{"-c", fmt.Sprintf(`import sys, time
sys.stderr.write("err 1\nerr 2\n"); sys.stderr.flush()
for i in range(%d):
    sys.stdout.write("%%07d\n" %% i)
sys.stdout.flush()
time.sleep(1000)`, lines)}}, &big)
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "printf", Args: []string{`hello\nwor`}}, &small)
	for k.processOf(t, sb, big.ID).Streams["stdout"].TotalBytes < 8*lines || k.processOf(t, sb, small.ID).State != api.StateExited {
		time.Sleep(50 * time.Millisecond)
	}
	snap := k.snapshotOf(t, sb, "")
	offsets := map[string]map[string]int64{}
	for _, p := range snap.Processes {
		offsets[p.ID] = map[string]int64{"stdout": p.Streams["stdout"].TotalBytes, "stderr": p.Streams["stderr"].TotalBytes}
	}
	if offsets[big.ID]["stdout"] != 8*lines || offsets[big.ID]["stderr"] != 12 || offsets[small.ID]["stdout"] != 9 {
		t.Fatalf("the snapshot's offsets: %v", offsets)
	}
	var all bytes.Buffer
	for i := range lines {
		fmt.Fprintf(&all, "%07d\n", i)
	}

	check := func(where string) {
		t.Helper()
		out, lost, end := k.keptOutput(t, where, big.ID)
		if end["stdout"] != 8*lines || end["stderr"] != 12 {
			t.Errorf("%s: the kept output ends at %v, the snapshot's offsets are %v", where, end, offsets[big.ID])
		}
		kept := int64(len(out["stdout"]))
		if lost["stdout"] == 0 || kept < 512<<10 || lost["stdout"]+kept != 8*lines || !bytes.Equal(out["stdout"], all.Bytes()[lost["stdout"]:]) {
			t.Errorf("%s: stdout: %d bytes lost, then %d kept: want the ring's last bytes, exactly after what it lost", where, lost["stdout"], kept)
		}
		if lost["stderr"]+int64(len(out["stderr"])) != 12 || !bytes.HasSuffix([]byte("err 1\nerr 2\n"), out["stderr"]) {
			t.Errorf("%s: stderr: %d lost, then %q", where, lost["stderr"], out["stderr"])
		}
		bigLost := lost
		out, lost, end = k.keptOutput(t, where, small.ID)
		if string(out["stdout"]) != "hello\nwor" || len(lost) != 0 || end["stdout"] != 9 {
			t.Errorf("%s: the short process's output %q, lost %v", where, out, lost)
		}
		var logs []api.CapturedLog
		k.json("GET", "/sandboxes/"+where+"/logs", nil, &logs)
		runs := map[string][]api.Run{}
		for _, l := range logs {
			runs[l.Process] = l.Runs
		}
		if r := runs[big.ID]; len(r) != 1 || r[0].State != "lossy" || r[0].Dropped["stdout"] != bigLost["stdout"] || r[0].Dropped["stderr"] != bigLost["stderr"] {
			t.Errorf("%s: the kept run %+v", where, r)
		}
		if r := runs[small.ID]; len(r) != 1 || r[0].State != api.RunLossless {
			t.Errorf("%s: the short process's kept run %+v", where, r)
		}
	}
	f := k.createFrom(t, snap.ID)
	var procs []api.Process
	k.json("GET", "/sandboxes/"+f+"/exec-stream", nil, &procs)
	for _, p := range procs {
		if p.ID == big.ID && (p.State != api.StateForked || p.ForkedFrom == nil || p.ForkedFrom.Offsets["stdout"] != 8*lines) {
			t.Errorf("the history's process %+v", p)
		}
	}
	check(f)
	k.json("POST", "/sandboxes/"+sb+"/rollback?timeout=0", api.RollbackRequest{Snapshot: snap.ID}, nil)
	check(sb)
}

// TestStoppedSnapshotCommands: a snapshot of a stopped sandbox lists its
// processes (those its captured logs know) with their commands and the
// exits observed, from the records kilnd has: its events of them; after
// a restart, which loses those, the snapshots taken before; and the init
// command's, which its agent recorded, whatever else is gone.
func TestStoppedSnapshotCommands(t *testing.T) {
	k := start(t, "")
	defer func() { k.cleanup() }()
	sb := k.made(t, `{"init":{"command":"sh","args":["-c","until [ -e /workspace/done ]; do sleep 0.05; done; echo up"]}}`)
	var x api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "echo", Args: []string{"hi"}, Capture: true}, &x)
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+x.ID+"/wait", nil, nil)
	// The init ends once the file is there, and the sandbox's end kills
	// what still runs in it: the touch may be killed before its exit is
	// reported, or its request refused, so only the sandbox's stop counts.
	k.do("POST", "/sandboxes/"+sb+"/exec", k.d.Token(), api.ExecRequest{Command: "touch", Args: []string{"/workspace/done"}})
	for deadline := time.Now().Add(30 * time.Second); k.info(t, sb).State != api.SandboxStopped; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox still runs 30 s after its init's file was made: %+v", k.info(t, sb))
		}
	}
	commands := func(snap api.Snapshot) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, p := range snap.Processes {
			desc := strings.Join(append([]string{p.Command}, p.Args...), " ")
			if p.ExitCode != nil {
				desc += fmt.Sprintf(" (exit %d)", *p.ExitCode)
			}
			if p.ID == x.ID {
				out["x"] = desc
			} else {
				out["init"] = desc
			}
		}
		return out
	}
	want := map[string]string{
		"init": "sh -c until [ -e /workspace/done ]; do sleep 0.05; done; echo up (exit 0)",
		"x":    "echo hi (exit 0)",
	}
	s1 := k.snapshotOf(t, sb, "")
	if got := commands(s1); !maps.Equal(got, want) {
		t.Errorf("the stopped sandbox's snapshot lists %v, want %v", got, want)
	}
	k.stop()
	k = start(t, k.state)
	s2 := k.snapshotOf(t, sb, "")
	if got := commands(s2); !maps.Equal(got, want) {
		t.Errorf("after a restart, with a snapshot taken before: %v, want %v", got, want)
	}
	for _, s := range []api.Snapshot{s1, s2} {
		if code, b := k.do("DELETE", "/snapshots/"+s.ID, k.d.Token(), nil); code != http.StatusNoContent {
			t.Fatalf("remove snapshot: %d %s", code, b)
		}
	}
	want["x"] = "" // nothing kilnd has recorded says its command
	if got := commands(k.snapshotOf(t, sb, "")); !maps.Equal(got, want) {
		t.Errorf("after a restart, with no snapshot before: %v, want %v", got, want)
	}
}
