package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/natstest"
	"github.com/sandkiln/sandkiln/internal/outexport"
	"github.com/sandkiln/sandkiln/internal/roles"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	roles.PlayIfReexecuted()
	daemontest.NoRaceExitSleep()
	remove, err := daemontest.ShareUIDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if cfg := os.Getenv(nodeEnv); cfg != "" {
		os.Exit(serveNode(cfg))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if err := remove(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = max(code, 1)
		}
		os.Exit(code)
	}),
		// The NATS server's and client's own, ended as they shut down
		// but not waited for.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

// Quick beats for tests: unreachable after 5 missed (2 s), lost after
// lostAfter. Not quicker: on a loaded machine a node's beat can be a
// second late, and a node taken for unreachable shows its sandboxes as
// unknown.
const (
	beat      = 400 * time.Millisecond
	lostAfter = 4 * time.Second
)

// node is one kilnd of a test's cluster.
type node struct {
	name string
	k    *daemontest.Kilnd
	cfg  daemon.Config
}

func (n *node) url() string { return "http://" + n.k.Daemon.TCPAddr() }

// startNode starts kilnd name on state (a directory of t's when empty),
// a node of the cluster whose NATS servers are at urls.
func startNode(t *testing.T, name, state string, urls []string, labels map[string]string) *node {
	t.Helper()
	if state == "" {
		state = t.TempDir()
	}
	cfg := daemon.Config{StateDir: state, Listen: "127.0.0.1:0", Cluster: &cluster.Config{
		Servers: urls, Node: name, Labels: labels, Heartbeat: beat, LostAfter: lostAfter}}
	return &node{name: name, k: daemontest.StartConfigT(t, cfg), cfg: cfg}
}

