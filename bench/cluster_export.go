package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/outexport"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// The cluster section's cases of the output export: each node exports
// every process's output to JetStream as it is produced (one stream per
// node, R3 on the three embedded servers), and any node serves a lost
// node's processes from there.

const (
	// clusterLostAfter is the nodes' --node-lost-after, its least: the
	// replay case waits that long for a killed node to be lost.
	clusterLostAfter = 10 * time.Second
	// exportWithin bounds the wait for a process's end record to reach
	// the cluster's copy once the process has exited.
	exportWithin = 2 * time.Minute
	// pollEvery spaces the bench's looks at the cluster's copy.
	pollEvery = 10 * time.Millisecond

	targetExportRatio = 0.8 // a burst's rate, the export on over off, at least
	targetReplayMBps  = 100 // a lost node's process read back from JetStream, MB/s (1e6 B/s), at least
)

// jetStream is a NATS client of the cluster's JetStream, connected to the
// first node's embedded server (its --cluster-listen), which no case
// kills.
func (cl *benchCluster) jetStream() (jetstream.JetStream, error) {
	if cl.js != nil {
		return cl.js, nil
	}
	nc, err := nats.Connect("nats://"+cl.nodes[0].nats, nats.Name("bench"))
	if err != nil {
		return nil, fmt.Errorf("NATS at %s: %w", cl.nodes[0].nats, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	cl.nc, cl.js = nc, js
	return js, nil
}

// startSolo starts, once, a fourth kilnd of the same binary on this
// machine in no cluster (no --cluster: no NATS, no export), on its unix
// socket alone.
func (cl *benchCluster) startSolo(ctx context.Context) (*clusterNode, error) {
	if cl.solo != nil {
		return cl.solo, nil
	}
	n := &clusterNode{name: "solo", state: filepath.Join(cl.base, "solo"), log: filepath.Join(cl.base, "solo.log")}
	n.args = []string{"--state-dir", n.state, "--listen", ""}
	n.local = unixClient(filepath.Join(n.state, daemon.SocketName))
	cl.solo = n
	return n, n.run(ctx, cl.exe)
}

// exportOf is how far process pid's export has come in the cluster's
// copy: its stdout's offset, and whether its end record is there.
func exportOf(ctx context.Context, js jetstream.JetStream, node, sb, pid string) (int64, bool, error) {
	procs, err := outexport.Processes(ctx, js, cluster.Token(node), sb, api.SandboxNodeLost)
	if err != nil {
		return 0, false, err
	}
	for _, p := range procs {
		if p.ID == pid {
			return p.Streams["stdout"].TotalBytes, p.State == api.StateExited, nil
		}
	}
	return 0, false, nil // nothing of it there yet
}

// exportRun is how far the export of one burst got.
type exportRun struct {
	atExit int64         // the copy's stdout offset when the bench saw the exit
	ended  time.Duration // from then to the end record in the copy
	stored int64         // bytes the copy holds
	lost   int64         // bytes its gap records say never reached it
	gaps   int           // the gap records
}

// untilExported waits for process pid's end record in the cluster's copy
// (at is the offset the copy had when its exit was seen, at seen), then
// reads the copy back: what it holds and what its gaps say it lost, which
// make size between them.
func untilExported(ctx context.Context, js jetstream.JetStream, node, sb, pid string, size, at int64, seen time.Time) (exportRun, error) {
	r := exportRun{atExit: at}
	deadline := seen.Add(exportWithin)
	for {
		n, ended, err := exportOf(ctx, js, node, sb, pid)
		if err == nil && ended {
			r.ended = time.Since(seen)
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the export of process %s has its end record in the cluster's copy %v after its exit (at %d bytes, %v)", pid, exportWithin, n, err)
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(pollEvery):
		}
	}
	var err error
	if r.stored, r.lost, r.gaps, err = readCopy(ctx, js, node, sb, pid); err != nil {
		return r, err
	}
	if r.stored+r.lost != size {
		return r, fmt.Errorf("the cluster's copy of process %s holds %d bytes and its gaps %d, of %d", pid, r.stored, r.lost, size)
	}
	return r, nil
}

// readCopy reads process pid's output back from the cluster's copy as
// kilnd would serve it: the bytes it holds, and the gaps, to the
// subject's last message as the stream's leader has it (the end record
// untilExported saw there, or, of a killed node's process, what the
// copy got before the kill). It does not follow: a killed node's process
// has no end record to wait for.
func readCopy(ctx context.Context, js jetstream.JetStream, node, sb, pid string) (stored, lost int64, gaps int, err error) {
	rd, err := outexport.NewReader(ctx, js, cluster.Token(node), sb, pid, outexport.ReadOptions{})
	if err != nil {
		return 0, 0, 0, err
	}
	defer rd.CloseNow()
	for {
		typ, b, err := rd.Read(ctx)
		if errors.Is(err, io.EOF) {
			return stored, lost, gaps, nil
		}
		if err != nil {
			return 0, 0, 0, err
		}
		if typ == websocket.MessageBinary {
			stored += int64(len(b) - api.FrameHeader)
			continue
		}
		var m struct {
			Type      string `json:"type"`
			LostBytes int64  `json:"lost_bytes"`
		}
		if json.Unmarshal(b, &m) == nil && m.Type == api.TypeGap {
			lost += m.LostBytes
			gaps++
		}
	}
}

// The rate of a burst with the export on (a node of the cluster) and off
// (the solo kilnd).

type clusterExportFigures struct {
	on, off string
	size    int64
	// Per rep, each way: nobody reading (the process's own time), and a
	// kiln.v1 client holding the output (start request to exit message).
	aloneOn, aloneOff, heldOn, heldOff []time.Duration
	// How far the export got, of each measured run on the node exporting.
	aloneExport, heldExport []exportRun
	// The CPU time the kilnds took during each measured run: the three
	// nodes' for a run on one of them (the export: the exporter and the
	// servers that store and replicate its messages), the solo kilnd's
	// for a run on it; the agent and the process not included.
	aloneOnCPU, aloneOffCPU, heldOnCPU, heldOffCPU []time.Duration
	// The three nodes' CPU time during each run on the solo kilnd: the
	// cluster there, exporting nothing.
	aloneIdleCPU, heldIdleCPU []time.Duration
	// How busy the machine was during each measured run, of all its
	// CPU time: the bench's processes and everything else it runs.
	aloneOnBusy, aloneOffBusy, heldOnBusy, heldOffBusy []float64
}

// kilndsCPU is the CPU time the processes of ns have taken so far, user
// and system, from /proc/<pid>/stat (threads included, children not).
func kilndsCPU(ns []*clusterNode) time.Duration {
	var ticks int64
	for _, n := range ns {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(n.cmd.Process.Pid) + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command's name, which ends in the last ')':
		// utime and stime are the 12th and 13th.
		_, rest, _ := strings.Cut(string(b[bytes.LastIndexByte(b, ')')+1:]), " ")
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		for _, v := range f[11:13] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks are /proc's ticks a second (USER_HZ, 100 on Linux).
const clockTicks = 100

// cpuMeter measures one run: the kilnds' CPU time, and the machine's.
type cpuMeter struct {
	ns      []*clusterNode
	kilnds  time.Duration
	machine cpuTimes
}

func startCPU(ns []*clusterNode) cpuMeter {
	return cpuMeter{ns: ns, kilnds: kilndsCPU(ns), machine: readCPUTimes()}
}

// stop is the kilnds' CPU time since start, and the share of the
// machine's CPU time that was not idle.
func (m cpuMeter) stop() (time.Duration, float64) {
	k, c := kilndsCPU(m.ns)-m.kilnds, readCPUTimes()
	busy := 0.0
	if total := c.total - m.machine.total; m.machine.ok && c.ok && total > 0 {
		busy = 1 - float64(c.idle-m.machine.idle)/float64(total)
	}
	return k, busy
}

// Long because a benchmark reads best as its steps in the order they run.
func measureClusterExport(ctx context.Context, cfg config, cl *benchCluster) (clusterFigures, error) {
	on := cl.nodes[1]
	off, err := cl.startSolo(ctx)
	if err != nil {
		return nil, err
	}
	js, err := cl.jetStream()
	if err != nil {
		return nil, err
	}
	f := &clusterExportFigures{on: on.name, off: off.name, size: cfg.clusterBurst}
	alone := api.ExecRequest{Command: "head", Args: []string{"-c", strconv.FormatInt(f.size, 10), "/dev/zero"}}
	held := alone
	held.Flow = api.FlowBlock
	// A sandbox each, made and used through each kilnd's own socket.
	sbs := map[*clusterNode]string{}
	for _, n := range []*clusterNode{on, off} {
		body := map[string]any{}
		if n == on {
			body["node"] = on.name
		}
		var info daemon.Info
		if err := n.local.call(ctx, "POST", "/sandboxes", body, &info); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.name, err)
		}
		sbs[n] = info.ID
	}
	// The exit seen on the node exporting: how far its copy had come.
	var at int64
	var seen time.Time
	exitSeen := func(n *clusterNode, pid string) {
		seen, at = time.Now(), 0
		if n == on {
			at, _, _ = exportOf(ctx, js, on.name, sbs[on], pid)
		}
	}
	for rep := range cfg.reps + 1 {
		ways := []*clusterNode{on, off}
		if rep%2 == 1 {
			ways[0], ways[1] = ways[1], ways[0]
		}
		for _, n := range ways {
			kilnds := cl.nodes
			if n == off {
				kilnds = []*clusterNode{off}
			}
			meter, cluster := startCPU(kilnds), startCPU(cl.nodes)
			d, pid, err := burstAlone(ctx, n, sbs[n], alone, f.size, exitSeen)
			if err != nil {
				return nil, err
			}
			cpu, busy := meter.stop()
			idle, _ := cluster.stop()
			var ex exportRun
			if n == on {
				if ex, err = untilExported(ctx, js, on.name, sbs[on], pid, f.size, at, seen); err != nil {
					return nil, err
				}
			}
			if rep > 0 {
				if n == on {
					f.aloneOn, f.aloneExport = append(f.aloneOn, d), append(f.aloneExport, ex)
					f.aloneOnCPU, f.aloneOnBusy = append(f.aloneOnCPU, cpu), append(f.aloneOnBusy, busy)
				} else {
					f.aloneOff = append(f.aloneOff, d)
					f.aloneOffCPU, f.aloneOffBusy = append(f.aloneOffCPU, cpu), append(f.aloneOffBusy, busy)
					f.aloneIdleCPU = append(f.aloneIdleCPU, idle)
				}
			}
			meter, cluster = startCPU(kilnds), startCPU(cl.nodes)
			if d, pid, err = burstHeld(ctx, n, sbs[n], held, f.size, exitSeen); err != nil {
				return nil, err
			}
			cpu, busy = meter.stop()
			idle, _ = cluster.stop()
			if n == on {
				if ex, err = untilExported(ctx, js, on.name, sbs[on], pid, f.size, at, seen); err != nil {
					return nil, err
				}
			}
			if rep > 0 {
				if n == on {
					f.heldOn, f.heldExport = append(f.heldOn, d), append(f.heldExport, ex)
					f.heldOnCPU, f.heldOnBusy = append(f.heldOnCPU, cpu), append(f.heldOnBusy, busy)
				} else {
					f.heldOff = append(f.heldOff, d)
					f.heldOffCPU, f.heldOffBusy = append(f.heldOffCPU, cpu), append(f.heldOffBusy, busy)
					f.heldIdleCPU = append(f.heldIdleCPU, idle)
				}
			}
		}
		if rep > 0 {
			i := rep - 1
			fmt.Fprintf(cfg.progress, "cluster: burst rep %d/%d: nobody reading, export on %v (the copy holds %s, lost %s; the nodes' CPU %v), off %v (%v, the idle nodes' %v); a client holding it, on %v (holds %s, lost %s; %v), off %v (%v, %v)\n",
				rep, cfg.reps, f.aloneOn[i].Round(time.Millisecond), bytesText(f.aloneExport[i].stored), bytesText(f.aloneExport[i].lost), f.aloneOnCPU[i], f.aloneOff[i].Round(time.Millisecond), f.aloneOffCPU[i], f.aloneIdleCPU[i],
				f.heldOn[i].Round(time.Millisecond), bytesText(f.heldExport[i].stored), bytesText(f.heldExport[i].lost), f.heldOnCPU[i], f.heldOff[i].Round(time.Millisecond), f.heldOffCPU[i], f.heldIdleCPU[i])
		}
	}
	for n, id := range sbs {
		if err := n.local.call(ctx, "DELETE", "/sandboxes/"+id+"?remove_logs=true", nil, nil); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	return f, nil
}

// burstAlone runs req in sandbox sb on n with nobody reading its output,
// waits for its exit (GET …/wait, calling exitSeen at once), and returns
// the process's own time, from its start to its exit as its agent saw
// them, and its id.
func burstAlone(ctx context.Context, n *clusterNode, sb string, req api.ExecRequest, size int64, exitSeen func(*clusterNode, string)) (time.Duration, string, error) {
	path := "/sandboxes/" + sb + "/exec-stream"
	var st api.Started
	if err := n.local.call(ctx, "POST", path, req, &st); err != nil {
		return 0, "", fmt.Errorf("node %s: %w", n.name, err)
	}
	var exit api.Exit
	if err := n.local.call(ctx, "GET", path+"/"+st.ID+"/wait", nil, &exit); err != nil {
		return 0, "", fmt.Errorf("node %s: %w", n.name, err)
	}
	exitSeen(n, st.ID)
	// What it left in its pipe is read after its exit: its output ends
	// then.
	var p api.Process
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := n.local.call(ctx, "GET", path+"/"+st.ID, nil, &p); err != nil {
			return 0, "", fmt.Errorf("node %s: %w", n.name, err)
		}
		if p.Streams["stdout"].Ended {
			break
		}
		if err := n.wait(ctx, deadline); err != nil {
			return 0, "", fmt.Errorf("node %s: the burst's output has not ended: %w", n.name, err)
		}
	}
	if exit.ExitCode == nil || *exit.ExitCode != 0 || p.ExitedAt == nil || p.Streams["stdout"].TotalBytes != size {
		return 0, "", fmt.Errorf("node %s: the burst ended (%v), its output after %d bytes of %d", n.name, exit, p.Streams["stdout"].TotalBytes, size)
	}
	return p.ExitedAt.Sub(p.StartedAt), st.ID, nil
}

// burstHeld runs req (flow block) in sandbox sb on n, read through n's
// socket by a kiln.v1 client holding its output and acking as the SDK
// does; it returns the time from the start request to the exit message
// (calling exitSeen at once), and the process's id.
func burstHeld(ctx context.Context, n *clusterNode, sb string, req api.ExecRequest, size int64, exitSeen func(*clusterNode, string)) (time.Duration, string, error) {
	start := time.Now()
	var st api.Started
	if err := n.local.call(ctx, "POST", "/sandboxes/"+sb+"/exec-stream", req, &st); err != nil {
		return 0, "", fmt.Errorf("node %s: %w", n.name, err)
	}
	conn, _, err := websocket.Dial(ctx, "ws://kilnd/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs?flow=block&ack=true",
		&websocket.DialOptions{HTTPClient: n.local.http, Subprotocols: []string{api.ProtocolV1}})
	if err != nil {
		return 0, "", fmt.Errorf("node %s: %w", n.name, err)
	}
	defer conn.CloseNow()
	delivered, lost, err := readV1(ctx, conn, acker(ctx, conn))
	d := time.Since(start)
	if err != nil {
		return 0, "", fmt.Errorf("node %s: %w", n.name, err)
	}
	exitSeen(n, st.ID)
	if delivered != size || lost != 0 {
		return 0, "", fmt.Errorf("node %s: delivered %d bytes and lost %d of %d", n.name, delivered, lost, size)
	}
	return d, st.ID, nil
}

func (f *clusterExportFigures) gbps(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(f.size) / d.Seconds() / 1e9
	}
	return out
}

