package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// A node killed while a process of its sandbox streams output: what of
// it the cluster holds afterwards, and what the kill cost.

// killWorkload is one sustained stream of output.
type killWorkload struct {
	name, script string
}

var killWorkloads = []killWorkload{
	// Short lines at an ordinary rate: about 10,000 lines, 140 kB, a
	// second.
	{"lines", `i=0; while :; do printf 'line-%08d\n' $i; i=$((i+1)); [ $((i%100)) -ne 0 ] || sleep 0.01; done`},
	// A flood: as fast as a pipe takes it.
	{"flood", `yes 'a line of output, flooded'`},
}

// killRun is one workload's figures.
type killRun struct {
	workload killWorkload
	// before is the process's stdout total as its node told it right
	// before the kill: what it had produced by then, at least.
	before int64
	// held is what the cluster's copy holds of stdout afterwards, and
	// gapped what its gap records say never reached it (the export fell
	// behind the ring, or NATS was down).
	held, gapped int64
	gaps         int
	lostAfter    time.Duration
}

// lostAtKill is what the process had produced before the kill that the
// copy neither holds nor records as a gap: the kill's cost, at least.
func (r killRun) lostAtKill() int64 { return max(r.before-r.held-r.gapped, 0) }

type clusterKillFigures struct {
	owner, via string
	runs       []killRun
}

// measureClusterKill kills a node's kilnd (SIGKILL, its embedded NATS
// server with it) while a process of its sandbox streams, once for each
// workload, reads the cluster's copy once another node lists the node
// lost, and starts the node again, which adopts the sandbox.
func measureClusterKill(ctx context.Context, cfg config, cl *benchCluster) (clusterFigures, error) {
	owner, via := cl.nodes[2], cl.nodes[0]
	js, err := cl.jetStream()
	if err != nil {
		return nil, err
	}
	f := &clusterKillFigures{owner: owner.name, via: via.name}
	for _, w := range killWorkloads {
		r := killRun{workload: w}
		var sb daemon.Info
		if err := owner.local.call(ctx, "POST", "/sandboxes", map[string]any{"node": owner.name}, &sb); err != nil {
			return nil, err
		}
		var st api.Started
		if err := owner.local.call(ctx, "POST", "/sandboxes/"+sb.ID+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", w.script}}, &st); err != nil {
			return nil, err
		}
		// Under way: some of it in the cluster.
		deadline := time.Now().Add(time.Minute)
		for {
			n, _, err := exportOf(ctx, js, owner.name, sb.ID, st.ID)
			if err == nil && n >= 256<<10 {
				break
			}
			if werr := owner.wait(ctx, deadline); werr != nil {
				return nil, fmt.Errorf("%s: the copy holds %d bytes (%v): %w", w.name, n, err, werr)
			}
		}
		var p api.Process
		if err := owner.local.call(ctx, "GET", "/sandboxes/"+sb.ID+"/exec-stream/"+st.ID, nil, &p); err != nil {
			return nil, err
		}
		killed := time.Now()
		owner.cmd.Process.Kill()
		<-owner.done
		r.before = p.Streams["stdout"].TotalBytes
		deadline = killed.Add(clusterLostAfter + time.Minute)
		for {
			var nodes []api.Node
			err := via.c.call(ctx, "GET", "/nodes", nil, &nodes)
			i := slices.IndexFunc(nodes, func(n api.Node) bool { return n.Name == owner.name })
			if err == nil && i >= 0 && nodes[i].State == api.NodeLost {
				r.lostAfter = time.Since(killed)
				break
			}
			if werr := via.wait(ctx, deadline); werr != nil {
				return nil, fmt.Errorf("node %s does not list %s lost (%v): %w", via.name, owner.name, err, werr)
			}
		}
		if r.held, r.gapped, r.gaps, err = readCopy(ctx, js, owner.name, sb.ID, st.ID); err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.progress, "cluster: %s killed during %s: %s produced before, %s in the copy, %s in %d gaps, %s lost at the kill\n",
			owner.name, w.name, bytesText(r.before), bytesText(r.held), bytesText(r.gapped), r.gaps, bytesText(r.lostAtKill()))
		f.runs = append(f.runs, r)
		// The node again, for what follows; its sandbox is deleted with
		// the others at the end.
		if err := owner.run(ctx, cl.exe); err != nil {
			return nil, err
		}
		deadline = time.Now().Add(clusterFormWithin)
		if err := owner.untilReady(ctx, deadline); err != nil {
			return nil, err
		}
		if err := via.untilNodesReady(ctx, deadline, len(cl.nodes)); err != nil {
			return nil, err
		}
		owner.local.call(ctx, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", nil, nil)
	}
	return f, nil
}

func (f *clusterKillFigures) write(b *strings.Builder) {
	b.WriteString("### A node killed while its process streams\n\n")
	fmt.Fprintf(b, "A process of a sandbox on %s streams output without end; once the cluster's copy holds 256 KiB of it, %s is\n"+
		"asked for the process's stdout total (what it had produced by then, at least) and its kilnd killed with SIGKILL\n"+
		"(its embedded NATS server with it; the sandbox runs on). Once %s lists it lost, the copy is read from JetStream:\n"+
		"what it holds, and what its gap records say never reached it (the export fell behind the ring). Lost at the kill is\n"+
		"what had been produced before it and is neither: what a node's death costs, at least. The node is started again\n"+
		"after each.\n\n", f.owner, f.owner, f.via)
	b.WriteString("| workload | produced before the kill | readable from JetStream | gaps recorded | lost at the kill | listed lost after |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range f.runs {
		fmt.Fprintf(b, "| %s (`%s`) | %s | %s | %s in %d | %s | %s |\n", r.workload.name, r.workload.script, bytesText(r.before),
			bytesText(r.held), bytesText(r.gapped), r.gaps, bytesText(r.lostAtKill()), ms(r.lostAfter))
	}
	b.WriteString("\n")
}

func (f *clusterKillFigures) targets(b *strings.Builder) {
	for _, r := range f.runs {
		fmt.Fprintf(b, "| a node killed during %s: bytes produced before the kill and in no copy | %d | measured | – |\n", r.workload.name, r.lostAtKill())
	}
}