// token is the cluster's API token, once a node has it.
func (n *node) token(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.k.State, daemon.ClusterTokenName))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// do calls n's API with tok; it returns the status and the body.
func (n *node) do(t *testing.T, tok, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, n.url()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// eventually waits, up to a deadline, for cond to hold; what it last
// said fails the test otherwise.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, said := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30s: %s", what, said)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodesSeen waits until n lists want's nodes in those states.
func nodesSeen(t *testing.T, n *node, tok string, want map[string]string) {
	t.Helper()
	eventually(t, n.name+" sees the nodes", func() (bool, string) {
		code, b := n.do(t, tok, "GET", "/nodes", "")
		if code != 200 {
			return false, fmt.Sprintf("%d %s", code, b)
		}
		var nodes []api.Node
		json.Unmarshal(b, &nodes)
		got := map[string]string{}
		for _, d := range nodes {
			got[d.Name] = d.State
		}
		return fmt.Sprint(got) == fmt.Sprint(want), string(b)
	})
}

func ready(t *testing.T, n *node) {
	t.Helper()
	eventually(t, n.name+" ready", func() (bool, string) {
		resp, err := http.Get(n.url() + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200, string(b)
	})
}

// TestCluster: three kilnds on a three-server NATS cluster (R3 buckets).
// Every node lists every node and sandbox; a create through one is placed
// on the node it names, by labels, or away from a drained node; a process
// of one node's sandbox runs and is watched through another, byte for
// byte; names are unique across the cluster; a node whose kilnd stops is
// unknown, then lost, to the others, never exited, and is ready again
// with its sandboxes when it comes back.
func TestCluster(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	nats := natstest.Cluster(t, 3)
	urls := nats.URLs()
	// Each node knows every server, its own first.
	a := startNode(t, "a", "", []string{urls[0], urls[1], urls[2]}, map[string]string{"zone": "east"})
	b := startNode(t, "b", "", []string{urls[1], urls[2], urls[0]}, map[string]string{"zone": "east"})
	c := startNode(t, "c", "", []string{urls[2], urls[0], urls[1]}, map[string]string{"zone": "west"})
	for _, n := range []*node{a, b, c} {
		ready(t, n)
	}
	tok := a.token(t)
	if b.token(t) != tok || c.token(t) != tok {
		t.Fatal("the nodes have different cluster tokens")
	}
	all := map[string]string{"a": api.NodeReady, "b": api.NodeReady, "c": api.NodeReady}
	for _, n := range []*node{a, b, c} {
		nodesSeen(t, n, tok, all)
	}
	// Three servers: everything the cluster keeps has three copies.
	_, js := natsClient(t, urls)
	for _, name := range []string{"KV_" + cluster.BucketNodes, "KV_" + cluster.BucketSandboxes, "KV_" + cluster.BucketNames, "KV_" + cluster.BucketCluster, outexport.StreamName("a")} {
		eventually(t, name+" has 3 replicas", func() (bool, string) {
			s, err := js.Stream(context.Background(), name)
			if err != nil {
				return false, err.Error()
			}
			return s.CachedInfo().Config.Replicas == 3, fmt.Sprint(s.CachedInfo().Config.Replicas)
		})
	}
	// Each node's own token is good on it alone; the cluster's on all.
	own, _ := os.ReadFile(filepath.Join(a.k.State, daemon.TokenName))
	if code, _ := b.do(t, strings.TrimSpace(string(own)), "GET", "/sandboxes", ""); code != http.StatusUnauthorized {
		t.Errorf("a's own token on b: %d, want 401", code)
	}

	ctx := context.Background()
	sdk := func(n *node) *client.Client {
		cl, err := client.New(client.Options{Addr: n.url(), Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	viaA, viaC := sdk(a), sdk(c)

	// Placed by name, through another node.
	web, err := viaA.CreateSandbox(ctx, client.SandboxOptions{Name: "web", Node: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := web.Info(ctx); info.Node != "b" {
		t.Fatalf("created on node %q, want b", info.Node)
	}
	// Placed by labels.
	west, err := viaA.CreateSandbox(ctx, client.SandboxOptions{Constraints: []string{"zone=west"}})
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := west.Info(ctx); info.Node != "c" {
		t.Errorf("zone=west placed on %q, want c", info.Node)
	}
	for body, want := range map[string]int{
		`{"node":"nowhere"}`:             http.StatusBadRequest,
		`{"constraints":["zone=north"]}`: http.StatusPreconditionFailed,
		`{"constraints":["zone"]}`:       http.StatusBadRequest,
		`{"name":"web","node":"c"}`:      http.StatusConflict, // the name is b's sandbox's
	} {
		if code, b := c.do(t, tok, "POST", "/sandboxes", body); code != want {
			t.Errorf("create %s: %d %s, want %d", body, code, b, want)
		}
	}

	// A process of b's sandbox, started and watched through c, every byte
	// at its offset.
	onC, err := viaC.Sandbox(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	p, err := onC.Start(ctx, client.StartOptions{Shell: "seq 1 200000; echo done >&2", Format: client.Bytes})
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for i := 1; i <= 200000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	var out, errOut bytes.Buffer
	for ch, err := range p.Output(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		buf := &out
		if ch.Stream == "stderr" {
			buf = &errOut
		}
		if ch.Lost != 0 || ch.Offset != int64(buf.Len()) {
			t.Fatalf("%s chunk at %d (lost %d) after %d bytes", ch.Stream, ch.Offset, ch.Lost, buf.Len())
		}
		buf.Write(ch.Bytes)
	}
	if !bytes.Equal(out.Bytes(), want.Bytes()) || errOut.String() != "done\n" {
		t.Fatalf("through c: %d bytes of stdout (want %d), stderr %q", out.Len(), want.Len(), errOut.String())
	}
	res, err := p.Wait(ctx)
	if err != nil || res.Exit.Code() != 0 || !res.OutputComplete {
		t.Fatalf("wait through c: %+v %v", res, err)
	}

	// Every node lists every sandbox, each with its node.
	for _, n := range []*node{a, b, c} {
		eventually(t, n.name+" lists the cluster", func() (bool, string) {
			code, body := n.do(t, tok, "GET", "/sandboxes", "")
			var list []api.Sandbox
			json.Unmarshal(body, &list)
			got := map[string]string{}
			for _, sb := range list {
				got[sb.ID] = sb.Node
			}
			return code == 200 && len(got) == 2 && got[web.ID] == "b" && got[west.ID] == "c", string(body)
		})
	}
	eventually(t, "a page of 1", func() (bool, string) {
		code, body := a.do(t, tok, "GET", "/sandboxes?state=running&limit=1", "")
		return code == 200 && strings.Count(string(body), `"id"`) == 1, fmt.Sprintf("%d %s", code, body)
	})

	// Drained, a node takes no new sandbox; a create naming it is refused.
	if code, body := a.do(t, tok, "POST", "/nodes/a/drain", ""); code != 200 || !strings.Contains(string(body), `"draining"`) {
		t.Fatalf("drain a: %d %s", code, body)
	}
	nodesSeen(t, c, tok, map[string]string{"a": api.NodeDraining, "b": api.NodeReady, "c": api.NodeReady})
	for range 3 {
		sb, err := viaA.CreateSandbox(ctx, client.SandboxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if info, _ := sb.Info(ctx); info.Node == "a" {
			t.Errorf("a drained, and still given sandbox %s", sb.ID)
		}
		if err := sb.Delete(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	if code, _ := c.do(t, tok, "POST", "/sandboxes", `{"node":"a"}`); code != http.StatusPreconditionFailed {
		t.Errorf("create on drained a: %d, want 412", code)
	}
	if code, _ := c.do(t, tok, "DELETE", "/nodes/a/drain", ""); code != 200 {
		t.Errorf("undrain a: %d", code)
	}

	// b's kilnd stops (its sandboxes run on): to a and c its sandbox is
	// unknown, then node_lost, never exited; what needs b is refused.
	if err := b.k.Stop(); err != nil {
		t.Fatal(err)
	}
	stateOnA := func(want string) {
		eventually(t, "web "+want+" on a", func() (bool, string) {
			code, body := a.do(t, tok, "GET", "/sandboxes/web", "")
			var sb api.Sandbox
			json.Unmarshal(body, &sb)
			return code == 200 && sb.State == want, string(body)
		})
	}
	stateOnA(api.SandboxUnknown)
	stateOnA(api.SandboxNodeLost)
	nodesSeen(t, a, tok, map[string]string{"a": api.NodeReady, "b": api.NodeLost, "c": api.NodeReady})
	if code, body := a.do(t, tok, "POST", "/sandboxes/web/exec", `{"command":"true"}`); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "node b") {
		t.Errorf("exec on lost b: %d %s, want 503 naming node b", code, body)
	}
	if code, body := c.do(t, tok, "GET", "/sandboxes?state=node_lost", ""); code != 200 || !strings.Contains(string(body), web.ID) {
		t.Errorf("c's node_lost list: %d %s", code, body)
	}
	// Back, b adopts its sandbox; the others see it running again.
	b.k = daemontest.StartConfigT(t, b.cfg)
	stateOnA(api.SandboxRunning)
	r, err := web.Exec(ctx, client.ExecOptions{Shell: "echo back"})
	if err != nil || string(r.Stdout) != "back\n" {
		t.Fatalf("exec through a after b's return: %q %v", r.Stdout, err)
	}
	// The scrape says the cluster is reached, its nodes, and what the
	// export stored; promtool finds nothing wrong with it.
	eventually(t, "the cluster's metrics", func() (bool, string) {
		code, body := b.do(t, tok, "GET", "/metrics", "")
		m := string(body)
		return code == 200 && strings.Contains(m, "kilnd_cluster_connected 1\n") && strings.Contains(m, `kilnd_cluster_nodes{state="ready"} 3`) &&
			strings.Contains(m, "kilnd_export_ended_total ") && !strings.Contains(m, "kilnd_export_bytes_total 0\n"), m
	})
	if promtool, err := exec.LookPath("promtool"); err == nil {
		_, body := b.do(t, tok, "GET", "/metrics", "")
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	} else if os.Getenv("CI") != "" {
		t.Fatal("promtool is not installed (Debian's prometheus package)")
	}

	// One NATS server of three stops: the cluster serves on, and what it
	// kept is still there.
	// (A node whose connection was to that server is down until its
	// client reconnects to another, in a second or so.)
	nats.Stop(2)
	eventually(t, "a create on c with a NATS server down", func() (bool, string) {
		sb, err := viaA.CreateSandbox(ctx, client.SandboxOptions{Node: "c"})
		if err != nil {
			return false, err.Error()
		}
		sb.Delete(ctx, true)
		return true, ""
	})
	procs, err := outexport.Processes(ctx, js, "b", web.ID, "")
	if err != nil || len(procs) < 2 {
		t.Fatalf("b's exported processes with a NATS server down: %v %v", procs, err)
	}
	nats.Restart(2)
	// The nodes whose connection was to the stopped server may have gone
	// unheard for longer than this test's short lostAfter on a loaded
	// machine: they are ready again once their clients have reconnected.
	nodesSeen(t, a, tok, all)
	// Deleted through a, it is gone from every node and its name free.
	if err := web.Delete(ctx, true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web gone from c", func() (bool, string) {
		code, body := c.do(t, tok, "GET", "/sandboxes/web", "")
		return code == http.StatusNotFound, string(body)
	})
	again, err := viaC.CreateSandbox(ctx, client.SandboxOptions{Name: "web"})
	if err != nil {
		t.Fatalf("the name of a deleted sandbox: %v", err)
	}
	again.Delete(ctx, true)
	if err := west.Delete(ctx, true); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestClusterDown: a kilnd whose NATS is down serves its own sandboxes,
// says it is not ready, refuses what needs the cluster with 503, and
// joins once NATS is back.
func TestClusterDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	nats := natstest.Cluster(t, 1)
	nats.Stop(0)
	n := startNode(t, "solo", "", nats.URLs(), nil)
	resp, err := http.Get(n.url() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"down"`) {
		t.Fatalf("readyz with NATS down: %d %s", resp.StatusCode, body)
	}
	own, _ := os.ReadFile(filepath.Join(n.k.State, daemon.TokenName))
	tok := strings.TrimSpace(string(own))
	if code, body := n.do(t, tok, "POST", "/sandboxes", `{}`); code != http.StatusCreated {
		t.Fatalf("create with NATS down: %d %s", code, body)
	}
	if code, body := n.do(t, tok, "POST", "/sandboxes", `{"name":"named"}`); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "cluster is down") {
		t.Errorf("named create with NATS down: %d %s, want 503", code, body)
	}
	// No node known, not even itself: an empty list would say the
	// cluster has none.
	if code, body := n.do(t, tok, "GET", "/nodes", ""); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "cluster is down") {
		t.Errorf("nodes with NATS down from the start: %d %s, want 503", code, body)
	}
	nats.Restart(0)
	ready(t, n)
	// Ready, it knows itself: a create naming it is placed at once.
	if code, body := n.do(t, tok, "POST", "/sandboxes", `{"node":"solo"}`); code != http.StatusCreated {
		t.Fatalf("create naming the node as it became ready: %d %s", code, body)
	}
	// Down again mid-run: not ready, its own sandboxes served.
	nats.Stop(0)
	eventually(t, "not ready with NATS gone", func() (bool, string) {
		resp, err := http.Get(n.url() + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable, resp.Status
	})
	if code, body := n.do(t, tok, "POST", "/sandboxes", `{}`); code != http.StatusCreated {
		t.Fatalf("create with NATS gone mid-run: %d %s", code, body)
	}
	nats.Restart(0)
	ready(t, n)
	if code, body := n.do(t, tok, "GET", "/nodes", ""); code != 200 || !strings.Contains(string(body), `"solo"`) {
		t.Errorf("nodes once back: %d %s", code, body)
	}
	if code, body := n.do(t, tok, "POST", "/sandboxes", `{"name":"named"}`); code != http.StatusCreated {
		t.Errorf("named create once back: %d %s", code, body)
	}
}

// nodeEnv makes the test binary a kilnd of a test's cluster, in a process
// of its own that a test can kill with SIGKILL: its value is the node's
// externalNode, JSON.
const nodeEnv = "SANDKILN_TEST_NODE"

type externalNode struct {
	Name    string   `json:"name"`
	State   string   `json:"state"`
	Listen  string   `json:"listen"`
	Servers []string `json:"servers"`
}

// serveNode serves the node nodeEnv describes until SIGTERM.
func serveNode(spec string) int {
	var n externalNode
	if err := json.Unmarshal([]byte(spec), &n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k, err := daemontest.StartConfig(daemon.Config{StateDir: n.State, Listen: n.Listen, Wrap: func(h http.Handler) http.Handler { return h },
		Cluster: &cluster.Config{Servers: n.Servers, Node: n.Name, Heartbeat: beat, LostAfter: lostAfter}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	if err := k.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startExternal starts node n in a process of its own and waits until it
// serves.
func startExternal(t *testing.T, n externalNode) *exec.Cmd {
	t.Helper()
	spec, _ := json.Marshal(n)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, n.Name+" serving", func() (bool, string) {
		c, err := net.Dial("unix", filepath.Join(n.State, daemon.SocketName))
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return cmd
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestClusterNodeKilled: kilnd b is killed with SIGKILL while a process of
// its sandbox writes (the sandbox runs on without it). From a, the
// sandbox and the process are node_lost, never exited, and the process's
// output reads back from the cluster byte for byte up to what reached
// it, at the same offsets. b started again adopts the sandbox, the
// cluster agrees, and its export goes on where the cluster's copy ended:
// the copy is then whole, with the real exit.
func TestClusterNodeKilled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	nats := natstest.Cluster(t, 3)
	urls := nats.URLs()
	a := startNode(t, "a", "", urls[0:1], nil)
	bn := externalNode{Name: "b", State: t.TempDir(), Listen: freeAddr(t), Servers: urls[1:2]}
	b := startExternal(t, bn)
	defer func() {
		if b != nil {
			b.Process.Kill()
			b.Wait()
		}
	}()
	ready(t, a)
	tok := a.token(t)
	nodesSeen(t, a, tok, map[string]string{"a": api.NodeReady, "b": api.NodeReady})

	code, body := a.do(t, tok, "POST", "/sandboxes", `{"node":"b"}`)
	var sb api.Sandbox
	if json.Unmarshal(body, &sb); code != http.StatusCreated || sb.Node != "b" {
		t.Fatalf("create on b: %d %s", code, body)
	}
	defer a.do(t, tok, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", "")
	// 60,000 lines, 720,000 bytes (less than the ring holds), in 120
	// bursts with a pause between; then it waits for its input to close,
	// so that what it produced while its node was gone is known.
	script := `i=0; while [ $i -lt 120 ]; do j=0; while [ $j -lt 500 ]; do printf 'line-%06d\n' $((i*500+j)); j=$((j+1)); done; i=$((i+1)); sleep 0.02; done; cat >/dev/null`
	var want bytes.Buffer
	for i := range 60000 {
		fmt.Fprintf(&want, "line-%06d\n", i)
	}
	req, _ := json.Marshal(api.ExecRequest{Command: "sh", Args: []string{"-c", script}, Stdin: api.StdinPipe})
	code, body = a.do(t, tok, "POST", "/sandboxes/"+sb.ID+"/exec-stream", string(req))
	var st api.Started
	if json.Unmarshal(body, &st); code != http.StatusOK || st.ID == "" {
		t.Fatalf("start through a: %d %s", code, body)
	}
	_, js := natsClient(t, urls)
	exported := func() (int64, string) {
		procs, err := outexport.Processes(context.Background(), js, "b", sb.ID, api.SandboxNodeLost)
		if err != nil || len(procs) != 1 {
			return 0, fmt.Sprint(procs, err)
		}
		return procs[0].Streams["stdout"].TotalBytes, procs[0].State
	}
	eventually(t, "some of the output in the cluster", func() (bool, string) {
		n, state := exported()
		return n >= 64<<10, fmt.Sprint(n, state)
	})
	b.Process.Kill()
	b.Wait()
	b = nil
	if n, state := exported(); n >= int64(want.Len()) || state == api.StateExited {
		t.Fatalf("the process had ended (%d bytes, %s) before its kilnd was killed: the test proves nothing", n, state)
	}

	// From a: the sandbox and its process are node_lost, and the output
	// reads back as the cluster has it.
	eventually(t, "the sandbox node_lost on a", func() (bool, string) {
		code, body := a.do(t, tok, "GET", "/sandboxes/"+sb.ID, "")
		return code == 200 && strings.Contains(string(body), `"state":"node_lost"`), string(body)
	})
	code, body = a.do(t, tok, "GET", "/sandboxes/"+sb.ID+"/exec-stream", "")
	var procs []api.Process
	if json.Unmarshal(body, &procs); code != 200 || len(procs) != 1 || procs[0].ID != st.ID || procs[0].State != api.SandboxNodeLost || procs[0].Command != "sh" {
		t.Fatalf("processes of the lost node's sandbox, through a: %d %s", code, body)
	}
	held := procs[0].Streams["stdout"].TotalBytes
	got, lost, ended := attach(t, a, tok, sb.ID, st.ID, 0)
	if int64(len(got)) != held || lost != 0 || ended || !bytes.Equal(got, want.Bytes()[:len(got)]) {
		t.Fatalf("from the cluster through a: %d bytes (held %d), lost %d, ended %v; equal to the output's start: %v",
			len(got), held, lost, ended, bytes.Equal(got, want.Bytes()[:min(len(got), want.Len())]))
	}
	if got, _, _ := attach(t, a, tok, sb.ID, st.ID, held/2); !bytes.Equal(got, want.Bytes()[held/2:held]) {
		t.Fatalf("from offset %d: %d bytes, not the output's", held/2, len(got))
	}
	// Its log, from the cluster: the same bytes, raw and as records at
	// their offsets; a run the cluster never saw end, with nothing known
	// lost.
	resp, raw := get(t, a, tok, "/sandboxes/"+sb.ID+"/logs/"+st.ID)
	if resp.StatusCode != 200 || !bytes.Equal(raw, want.Bytes()[:held]) {
		t.Fatalf("the lost node's log through a: %d, %d bytes (held %d), equal to the output's start: %v", resp.StatusCode, len(raw), held,
			bytes.Equal(raw, want.Bytes()[:min(len(raw), want.Len())]))
	}
	var runs []api.Run
	json.Unmarshal([]byte(resp.Trailer.Get("Kiln-Runs")), &runs)
	if resp.Trailer.Get("Kiln-Lost") != "{}" || resp.Trailer.Get("Kiln-Complete") != "false" || len(runs) != 1 || runs[0].State != "interrupted" {
		t.Errorf("the lost node's log's trailers: %v", resp.Trailer)
	}
	// The list of its logs, from the cluster: the process, the same one
	// run, the bytes the copy holds.
	code, body = a.do(t, tok, "GET", "/sandboxes/"+sb.ID+"/logs", "")
	var logs []api.CapturedLog
	if json.Unmarshal(body, &logs); code != 200 || len(logs) != 1 || logs[0].Process != st.ID || len(logs[0].Runs) != 1 || len(runs) != 1 ||
		!reflect.DeepEqual(logs[0].Runs[0], runs[0]) || logs[0].Complete || logs[0].Stats != (api.LogStats{Bytes: held}) {
		t.Errorf("the lost node's logs through a: %d %s; want %s, its run %+v, %d bytes", code, body, st.ID, runs, held)
	}
	resp, recs := get(t, a, tok, "/sandboxes/"+sb.ID+"/logs/"+st.ID[:8]+"?tail=3&stream=stdout&format=json")
	var lines []api.LogRecord
	for line := range strings.Lines(string(recs)) {
		var rec api.LogRecord
		json.Unmarshal([]byte(line), &rec)
		lines = append(lines, rec)
	}
	if resp.StatusCode != 200 || held%12 != 0 || len(lines) != 3 {
		t.Fatalf("the lost node's last 3 lines: %d %s (held %d)", resp.StatusCode, recs, held)
	}
	for i, rec := range lines {
		n := held/12 - 3 + int64(i)
		if rec.Text != fmt.Sprintf("line-%06d", n) || rec.Offset == nil || *rec.Offset != n*12 || rec.Partial {
			t.Errorf("the lost node's last 3 lines: %s", recs)
		}
	}
	if code, body := a.do(t, tok, "POST", "/sandboxes/"+sb.ID+"/exec", `{"command":"true"}`); code != http.StatusServiceUnavailable {
		t.Errorf("exec on the lost node: %d %s", code, body)
	}

	// b again: it adopts the sandbox, which a sees running; the export
	// goes on from where the cluster's copy ended, to the process's end.
	b = startExternal(t, bn)
	// Ready again, b knows itself at once: a create through it naming it
	// is placed there, not refused as a node the cluster lacks.
	bAPI := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+bn.Listen+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(got)
	}
	eventually(t, "b ready again", func() (bool, string) {
		code, body := bAPI("GET", "/readyz", "")
		return code == 200, body
	})
	if code, body := bAPI("POST", "/sandboxes", `{"node":"b"}`); code != http.StatusCreated {
		t.Errorf("a create through b naming it, as b became ready: %d %s", code, body)
	} else {
		var made api.Sandbox
		json.Unmarshal([]byte(body), &made)
		bAPI("DELETE", "/sandboxes/"+made.ID, "")
	}
	eventually(t, "the sandbox running on a", func() (bool, string) {
		code, body := a.do(t, tok, "GET", "/sandboxes/"+sb.ID, "")
		return code == 200 && strings.Contains(string(body), `"state":"running"`), string(body)
	})
	// What the node's loss cost: the process produced its whole output
	// (it waits for its input, and has written nothing more) while the
	// cluster held what it held when the node was lost.
	var produced int64
	eventually(t, "the process through its output, waiting", func() (bool, string) {
		code, body := a.do(t, tok, "GET", "/sandboxes/"+sb.ID+"/exec-stream/"+st.ID, "")
		var p api.Process
		json.Unmarshal(body, &p)
		produced = p.Streams["stdout"].TotalBytes
		return code == 200 && produced == int64(want.Len()), string(body)
	})
	t.Logf("a node lost mid-burst: %d bytes produced, %d in the cluster (acknowledged by JetStream) while it was gone, %d not", produced, held, produced-held)
	if produced-held <= 0 || produced-held != int64(want.Len())-int64(len(got)) {
		t.Errorf("lost while the node was gone: %d produced, %d held, %d read", produced, held, len(got))
	}
	if code, body := a.do(t, tok, "POST", "/sandboxes/"+sb.ID+"/exec-stream/"+st.ID+"/stdin/close", ""); code/100 != 2 {
		t.Fatalf("stdin close: %d %s", code, body)
	}
	eventually(t, "the whole output in the cluster", func() (bool, string) {
		n, state := exported()
		return n == int64(want.Len()) && state == api.StateExited, fmt.Sprint(n, state)
	})
	rd, err := outexport.NewReader(context.Background(), js, "b", sb.ID, st.ID, outexport.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.CloseNow()
	all, lost, ended := readAll(t, rd)
	if !bytes.Equal(all, want.Bytes()) || lost != 0 || !ended {
		t.Fatalf("the cluster's copy after b's return: %d bytes of %d, lost %d, ended %v", len(all), want.Len(), lost, ended)
	}
	code, body = a.do(t, tok, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", "")
	if code != http.StatusNoContent {
		t.Errorf("delete through a: %d %s", code, body)
	}
	b.Process.Signal(syscall.SIGTERM)
	b.Wait()
	b = nil
}

// natsClient connects to the test's NATS.
func natsClient(t *testing.T, urls []string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// attach reads process pid's stdout through n's kiln.v1 WebSocket from
// offset from to where the stream closes: the bytes, each at its offset
// (a gap is counted in lost), and whether its end came.
func attach(t *testing.T, n *node, tok, sbx, pid string, from int64) (out []byte, lost int64, ended bool) {
	t.Helper()
	c := dialStdout(t, n, tok, sbx, pid, from)
	defer c.CloseNow()
	return readAll(t, wsConn{c})
}

// dialStdout opens n's kiln.v1 WebSocket on process pid's stdout from
// offset from.
func dialStdout(t *testing.T, n *node, tok, sbx, pid string, from int64) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := "ws" + strings.TrimPrefix(n.url(), "http") + "/sandboxes/" + sbx + "/exec-stream/" + pid + "/logs?stdout=" + strconv.FormatInt(from, 10)
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{api.ProtocolV1},
		HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(api.FrameHeader + 1<<20)
	return c
}

// replicated waits until stream has the cluster's three replicas.
func replicated(t *testing.T, js jetstream.JetStream, stream string) {
	t.Helper()
	eventually(t, stream+" has 3 replicas", func() (bool, string) {
		s, err := js.Stream(context.Background(), stream)
		if err != nil {
			return false, err.Error()
		}
		return s.CachedInfo().Config.Replicas == 3, fmt.Sprint(s.CachedInfo().Config.Replicas)
	})
}

type wsConn struct{ c *websocket.Conn }

func (w wsConn) Read(ctx context.Context) (websocket.MessageType, []byte, error) {
	return w.c.Read(ctx)
}

type kilnv1 interface {
	Read(ctx context.Context) (websocket.MessageType, []byte, error)
}

// readAll reads a kiln.v1 stream's stdout to its close.
func readAll(t *testing.T, c kilnv1) (out []byte, lost int64, ended bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pos int64 = -1
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			return out, lost, ended
		}
		if typ == websocket.MessageText {
			var m struct {
				Type      string `json:"type"`
				Stream    string `json:"stream"`
				LostBytes int64  `json:"lost_bytes"`
				To        int64  `json:"to"`
			}
			json.Unmarshal(b, &m)
			switch {
			case m.Type == api.TypeGap && m.Stream == "stdout":
				lost += m.LostBytes
				pos = m.To
			case m.Type == api.TypeEnd && (m.Stream == "stdout" || m.Stream == ""):
				ended = true
			}
			continue
		}
		f, err := api.ParseFrame(b)
		if err != nil {
			t.Fatal(err)
		}
		if f.Stream != api.StreamStdout {
			continue
		}
		if pos >= 0 && int64(f.Offset) != pos {
			t.Fatalf("a frame at %d where the stream stood at %d", f.Offset, pos)
		}
		out = append(out, f.Data...)
		pos = int64(f.Offset) + int64(len(f.Data))
	}
}

// TestNodeNames: a node is named as Kubernetes names its nodes (a DNS
// name, dots included), and its subject token keeps names apart.
func TestNodeNames(t *testing.T) {
	for _, ok := range []string{"a", "node-1", "ip-10-0-1-2.ec2.internal", strings.Repeat("a", 63)} {
		if err := cluster.ValidateNode(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a-", "A", "a_b", "a..b", ".a", "a.", "a b", "a*", "a>", strings.Repeat("a", 64), strings.Repeat("a.", 127) + "a"} {
		if cluster.ValidateNode(bad) == nil {
			t.Errorf("%q taken", bad)
		}
	}
	if cluster.Token("ip-10-0-1-2.ec2.internal") != "ip-10-0-1-2_ec2_internal" || cluster.Token("a-b") != "a-b" {
		t.Error("tokens")
	}
}

// TestClusterDrainMoves: a drain with move_stopped moves each stopped
// sandbox of the node to another, its files, name and labels along, and
// leaves the running ones where they run.
func TestClusterDrainMoves(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	nats := natstest.Cluster(t, 1)
	a := startNode(t, "a", "", nats.URLs(), nil)
	b := startNode(t, "b", "", nats.URLs(), nil)
	ready(t, a)
	ready(t, b)
	tok := a.token(t)
	nodesSeen(t, a, tok, map[string]string{"a": api.NodeReady, "b": api.NodeReady})
	ctx := context.Background()
	cl, err := client.New(client.Options{Addr: a.url(), Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	newSandbox := func(name string) *client.Sandbox {
		sb, err := cl.CreateSandbox(ctx, client.SandboxOptions{Name: name, Node: "b", Labels: map[string]string{"team": "x"}})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo kept-" + name + " > /workspace/f"}); err != nil || r.Exit.Code() != 0 {
			t.Fatalf("write in %s: %v %+v", name, err, r)
		}
		return sb
	}
	named, unnamed, running := newSandbox("moving"), newSandbox(""), newSandbox("staying")
	for _, sb := range []*client.Sandbox{named, unnamed} {
		if _, err := sb.Stop(ctx, client.StopOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := cl.DrainNodeMoving(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if n.State != api.NodeDraining || len(n.Moved) != 2 {
		t.Fatalf("drained b: %+v", n)
	}
	for _, m := range n.Moved {
		if m.Error != "" || m.Node != "a" || m.ID == "" {
			t.Fatalf("moved: %+v", m)
		}
		moved, err := cl.Sandbox(ctx, m.ID)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := moved.Info(ctx)
		if info.Node != "a" || info.Name != m.Name || info.Labels["team"] != "x" {
			t.Errorf("moved %s: %+v", m.Sandbox, info)
		}
		if info.State != api.SandboxRunning {
			if _, err := moved.StartAgain(ctx); err != nil {
				t.Fatal(err)
			}
		}
		want := "kept-" + m.Name + "\n"
		if r, err := moved.Exec(ctx, client.ExecOptions{Shell: "cat /workspace/f"}); err != nil || string(r.Stdout) != want {
			t.Errorf("moved %s's file: %q %v, want %q", m.Sandbox, r.Stdout, err, want)
		}
		moved.Delete(ctx, true)
		if code, _ := a.do(t, tok, "GET", "/sandboxes/"+m.Sandbox, ""); code != http.StatusNotFound {
			t.Errorf("the moved %s still there: %d", m.Sandbox, code)
		}
	}
	if info, err := running.Info(ctx); err != nil || info.Node != "b" || info.State != api.SandboxRunning {
		t.Errorf("the running one: %+v %v", info, err)
	}
	running.Delete(ctx, true)
}