func (f *clusterExportFigures) ratios() (alone, held float64) {
	return median(f.gbps(f.aloneOn)) / median(f.gbps(f.aloneOff)), median(f.gbps(f.heldOn)) / median(f.gbps(f.heldOff))
}

func (f *clusterExportFigures) write(b *strings.Builder) {
	b.WriteString("### A burst with the output export on and off\n\n")
	fmt.Fprintf(b, "`head -c %d /dev/zero` in a sandbox on %s, a node of the cluster, whose kilnd exports every process's\n"+
		"output to JetStream as it is produced (its node's stream, three replicas), and in a sandbox of a fourth kilnd\n"+
		"of the same binary on this machine, %s, started without `--cluster`: no NATS, no export. Each through its\n"+
		"kilnd's unix socket, run two ways: **nobody reading**, its rate the process's own, from its start to its\n"+
		"exit as its agent saw them (`started_at`, `exited_at`; the exit waited for with `GET …/wait`); and with\n"+
		"flow block, read by **a kiln.v1 client holding it** (`?flow=block&ack=true`, acking every 256 KiB as the\n"+
		"SDK does), from the start request to the exit message. The two kilnds alternated, each first in turn, after\n"+
		"one unmeasured rep each way. After each run on %s the bench waited for the export's end record and read\n"+
		"the cluster's copy back (a NATS client of n1's server, `outexport.NewReader`) before the next run started.\n\n",
		f.size, f.on, f.off, f.on)
	fmt.Fprintf(b, "| rep | nobody reading, export on (%s) GB/s | off (%s) GB/s | on / off | a client holding it, on GB/s | off GB/s | on / off |\n"+
		"|---|---:|---:|---:|---:|---:|---:|\n", f.on, f.off)
	aOn, aOff, hOn, hOff := f.gbps(f.aloneOn), f.gbps(f.aloneOff), f.gbps(f.heldOn), f.gbps(f.heldOff)
	for i := range aOn {
		fmt.Fprintf(b, "| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", i+1, aOn[i], aOff[i], aOn[i]/aOff[i], hOn[i], hOff[i], hOn[i]/hOff[i])
	}
	fmt.Fprintf(b, "| median | %.3f | %.3f | %.3f paired | %.3f | %.3f | %.3f paired |\n\n",
		median(aOn), median(aOff), pairedRatio(aOn, aOff), median(hOn), median(hOff), pairedRatio(hOn, hOff))
	b.WriteString("The CPU time the kilnds took during each measured run, from its start request to its exit seen (the\n" +
		"three nodes' for a run on " + f.on + ": the exporter, and the servers storing and replicating its messages; the solo\n" +
		"kilnd's for a run on " + f.off + "; the agent and the process not included), how busy the machine was meanwhile\n" +
		"(the share of all its CPU time not idle, this run's processes and everything else it ran), and, during a run on\n" +
		f.off + ", the three nodes' (the cluster there, exporting nothing: what its mere presence costs).\n\n")
	b.WriteString("| rep | nobody reading: on, the nodes' CPU | busy | off, solo's CPU | the idle nodes' | busy | a client holding it: on, the nodes' CPU | busy | off, solo's CPU | the idle nodes' | busy |\n" +
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range f.aloneOnCPU {
		fmt.Fprintf(b, "| %d | %s | %.0f%% | %s | %s | %.0f%% | %s | %.0f%% | %s | %s | %.0f%% |\n", i+1,
			ms(f.aloneOnCPU[i]), 100*f.aloneOnBusy[i], ms(f.aloneOffCPU[i]), ms(f.aloneIdleCPU[i]), 100*f.aloneOffBusy[i],
			ms(f.heldOnCPU[i]), 100*f.heldOnBusy[i], ms(f.heldOffCPU[i]), ms(f.heldIdleCPU[i]), 100*f.heldOffBusy[i])
	}
	b.WriteString("\n")
	fmt.Fprintf(b, "How far the export got, each measured run on %s: the cluster's copy's stdout offset when the bench\n"+
		"saw the exit (what it held and what its gap records had counted lost by then), the time from then to the\n"+
		"export's end record in the copy, and the copy read back: the bytes it holds, and those its gap records say\n"+
		"never reached it (the export never holds the process: what a process's ring, %s, evicted before the\n"+
		"export read it is recorded as lost, exactly). Held and lost make the burst in every run.\n\n", f.on, bytesText(ring.DefaultCapacity))
	b.WriteString("| run | the copy at the exit | end record after the exit | the copy holds | lost (gap records) | gaps |\n|---|---:|---:|---:|---:|---:|\n")
	for i, ex := range f.aloneExport {
		writeExportRun(b, fmt.Sprintf("rep %d, nobody reading", i+1), ex, f.size)
	}
	for i, ex := range f.heldExport {
		writeExportRun(b, fmt.Sprintf("rep %d, a client holding it", i+1), ex, f.size)
	}
	b.WriteString("\n")
}

func writeExportRun(b *strings.Builder, name string, ex exportRun, size int64) {
	fmt.Fprintf(b, "| %s | %s, %.1f%% | %s | %s, %.1f%% | %s | %d |\n", name, bytesText(ex.atExit), 100*float64(ex.atExit)/float64(size),
		ms(ex.ended), bytesText(ex.stored), 100*float64(ex.stored)/float64(size), bytesText(ex.lost), ex.gaps)
}

func (f *clusterExportFigures) targets(b *strings.Builder) {
	alone, held := f.ratios()
	fmt.Fprintf(b, "| burst rate, export on / off, nobody reading, of medians | %.3f | ≥ %.2f | %s |\n", alone, targetExportRatio, verdict(alone >= targetExportRatio))
	fmt.Fprintf(b, "| burst rate, export on / off, a kiln.v1 client holding it, of medians | %.3f | ≥ %.2f | %s |\n", held, targetExportRatio, verdict(held >= targetExportRatio))
}

// The replay of a lost node's process from JetStream, through another
// node.

type clusterReplayFigures struct {
	owner, via string
	size       int64
	written    time.Duration // the start request to the end record in the copy
	stream     string
	replicas   int
	before     string        // the stream's servers before the kill
	lostAfter  time.Duration // the kill to via listing the owner lost
	after      string        // the stream's servers then
	reads      []time.Duration
	received   []int64
	lost       []int64
}

// Long because a benchmark reads best as its steps in the order they run.
func measureClusterReplay(ctx context.Context, cfg config, cl *benchCluster) (clusterFigures, error) {
	owner, via := cl.nodes[1], cl.nodes[0]
	js, err := cl.jetStream()
	if err != nil {
		return nil, err
	}
	f := &clusterReplayFigures{owner: owner.name, via: via.name, size: cfg.clusterReplay, stream: outexport.StreamName(cluster.Token(owner.name))}
	var sb daemon.Info
	if err := owner.local.call(ctx, "POST", "/sandboxes", map[string]any{"node": owner.name}, &sb); err != nil {
		return nil, err
	}
	req := api.ExecRequest{Command: "head", Args: []string{"-c", strconv.FormatInt(f.size, 10), "/dev/zero"}, Flow: api.FlowBlock}
	start := time.Now()
	pid, err := writeExported(ctx, js, owner, sb.ID, req)
	if err != nil {
		return nil, err
	}
	var at int64
	if at, _, err = exportOf(ctx, js, owner.name, sb.ID, pid); err == nil {
		var ex exportRun
		ex, err = untilExported(ctx, js, owner.name, sb.ID, pid, f.size, at, time.Now())
		if err == nil && ex.stored != f.size {
			err = fmt.Errorf("the cluster's copy holds %d bytes of %d (%d lost in %d gaps): the replay would not read the whole", ex.stored, f.size, ex.lost, ex.gaps)
		}
	}
	if err != nil {
		return nil, err
	}
	f.written = time.Since(start)
	var info *jetstream.StreamInfo
	if f.before, info, err = streamServers(ctx, js, f.stream); err != nil {
		return nil, err
	}
	if f.replicas = info.Config.Replicas; f.replicas != clusterNodes {
		return nil, fmt.Errorf("stream %s keeps %d replicas, not %d: its copy would go with its node", f.stream, f.replicas, clusterNodes)
	}
	fmt.Fprintf(cfg.progress, "cluster: %s written and exported in %v; %s: %s; killing %s's kilnd\n", bytesText(f.size), f.written.Round(time.Millisecond), f.stream, f.before, owner.name)

	// The owner's kilnd killed (its sandbox runs on); another node lists
	// it lost, and its sandbox node_lost.
	killed := time.Now()
	owner.cmd.Process.Kill()
	<-owner.done
	deadline := killed.Add(clusterLostAfter + time.Minute)
	for {
		var nodes []api.Node
		err := via.c.call(ctx, "GET", "/nodes", nil, &nodes)
		i := slices.IndexFunc(nodes, func(n api.Node) bool { return n.Name == owner.name })
		if err == nil && i >= 0 && nodes[i].State == api.NodeLost {
			f.lostAfter = time.Since(killed)
			break
		}
		if werr := via.wait(ctx, deadline); werr != nil {
			return nil, fmt.Errorf("node %s does not list %s lost (%v): %w", via.name, owner.name, err, werr)
		}
	}
	for {
		var got daemon.Info
		err := via.c.call(ctx, "GET", "/sandboxes/"+sb.ID, nil, &got)
		if err == nil && got.State == api.SandboxNodeLost {
			break
		}
		if werr := via.wait(ctx, deadline); werr != nil {
			return nil, fmt.Errorf("node %s: sandbox %s is %q (%v), not %s: %w", via.name, sb.ID, got.State, err, api.SandboxNodeLost, werr)
		}
	}
	var p api.Process
	if err := via.c.call(ctx, "GET", "/sandboxes/"+sb.ID+"/exec-stream/"+pid, nil, &p); err != nil {
		return nil, err
	}
	if p.State != api.StateExited || p.Streams["stdout"].TotalBytes != f.size {
		return nil, fmt.Errorf("node %s describes the lost node's process %s with %d bytes, want exited with %d", via.name, p.State, p.Streams["stdout"].TotalBytes, f.size)
	}
	if f.after, _, err = streamServers(ctx, js, f.stream); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.progress, "cluster: %s lost on %s %v after the kill; %s: %s\n", owner.name, via.name, f.lostAfter.Round(time.Millisecond), f.stream, f.after)

	// Read back through via, the whole of it each time.
	url := "ws://kilnd/sandboxes/" + sb.ID + "/exec-stream/" + pid + "/logs"
	for i := range cfg.reps {
		start := time.Now()
		conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: via.c.http, Subprotocols: []string{api.ProtocolV1}})
		if err != nil {
			return nil, err
		}
		received, lost, err := readV1(ctx, conn, nil)
		d := time.Since(start)
		conn.CloseNow()
		if err != nil {
			return nil, fmt.Errorf("replay through %s: %w", via.name, err)
		}
		f.reads, f.received, f.lost = append(f.reads, d), append(f.received, received), append(f.lost, lost)
		fmt.Fprintf(cfg.progress, "cluster: replay %d/%d through %s: %s in %v, %.0f MB/s, %d lost\n", i+1, cfg.reps, via.name,
			bytesText(received), d.Round(time.Millisecond), float64(received)/d.Seconds()/1e6, lost)
	}
	return f, nil
}

