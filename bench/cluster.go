package main

import (
	"context"
	"encoding/json"
	"errors"
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
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// The cluster section: three kilnds, each a process of kilnd's binary
// with its own state directory and an embedded NATS server of a
// three-server cluster, on loopback. A request through a node that does
// not own the sandbox is forwarded to the one that does; the section puts
// that beside the same request made to the owner, in the same run.

const (
	clusterNodes = 3
	// clusterCreates are the creates each way (config.kilndScale divides
	// them), after one unmeasured each way.
	clusterCreates   = 30
	clusterListCalls = 20
	// clusterFormWithin bounds the wait for the cluster to form: every
	// node ready, and listing the three ready.
	clusterFormWithin = 2 * time.Minute

	targetClusterCreateOverhead = 5 * time.Millisecond // create p50, through a non-owner less through the owner, at most
	targetClusterAttachRatio    = 0.7                  // attach throughput, through a non-owner over through the owner, at least
	targetClusterList           = 100 * time.Millisecond
)

// clusterCase is one measurement of the running cluster. The section runs
// them in order on the same three kilnds; each returns its figures, which
// write their part of the report and their rows of its targets.
type clusterCase struct {
	key     string // its name for -cluster-cases
	name    string
	measure func(ctx context.Context, cfg config, cl *benchCluster) (clusterFigures, error)
}

type clusterFigures interface {
	// write writes how the figures were taken and their table.
	write(b *strings.Builder)
	// targets writes their rows of the section's table of targets:
	// | figure | value | target | result |.
	targets(b *strings.Builder)
}

// clusterCases are the cluster section's measurements, in the order they
// run. The kill during a stream starts its node again; the replay kills a
// node, so it runs last; benchCluster.stop starts
// a node that is not running again on its state before deleting its
// sandboxes.
var clusterCases = []clusterCase{
	{"create", "create through a non-owner", measureClusterCreate},
	{"attach", "attach through a non-owner", measureClusterAttach},
	{"list", "list of the whole cluster", measureClusterList},
	{"export", "a burst with the output export on and off", measureClusterExport},
	{"kill", "a node killed while its process streams", measureClusterKill},
	{"replay", "replay of a lost node's process", measureClusterReplay},
}

type clusterResult struct {
	kilnd   string        // the binary the nodes ran
	formed  time.Duration // the first node's start to every node ready, listing the three ready
	figures []clusterFigures
	stopped time.Duration // what was left deleted, and the nodes stopped
	skipped string
}

// clusterNode is one kilnd of the cluster, a process of its own.
type clusterNode struct {
	name  string
	state string   // its state directory
	args  []string // its flags, as it was started and would be again
	api   string   // its API's TCP address
	nats  string   // its embedded NATS server's client address
	log   string   // its stderr and stdout
	cmd   *exec.Cmd
	done  chan struct{} // closed once the process has exited
	c     client        // its API over TCP, with the cluster's token
	local client        // its unix socket
}

type benchCluster struct {
	exe   string
	base  string // the nodes' state directories and logs are in it
	nodes []*clusterNode
	// solo is a kilnd of the same binary in no cluster, once the export
	// case has started it: the same burst with no export.
	solo *clusterNode
	// A NATS client of the cluster's JetStream, once a case has asked.
	nc *nats.Conn
	js jetstream.JetStream
}

// all are the kilnds the section has started or may start.
func (cl *benchCluster) all() []*clusterNode {
	if cl.solo != nil {
		return append(slices.Clip(cl.nodes), cl.solo)
	}
	return cl.nodes
}

// measureCluster starts the cluster, runs each case on it, and stops it,
// every sandbox deleted first: a sandbox outlives its kilnd.
func measureCluster(ctx context.Context, cfg config) (_ *clusterResult, err error) {
	res := &clusterResult{}
	if os.Geteuid() != 0 {
		res.skipped = "kilnd needs root"
		return res, nil
	}
	base, err := os.MkdirTemp("", "sandkiln-bench-cluster-")
	if err != nil {
		return nil, err
	}
	if res.kilnd, err = clusterKilnd(ctx, cfg, base); err != nil {
		os.RemoveAll(base)
		return nil, err
	}
	cl := &benchCluster{exe: res.kilnd}
	defer func() {
		start := time.Now()
		serr := cl.stop(context.WithoutCancel(ctx))
		res.stopped = time.Since(start)
		if serr != nil {
			// The state is kept: what is in it may still run.
			err = errors.Join(err, fmt.Errorf("stopping the cluster (its state is left in %s): %w", base, serr))
			return
		}
		fmt.Fprintf(cfg.progress, "cluster: sandboxes deleted and nodes stopped in %v\n", res.stopped.Round(time.Millisecond))
		os.RemoveAll(base)
	}()
	start := time.Now()
	if err := cl.start(ctx, base); err != nil {
		return nil, err
	}
	res.formed = time.Since(start)
	fmt.Fprintf(cfg.progress, "cluster: %d nodes ready after %v\n", len(cl.nodes), res.formed.Round(time.Millisecond))
	for _, cc := range clusterCases {
		if cfg.clusterCases != nil && !cfg.clusterCases[cc.key] {
			continue
		}
		f, err := cc.measure(ctx, cfg, cl)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cc.name, err)
		}
		res.figures = append(res.figures, f)
	}
	return res, nil
}