// writeExported starts req (flow block) in sandbox sb on n and reads it
// through n's socket as a kiln.v1 client holding it that takes and acks
// no more than the cluster's copy holds: the process is held back to the
// export's pace, so that the export, which never holds it, is never so
// far behind that the ring evicts what it has not read. It returns the
// process's id at its exit message.
func writeExported(ctx context.Context, js jetstream.JetStream, n *clusterNode, sb string, req api.ExecRequest) (string, error) {
	var st api.Started
	if err := n.local.call(ctx, "POST", "/sandboxes/"+sb+"/exec-stream", req, &st); err != nil {
		return "", err
	}
	conn, _, err := websocket.Dial(ctx, "ws://kilnd/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs?flow=block&ack=true&credit="+strconv.Itoa(api.CreditFrame),
		&websocket.DialOptions{HTTPClient: n.local.http, Subprotocols: []string{api.ProtocolV1}})
	if err != nil {
		return "", err
	}
	defer conn.CloseNow()
	var received atomic.Int64
	gctx, stop := context.WithCancel(ctx)
	granting := make(chan error, 1)
	go func() {
		err := grantExported(gctx, js, n.name, sb, st.ID, conn, &received)
		if err != nil {
			conn.CloseNow() // the process would wait for credit that never comes
		}
		granting <- err
	}()
	_, lost, err := readV1(ctx, conn, func(delivered, _ int64) error {
		received.Store(delivered)
		return nil
	})
	stop()
	if gerr := <-granting; gerr != nil {
		err = gerr
	}
	if err == nil && lost != 0 {
		err = fmt.Errorf("the client holding it lost %d bytes", lost)
	}
	if err != nil {
		return "", fmt.Errorf("node %s, writing the process to replay: %w", n.name, err)
	}
	return st.ID, nil
}

// grantExported acks, on conn, what of process pid's stdout the client
// has received and the cluster's copy holds, and grants credit up to what
// the copy holds, as it grows, until ctx ends.
func grantExported(ctx context.Context, js jetstream.JetStream, node, sb, pid string, conn *websocket.Conn, received *atomic.Int64) error {
	send := func(m api.ClientMessage) error {
		b, _ := json.Marshal(m)
		return conn.Write(ctx, websocket.MessageText, b)
	}
	// From the first ack, the output is held from where the client acked.
	if err := send(api.ClientMessage{Type: api.TypeAck, Offsets: map[string]int64{"stdout": 0}}); err != nil {
		return err
	}
	granted, acked := int64(api.CreditFrame), int64(0)
	var failing time.Time // since when the copy cannot be asked
	for {
		exported, _, err := exportOf(ctx, js, node, sb, pid)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && failing.IsZero():
			failing = time.Now()
		case err != nil && time.Since(failing) > exportWithin:
			return fmt.Errorf("the cluster's copy cannot be asked how far it has come: %w", err)
		case err == nil:
			failing = time.Time{}
		}
		m := api.ClientMessage{Type: api.TypeAck, Offsets: map[string]int64{"stdout": min(received.Load(), exported)}}
		if exported > granted {
			m.Type, m.Bytes, granted = api.TypeCredit, exported-granted, exported
		}
		if m.Type == api.TypeCredit || m.Offsets["stdout"] > acked {
			acked = m.Offsets["stdout"]
			if err := send(m); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pollEvery):
		}
	}
}