// clusterKilnd is the kilnd binary the nodes run: cfg.kilnd, or one built
// for the run into dir.
func clusterKilnd(ctx context.Context, cfg config, dir string) (string, error) {
	if cfg.kilnd != "" {
		exe, err := filepath.Abs(cfg.kilnd)
		if err == nil {
			_, err = os.Stat(exe)
		}
		if err != nil {
			return "", fmt.Errorf("-kilnd: %w (make build makes ./kilnd)", err)
		}
		return exe, nil
	}
	exe := filepath.Join(dir, "kilnd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", exe, "github.com/sandkiln/sandkiln/cmd/kilnd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build kilnd: %v: %s", err, out)
	}
	return exe, nil
}

// start starts the nodes on loopback ports, one after another (each picks
// its egress range as it starts, among those the others have taken), and
// waits for the cluster: every node's /readyz 200, and its /nodes listing
// the three ready.
func (cl *benchCluster) start(ctx context.Context, base string) error {
	ports, err := freePorts(3 * clusterNodes)
	if err != nil {
		return err
	}
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	cl.base = base
	for i := range clusterNodes {
		n := &clusterNode{name: "n" + strconv.Itoa(i+1), api: addr(ports[3*i]), nats: addr(ports[3*i+1])}
		n.state = filepath.Join(base, n.name)
		n.log = filepath.Join(base, n.name+".log")
		var routes []string
		for j := range clusterNodes {
			if j != i {
				routes = append(routes, "nats-route://"+addr(ports[3*j+2]))
			}
		}
		n.args = []string{"--state-dir", n.state, "--listen", n.api, "--node", n.name, "--cluster", "embedded",
			"--cluster-listen", n.nats, "--cluster-route-listen", addr(ports[3*i+2]), "--cluster-routes", strings.Join(routes, ","),
			"--node-lost-after", clusterLostAfter.String()}
		n.local = unixClient(filepath.Join(n.state, daemon.SocketName))
		cl.nodes = append(cl.nodes, n)
		if err := n.run(ctx, cl.exe); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(clusterFormWithin)
	for _, n := range cl.nodes {
		if err := n.untilReady(ctx, deadline); err != nil {
			return err
		}
	}
	for _, n := range cl.nodes {
		if err := n.untilNodesReady(ctx, deadline, len(cl.nodes)); err != nil {
			return err
		}
	}
	return nil
}

// run starts n's kilnd and waits until it serves on its unix socket.
func (n *clusterNode) run(ctx context.Context, exe string) error {
	log, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// Not CommandContext: an interrupted run still deletes the sandboxes
	// through the nodes before it stops them. A process group of its own,
	// so that the terminal's Ctrl-C reaches the bench alone, which does
	// that.
	cmd := exec.Command(exe, n.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	log.Close()
	if err != nil {
		return fmt.Errorf("node %s: %w", n.name, err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func() {
		cmd.Wait()
		close(n.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := n.local.call(ctx, "GET", "/healthz", nil, nil); err == nil {
			return nil
		}
		if err := n.wait(ctx, deadline); err != nil {
			return fmt.Errorf("node %s does not serve: %w", n.name, err)
		}
	}
}

// wait waits a moment before n is asked again: an error if n's kilnd has
// exited, the deadline has passed or ctx is done.
func (n *clusterNode) wait(ctx context.Context, deadline time.Time) error {
	if time.Now().After(deadline) {
		return fmt.Errorf("not by the deadline%s", n.logTail())
	}
	select {
	case <-n.done:
		return fmt.Errorf("kilnd exited: %v%s", n.cmd.ProcessState, n.logTail())
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(100 * time.Millisecond):
		return nil
	}
}

// untilReady waits for n's /readyz to answer 200, and takes the cluster's
// token it has then written for its TCP client.
func (n *clusterNode) untilReady(ctx context.Context, deadline time.Time) error {
	for {
		if err := n.local.call(ctx, "GET", "/readyz", nil, nil); err == nil {
			break
		}
		if err := n.wait(ctx, deadline); err != nil {
			return fmt.Errorf("node %s not ready: %w", n.name, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(n.state, daemon.ClusterTokenName))
	if err != nil {
		return fmt.Errorf("node %s: %w", n.name, err)
	}
	n.c = tcpClient(n.api, strings.TrimSpace(string(b)))
	return nil
}

// untilNodesReady waits for n's GET /nodes to list want nodes, every one
// ready.
func (n *clusterNode) untilNodesReady(ctx context.Context, deadline time.Time, want int) error {
	for {
		var nodes []api.Node
		err := n.c.call(ctx, "GET", "/nodes", nil, &nodes)
		ready := 0
		for _, d := range nodes {
			if d.State == api.NodeReady {
				ready++
			}
		}
		if err == nil && len(nodes) == want && ready == want {
			return nil
		}
		if werr := n.wait(ctx, deadline); werr != nil {
			return fmt.Errorf("node %s lists %d nodes, %d ready (%v), want %d ready: %w", n.name, len(nodes), ready, err, want, werr)
		}
	}
}

// logTail is the end of n's log, for an error.
func (n *clusterNode) logTail() string {
	b, _ := os.ReadFile(n.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "; its log ends:\n" + string(b)
}

func (n *clusterNode) running() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// stop deletes every node's sandboxes through its own socket (a node not
// running is started again on its state for it), then stops the nodes
// with SIGTERM, as a service manager would.
func (cl *benchCluster) stop(ctx context.Context) error {
	if cl.nc != nil {
		cl.nc.Close()
	}
	nodes := cl.all()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			if n.cmd == nil {
				return // never started
			}
			if !n.running() {
				if errs[i] = n.run(ctx, cl.exe); errs[i] != nil {
					return
				}
			}
			errs[i] = n.deleteAll(ctx)
		})
	}
	wg.Wait()
	for _, n := range nodes {
		if n.running() {
			n.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for i, n := range nodes {
		if n.cmd == nil {
			continue
		}
		select {
		case <-n.done:
		case <-time.After(30 * time.Second):
			n.cmd.Process.Kill()
			<-n.done
			errs[i] = errors.Join(errs[i], fmt.Errorf("node %s: not stopped 30s after SIGTERM; killed%s", n.name, n.logTail()))
		}
		n.local.http.CloseIdleConnections()
		if n.c.http != nil {
			n.c.http.CloseIdleConnections()
		}
	}
	return errors.Join(errs...)
}

// deleteAll deletes n's own sandboxes, and their logs.
func (n *clusterNode) deleteAll(ctx context.Context) error {
	var list []daemon.Info
	if err := n.local.call(ctx, "GET", "/sandboxes", nil, &list); err != nil {
		return fmt.Errorf("node %s: %w", n.name, err)
	}
	var errs []error
	for _, sb := range list {
		if sb.Node != "" && sb.Node != n.name {
			continue
		}
		if err := n.local.call(ctx, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", nil, nil); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.name, err))
		}
	}
	return errors.Join(errs...)
}

// freePorts are n TCP ports on loopback nothing listens on, each taken
// and let go.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tcpClient calls a kilnd's API at addr over TCP with token: a client's
// "http://kilnd" and "ws://kilnd" URLs are sent to addr, as its own Host.
func tcpClient(addr, token string) client {
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	return client{http: &http.Client{Transport: toAddr{addr: addr, token: token, next: tr}}}
}

type toAddr struct {
	addr, token string
	next        *http.Transport
}

func (t toAddr) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = t.addr, t.addr
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.next.RoundTrip(r)
}

func (t toAddr) CloseIdleConnections() { t.next.CloseIdleConnections() }

// Creates: the same create, placed on the owner by "node", made through
// the owner and through another node, which forwards it; each deleted
// through the node it was made through.

type clusterCreateFigures struct {
	owner, via             string
	ownCreates, viaCreates []time.Duration
	ownDeletes, viaDeletes []time.Duration
	madeAhead              int // of the creates, those that took a sandbox made ahead
}

func measureClusterCreate(ctx context.Context, cfg config, cl *benchCluster) (clusterFigures, error) {
	owner, via := cl.nodes[1], cl.nodes[0]
	f := &clusterCreateFigures{owner: owner.name, via: via.name}
	body := map[string]any{"node": owner.name}
	cycle := func(c client) (created, deleted time.Duration, err error) {
		start := time.Now()
		var info daemon.Info
		if err := c.call(ctx, "POST", "/sandboxes", body, &info); err != nil {
			return 0, 0, err
		}
		created = time.Since(start)
		if info.Node != owner.name {
			return 0, 0, fmt.Errorf("created on node %q, want %s", info.Node, owner.name)
		}
		start = time.Now()
		if err := c.call(ctx, "DELETE", "/sandboxes/"+info.ID+"?remove_logs=true", nil, nil); err != nil {
			return 0, 0, err
		}
		return created, time.Since(start), nil
	}
	n := clusterCreates / max(1, cfg.kilndScale)
	taken, err := owner.metric(ctx, "kilnd_sandbox_creates_made_ahead_total")
	if err != nil {
		return nil, err
	}
	// Alternated, each way first in turn; the first of each unmeasured.
	// Each create after the owner has made its sandboxes ahead again, as
	// a create at an everyday pace finds them: back to back, every create
	// would wait for one, and the two ways for each other's.
	for i := range n + 1 {
		ways := []struct {
			c                client
			creates, deletes *[]time.Duration
		}{{owner.c, &f.ownCreates, &f.ownDeletes}, {via.c, &f.viaCreates, &f.viaDeletes}}
		if i%2 == 1 {
			ways[0], ways[1] = ways[1], ways[0]
		}
		for _, w := range ways {
			if err := owner.untilMadeAhead(ctx); err != nil {
				return nil, err
			}
			c, d, err := cycle(w.c)
			if err != nil {
				return nil, err
			}
			if i > 0 {
				*w.creates, *w.deletes = append(*w.creates, c), append(*w.deletes, d)
			}
		}
	}
	after, err := owner.metric(ctx, "kilnd_sandbox_creates_made_ahead_total")
	if err != nil {
		return nil, err
	}
	f.madeAhead = int(after - taken)
	fmt.Fprintf(cfg.progress, "cluster: create on %s, %d each way: through it p50 %v, through %s p50 %v\n", owner.name, n,
		pct(f.ownCreates, 50), via.name, pct(f.viaCreates, 50))
	return f, nil
}

// untilMadeAhead waits until n holds as many sandboxes made ahead as
// kilnd makes by default.
func (n *clusterNode) untilMadeAhead(ctx context.Context) error {
	want := float64(daemon.DefaultWarm[sandbox.RuntimeNamespaces])
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := n.metric(ctx, `kilnd_sandboxes_made_ahead{runtime="namespaces"}`)
		if err == nil && v >= want {
			return nil
		}
		if werr := n.wait(ctx, deadline); werr != nil {
			return fmt.Errorf("node %s: %v sandboxes made ahead (%v), want %v: %w", n.name, v, err, want, werr)
		}
	}
}

// metric is the value of series (a name, and its labels as the
// exposition writes them) in n's GET /metrics.
func (n *clusterNode) metric(ctx context.Context, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://kilnd/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := n.local.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("node %s: no %s in its metrics", n.name, series)
}

func (f *clusterCreateFigures) overhead() time.Duration {
	return pct(f.viaCreates, 50) - pct(f.ownCreates, 50)
}

func (f *clusterCreateFigures) write(b *strings.Builder) {
	b.WriteString("### Create through a node that forwards it\n\n")
	fmt.Fprintf(b, "`POST /sandboxes` with `{\"node\": \"%s\"}`, made through %s itself and through %s, which forwards it to\n"+
		"%s (the cluster's reverse proxy, over loopback TCP), each deleted at once through the node it was made\n"+
		"through; the two alternated, each first in turn, %d of each after one unmeasured. A node keeps %d\n"+
		"sandboxes made ahead (kilnd's default), which a create of this shape takes: each create waits until\n"+
		"%s has them again (`kilnd_sandboxes_made_ahead`), as one at an everyday pace finds them; %d of the %d took one.\n\n",
		f.owner, f.owner, f.via, f.owner, len(f.ownCreates), daemon.DefaultWarm[sandbox.RuntimeNamespaces],
		f.owner, f.madeAhead, 2*(len(f.ownCreates)+1))
	b.WriteString("| through | create p50 | create p99 | delete p50 | delete p99 |\n|---|---:|---:|---:|---:|\n")
	fmt.Fprintf(b, "| %s, the owner | %s | %s | %s | %s |\n", f.owner, ms(pct(f.ownCreates, 50)), ms(pct(f.ownCreates, 99)), ms(pct(f.ownDeletes, 50)), ms(pct(f.ownDeletes, 99)))
	fmt.Fprintf(b, "| %s, forwarded | %s | %s | %s | %s |\n\n", f.via, ms(pct(f.viaCreates, 50)), ms(pct(f.viaCreates, 99)), ms(pct(f.viaDeletes, 50)), ms(pct(f.viaDeletes, 99)))
	fmt.Fprintf(b, "Forwarded less through the owner: create p50 %s, and the median of each pair's difference %s;\n"+
		"delete p50 %s.\n\n", ms(f.overhead()), ms(pairedDiff(f.viaCreates, f.ownCreates)), ms(pct(f.viaDeletes, 50)-pct(f.ownDeletes, 50)))
}

// pairedDiff is the median of a[i]-b[i]: each pair ran one after the other.
func pairedDiff(a, b []time.Duration) time.Duration {
	d := make([]time.Duration, len(a))
	for i := range a {
		d[i] = a[i] - b[i]
	}
	return pct(d, 50)
}

func (f *clusterCreateFigures) targets(b *strings.Builder) {
	o := f.overhead()
	fmt.Fprintf(b, "| create through a non-owner − through the owner, p50 | %s | ≤ %s | %s |\n", ms(o), ms(targetClusterCreateOverhead), verdict(o <= targetClusterCreateOverhead))
}

// Attach: a process's output read by a kiln.v1 client through the
// owner, and through another node.

type clusterAttachFigures struct {
	owner, via string
	size       int64
	own, fwd   []time.Duration
}

func measureClusterAttach(ctx context.Context, cfg config, cl *benchCluster) (clusterFigures, error) {
	owner, via := cl.nodes[1], cl.nodes[0]
	size := cfg.clusterAttach
	f := &clusterAttachFigures{owner: owner.name, via: via.name, size: size}
	var sb daemon.Info
	if err := owner.c.call(ctx, "POST", "/sandboxes", map[string]any{"node": owner.name}, &sb); err != nil {
		return nil, err
	}
	req := api.ExecRequest{Command: "head", Args: []string{"-c", strconv.FormatInt(size, 10), "/dev/zero"}, Flow: api.FlowBlock}
	read := func(c client) (time.Duration, error) {
		opts := &websocket.DialOptions{HTTPClient: c.http, Subprotocols: []string{api.ProtocolV1}}
		d, delivered, lost, err := wsRun(ctx, c, sb.ID, req, opts, "?flow=block&ack=true")
		if err == nil && (delivered != size || lost != 0) {
			err = fmt.Errorf("delivered %d bytes and lost %d of %d", delivered, lost, size)
		}
		return d, err
	}
	// One unmeasured each way, then the reps, each way first in turn.
	for rep := range cfg.reps + 1 {
		ways := []struct {
			c  client
			to *[]time.Duration
		}{{owner.c, &f.own}, {via.c, &f.fwd}}
		if rep%2 == 1 {
			ways[0], ways[1] = ways[1], ways[0]
		}
		for _, w := range ways {
			d, err := read(w.c)
			if err != nil {
				return nil, err
			}
			if rep > 0 {
				*w.to = append(*w.to, d)
			}
		}
		if rep > 0 {
			fmt.Fprintf(cfg.progress, "cluster: attach rep %d/%d: through %s %v, through %s %v\n", rep, cfg.reps,
				owner.name, f.own[rep-1].Round(time.Millisecond), via.name, f.fwd[rep-1].Round(time.Millisecond))
		}
	}
	if err := owner.c.call(ctx, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", nil, nil); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *clusterAttachFigures) gbps(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(f.size) / d.Seconds() / 1e9
	}
	return out
}

func (f *clusterAttachFigures) ratio() float64 { return median(f.gbps(f.fwd)) / median(f.gbps(f.own)) }

func (f *clusterAttachFigures) write(b *strings.Builder) {
	b.WriteString("### Attach through a node that forwards it\n\n")
	fmt.Fprintf(b, "`head -c %d /dev/zero` in a sandbox on %s, started with flow block and read by a kiln.v1 client\n"+
		"holding its output (`?flow=block&ack=true`, acking every 256 KiB as the SDK does), every byte, from the start\n"+
		"request to the exit message: through %s's TCP listener, and through %s's, which forwards the start and\n"+
		"the WebSocket to %s. The two alternated, each first in turn, after one unmeasured each way.\n\n",
		f.size, f.owner, f.owner, f.via, f.owner)
	b.WriteString("| rep | through the owner GB/s | forwarded GB/s | forwarded / owner |\n|---|---:|---:|---:|\n")
	own, fwd := f.gbps(f.own), f.gbps(f.fwd)
	for i := range own {
		fmt.Fprintf(b, "| %d | %.3f | %.3f | %.3f |\n", i+1, own[i], fwd[i], fwd[i]/own[i])
	}
	fmt.Fprintf(b, "| median | %.3f | %.3f | %.3f paired |\n\n", median(own), median(fwd), pairedRatio(fwd, own))
}

func (f *clusterAttachFigures) targets(b *strings.Builder) {
	r := f.ratio()
	fmt.Fprintf(b, "| attach throughput, through a non-owner / through the owner, of medians | %.3f | ≥ %.2f | %s |\n", r, targetClusterAttachRatio, verdict(r >= targetClusterAttachRatio))
}

// List: every node given its share of sandboxes, then the whole cluster
// listed through each node, beside that node's own.

type clusterListFigures struct {
	perNode  int
	creates  []time.Duration // every create, through its owner
	made     time.Duration   // the three nodes' creates, made at once
	seen     time.Duration   // then until every node listed them all
	nodes    []string
	whole    [][]time.Duration // per node: GET /sandboxes
	own      [][]time.Duration // per node: GET /sandboxes?node=itself
	deleted  time.Duration
	listSize int64 // bytes of one whole list
}

// Long because a benchmark reads best as its steps in the order they run.
func measureClusterList(ctx context.Context, cfg config, cl *benchCluster) (clusterFigures, error) {
	f := &clusterListFigures{perNode: cfg.clusterPerNode}
	total := f.perNode * len(cl.nodes)
	// Every node makes its own, one after another as the scale section
	// does (labelled by group in turn), the three nodes at once.
	ids := make([][]string, len(cl.nodes))
	times := make([][]time.Duration, len(cl.nodes))
	errs := make([]error, len(cl.nodes))
	start := time.Now()
	var wg sync.WaitGroup
	for i, n := range cl.nodes {
		wg.Go(func() {
			for j := range f.perNode {
				body := scaleLabels(j)
				body["node"] = n.name
				t0 := time.Now()
				var info daemon.Info
				if err := n.c.call(ctx, "POST", "/sandboxes", body, &info); err != nil {
					errs[i] = fmt.Errorf("node %s, sandbox %d: %w", n.name, j+1, err)
					return
				}
				times[i], ids[i] = append(times[i], time.Since(t0)), append(ids[i], info.ID)
				if (j+1)%100 == 0 {
					fmt.Fprintf(cfg.progress, "cluster: node %s: %d sandboxes\n", n.name, j+1)
				}
			}
		})
	}
	wg.Wait()
	f.made = time.Since(start)
	for _, t := range times {
		f.creates = append(f.creates, t...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.progress, "cluster: %d sandboxes made in %v, create p50 %v\n", total, f.made.Round(time.Millisecond), pct(f.creates, 50))
	// Each node has them all once the cluster has told it of the others'.
	start = time.Now()
	deadline := start.Add(time.Minute)
	for _, n := range cl.nodes {
		for {
			var list []daemon.Info
			err := n.c.call(ctx, "GET", "/sandboxes", nil, &list)
			if err == nil && len(list) == total {
				break
			}
			if werr := n.wait(ctx, deadline); werr != nil {
				return nil, fmt.Errorf("node %s lists %d sandboxes (%v), want %d: %w", n.name, len(list), err, total, werr)
			}
		}
	}
	f.seen = time.Since(start)
	// Through each node in turn, the whole list and its own, alternated.
	for _, n := range cl.nodes {
		f.nodes = append(f.nodes, n.name)
		var whole, own []time.Duration
		for i := range clusterListCalls + 1 {
			for _, l := range []struct {
				path  string
				want  int
				times *[]time.Duration
			}{{"/sandboxes", total, &whole}, {"/sandboxes?node=" + n.name, f.perNode, &own}} {
				d, body, err := timedGet(ctx, n.c, l.path)
				if err != nil {
					return nil, err
				}
				var list []daemon.Info
				if err := json.Unmarshal(body, &list); err != nil {
					return nil, err
				}
				if len(list) == total {
					f.listSize = int64(len(body))
				}
				if len(list) != l.want {
					return nil, fmt.Errorf("node %s: GET %s listed %d sandboxes, want %d", n.name, l.path, len(list), l.want)
				}
				if i > 0 {
					*l.times = append(*l.times, d)
				}
			}
		}
		f.whole, f.own = append(f.whole, whole), append(f.own, own)
		fmt.Fprintf(cfg.progress, "cluster: through %s: the whole cluster's %d p50 %v, its own %d p50 %v\n", n.name, total, pct(whole, 50), f.perNode, pct(own, 50))
	}
	// Deleted, each through its owner, the three nodes at once.
	start = time.Now()
	for i, n := range cl.nodes {
		wg.Go(func() {
			for _, id := range ids[i] {
				if err := n.c.call(ctx, "DELETE", "/sandboxes/"+id+"?remove_logs=true", nil, nil); err != nil {
					errs[i] = errors.Join(errs[i], err)
				}
			}
		})
	}
	wg.Wait()
	f.deleted = time.Since(start)
	fmt.Fprintf(cfg.progress, "cluster: %d sandboxes deleted in %v\n", total, f.deleted.Round(time.Millisecond))
	return f, errors.Join(errs...)
}

// timedGet is GET path through c: the time from the request to the
// answer's last byte (the client's decoding left out), and the answer.
func timedGet(ctx context.Context, c client, path string) (time.Duration, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://kilnd"+path, nil)
	if err != nil {
		return 0, nil, err
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	d := time.Since(start)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return d, b, err
}

// worst is the slowest node's p50 of the whole list.
func (f *clusterListFigures) worst() (string, time.Duration) {
	var name string
	var p time.Duration
	for i, ds := range f.whole {
		if v := pct(ds, 50); v >= p {
			name, p = f.nodes[i], v
		}
	}
	return name, p
}

func (f *clusterListFigures) write(b *strings.Builder) {
	total := f.perNode * len(f.nodes)
	b.WriteString("### The whole cluster listed through one node\n\n")
	fmt.Fprintf(b, "Each node is given %d sandboxes through its own API (`{\"node\": …}`, each labelled with one of %d groups in\n"+
		"turn, made one after another as the scale section makes them), the three nodes at once: %d made in %s,\n"+
		"create p50 %s, p99 %s; every node listed all %d %s after the last was made. Then through each\n"+
		"node in turn, %d calls of `GET /sandboxes` (the whole cluster: its own from its records, the others'\n"+
		"from what the cluster's KV has told it; %s an answer) alternated with as many of\n"+
		"`GET /sandboxes?node=` itself, after one unmeasured each, each timed from its request to its answer's\n"+
		"last byte. Then all deleted, through their owners, the three at once, in %s.\n\n",
		f.perNode, scaleGroups, total, ms(f.made), ms(pct(f.creates, 50)), ms(pct(f.creates, 99)), total, ms(f.seen),
		clusterListCalls, bytesText(f.listSize), ms(f.deleted))
	fmt.Fprintf(b, "| through | whole cluster (%d) p50 | p99 | its own (%d) p50 | p99 | whole / own, p50 |\n|---|---:|---:|---:|---:|---:|\n", total, f.perNode)
	for i, name := range f.nodes {
		w, o := pct(f.whole[i], 50), pct(f.own[i], 50)
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.2f |\n", name, ms(w), ms(pct(f.whole[i], 99)), ms(o), ms(pct(f.own[i], 99)), float64(w)/float64(o))
	}
	b.WriteString("\n")
}

func (f *clusterListFigures) targets(b *strings.Builder) {
	name, p := f.worst()
	fmt.Fprintf(b, "| GET /sandboxes of %d nodes × %d, p50 through the slowest node (%s) | %s | ≤ %s | %s |\n",
		len(f.nodes), f.perNode, name, ms(p), ms(targetClusterList), verdict(p <= targetClusterList))
}

func renderCluster(cfg config, res results) string {
	var b strings.Builder
	writeHeader(&b, cfg, res, "Cluster")
	writeCluster(&b, res.cluster)
	return b.String()
}

func writeCluster(b *strings.Builder, c *clusterResult) {
	b.WriteString("## Many nodes, one API\n\n")
	if c.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", c.skipped)
		return
	}
	fmt.Fprintf(b, "%d kilnds on this machine, each a process of `%s` with its own state directory and loopback ports,\n"+
		"`--cluster embedded` (each runs one server of a %d-server NATS cluster, routed to the others) and\n"+
		"`--node-lost-after %v` (its least: a node unheard that long is lost), every other flag its default.\n"+
		"They formed in %s: the first started to every node's `/readyz` answering 200 and its `GET /nodes` listing\n"+
		"the %d ready. Every call is over TCP with the cluster's token, which every node accepts, unless a case says\n"+
		"otherwise. At the end, every sandbox deleted (a node killed started again for it) and the kilnds stopped with\n"+
		"SIGTERM, in %s.\n\n",
		clusterNodes, filepath.Base(c.kilnd), clusterNodes, clusterLostAfter, ms(c.formed), clusterNodes, ms(c.stopped))
	for _, f := range c.figures {
		f.write(b)
	}
	b.WriteString("| figure | value | target | result |\n|---|---:|---|---|\n")
	for _, f := range c.figures {
		f.targets(b)
	}
	b.WriteString("\n")
}