// streamServers describes stream's servers: its leader, and each
// replica's state.
func streamServers(ctx context.Context, js jetstream.JetStream, stream string) (string, *jetstream.StreamInfo, error) {
	var info *jetstream.StreamInfo
	var err error
	deadline := time.Now().Add(time.Minute)
	for {
		// A stream whose leader was killed has none until an election.
		var s jetstream.Stream
		if s, err = js.Stream(ctx, stream); err == nil {
			if info, err = s.Info(ctx); err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
				break
			}
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("stream %s has no leader a minute on (%v)", stream, err)
		}
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	desc := fmt.Sprintf("R%d, leader %s", info.Config.Replicas, info.Cluster.Leader)
	for _, p := range info.Cluster.Replicas {
		state := "current"
		switch {
		case p.Offline:
			state = "offline"
		case !p.Current:
			state = "behind"
		}
		heard := "not heard by this leader"
		if p.Active > 0 {
			heard = "last heard " + p.Active.Round(time.Millisecond).String() + " before"
		}
		desc += fmt.Sprintf(", %s %s (%s)", p.Name, state, heard)
	}
	return desc, info, nil
}

func (f *clusterReplayFigures) mbps() []float64 {
	out := make([]float64, len(f.reads))
	for i, d := range f.reads {
		out[i] = float64(f.received[i]) / d.Seconds() / 1e6
	}
	return out
}

// whole reports whether every read had the whole output and no gap.
func (f *clusterReplayFigures) whole() bool {
	for i := range f.reads {
		if f.received[i] != f.size || f.lost[i] != 0 {
			return false
		}
	}
	return true
}

func (f *clusterReplayFigures) write(b *strings.Builder) {
	b.WriteString("### A lost node's process read back from JetStream\n\n")
	fmt.Fprintf(b, "`head -c %d /dev/zero` in a sandbox on %s, started with flow block and read through %s's socket by a\n"+
		"kiln.v1 client that took and acked no more than the cluster's copy held (granting credit as `outexport.Processes`\n"+
		"showed the copy grow): the process held back to the export's pace, so that the copy is whole. Written and\n"+
		"exported, to the end record in the copy, in %s (%.0f MB/s). The node's stream, %s, as NATS described it:\n%s.\n\n",
		f.size, f.owner, f.owner, ms(f.written), float64(f.size)/f.written.Seconds()/1e6, f.stream, f.before)
	fmt.Fprintf(b, "Then %s's kilnd killed with SIGKILL (its embedded NATS server with it; the sandbox ran on): %s listed %s\n"+
		"lost %s after the kill, and the sandbox `node_lost`, its process `exited` with its %d bytes (from the copy).\n"+
		"The stream then, as NATS described it:\n%s.\n\nThen, %d times, a kiln.v1 client read the whole output from offset 0 through %s's TCP\n"+
		"listener (%s serving it from JetStream), from the dial to the exit message. MB/s are 10^6 B/s.\n\n",
		f.owner, f.via, f.owner, ms(f.lostAfter), f.size, f.after, len(f.reads), f.via, f.via)
	b.WriteString("| read | MB/s | received | lost |\n|---|---:|---:|---:|\n")
	mb := f.mbps()
	for i := range mb {
		fmt.Fprintf(b, "| %d | %.0f | %s | %d |\n", i+1, mb[i], bytesText(f.received[i]), f.lost[i])
	}
	fmt.Fprintf(b, "| median | %.0f | | |\n\n", median(mb))
}

func (f *clusterReplayFigures) targets(b *strings.Builder) {
	m := median(f.mbps())
	fmt.Fprintf(b, "| replay of a lost node's %s process from JetStream through another node, median, MB/s | %.0f | ≥ %d, whole | %s |\n",
		bytesText(f.size), m, targetReplayMBps, verdict(m >= targetReplayMBps && f.whole()))
}
