package main

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v4"

	"github.com/sandkiln/sandkiln/api"
)

// clusterKilnd stands in for a kilnd in a cluster of three nodes (a, which
// answers; b; c, lost), on a socket in a state directory of its own: its
// answers are kilnd's as api/openapi.yaml has them. No cluster is started.
type clusterKilnd struct {
	state     string
	mu        sync.Mutex
	requests  []string // "METHOD PATH?QUERY", and a create's body
	draining  bool
	noCluster bool // answers as a kilnd in no cluster
}

func startClusterKilnd(t *testing.T) *clusterKilnd {
	k := &clusterKilnd{state: t.TempDir()}
	l, err := net.Listen("unix", filepath.Join(k.state, "kilnd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(k)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return k
}

func (k *clusterKilnd) nodes() []api.Node {
	now := time.Now()
	b := api.Node{Name: "b", State: api.NodeReady, APIURL: "http://10.0.0.2:7777", Labels: map[string]string{"zone": "b", "disk": "ssd"}, Version: "v0.9",
		StartedAt: now.Add(-time.Hour), SeenAt: now.Add(-5 * time.Minute), CPUs: 8, MemoryBytes: 32 << 30, FreeMemoryBytes: 20 << 30, Sandboxes: 1}
	if k.draining {
		b.State = api.NodeDraining
	}
	return []api.Node{
		{Name: "a", State: api.NodeReady, APIURL: "http://10.0.0.1:7777", Labels: map[string]string{"zone": "a"}, Version: "v1.0",
			StartedAt: now.Add(-time.Hour), SeenAt: now.Add(-5 * time.Minute), CPUs: 4, MemoryBytes: 16 << 30, FreeMemoryBytes: 6 << 30, Sandboxes: 2, Self: true},
		b,
		{Name: "c", State: api.NodeLost, APIURL: "http://10.0.0.3:7777", Version: "v1.0",
			StartedAt: now.Add(-5 * time.Hour), SeenAt: now.Add(-3 * time.Hour), CPUs: 2, MemoryBytes: 4 << 30, FreeMemoryBytes: 1 << 30},
	}
}

func (k *clusterKilnd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	req := r.Method + " " + r.URL.Path
	if r.URL.RawQuery != "" {
		req += "?" + r.URL.RawQuery
	}
	answer := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	refuse := func(code int, kind, msg string) {
		answer(code, api.Error{Error: api.ErrorBody{Code: kind, Message: msg}})
	}
	if r.Method == "POST" && r.URL.Path == "/sandboxes" {
		var body api.CreateSandbox
		json.NewDecoder(r.Body).Decode(&body)
		b, _ := json.Marshal(body)
		req += " " + string(b)
	}
	k.requests = append(k.requests, req)
	if k.noCluster && strings.HasPrefix(r.URL.Path, "/nodes") {
		refuse(412, api.CodePrecondition, "this kilnd is in no cluster (kilnd --cluster): it has no nodes")
		return
	}
	created := time.Date(2026, 12, 5, 3, 0, 0, 0, time.Local)
	sandboxes := []api.Sandbox{
		{ID: strings.Repeat("a", 64), Name: "web", State: api.SandboxRunning, Node: "a", Runtime: "namespaces", CreatedAt: created, Hostname: "web"},
		{ID: strings.Repeat("b", 64), Name: "db", State: api.SandboxRunning, Node: "b", Runtime: "namespaces", CreatedAt: created, Hostname: "db"},
		{ID: strings.Repeat("c", 64), State: api.SandboxNodeLost, Node: "c", Runtime: "gvisor", CreatedAt: created, Hostname: "kiln-cccccccccccc"},
	}
	nodes := k.nodes()
	switch name, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/nodes/"), "/"); {
	case r.Method == "GET" && r.URL.Path == "/nodes":
		answer(200, nodes)
	case r.Method == "GET" && r.URL.Path == "/sandboxes":
		var list []api.Sandbox
		for _, s := range sandboxes {
			if n := r.URL.Query().Get("node"); n == "" || s.Node == n {
				list = append(list, s)
			}
		}
		answer(200, list)
	case r.Method == "POST" && r.URL.Path == "/sandboxes":
		answer(201, sandboxes[1])
	case r.Method == "GET" && r.URL.Path == "/snapshots":
		taken := time.Now().Add(-5 * time.Minute)
		answer(200, []api.Snapshot{
			{ID: strings.Repeat("d", 64), Name: "clean", Sandbox: sandboxes[0].ID, SandboxName: "web", CreatedAt: taken, Runtime: "namespaces", SizeBytes: 1 << 20, Copy: "reflink", Processes: []api.Process{}, Node: "a", NodeState: api.NodeReady},
			{ID: strings.Repeat("e", 64), Sandbox: sandboxes[2].ID, CreatedAt: taken, Runtime: "gvisor", SizeBytes: 2 << 20, Copy: "copy", Processes: []api.Process{}, Node: "c", NodeState: api.NodeLost},
		})
	case strings.HasPrefix(r.URL.Path, "/nodes/"):
		i := map[string]int{"a": 0, "b": 1, "c": 2}
		n, ok := i[name]
		switch {
		case !ok:
			refuse(404, api.CodeNotFound, "no node "+name+" in the cluster (GET /nodes lists them)")
		case r.Method == "GET" && rest == "":
			answer(200, nodes[n])
		case rest == "drain" && (r.Method == "POST" || r.Method == "DELETE"):
			if name == "b" {
				k.draining = r.Method == "POST"
			}
			answer(200, k.nodes()[n])
		default:
			refuse(405, api.CodeMethod, "no")
		}
	default:
		refuse(404, api.CodeNotFound, "no route")
	}
}

func (k *clusterKilnd) took() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := k.requests
	k.requests = nil
	return out
}

// TestNodeCommands: kiln node ls, inspect, drain and undrain (uncordon)
// as Docker's and kubectl's users read and type them, against a stand-in
// for a clustered kilnd; kiln ls's NODE column and --filter node=, and
// --node and --constraint on a create.
func TestNodeCommands(t *testing.T) {
	k := startClusterKilnd(t)
	ok := func(args ...string) string {
		t.Helper()
		code, out, errs := kiln(t, k.state, "", args...)
		if code != 0 {
			t.Fatalf("kiln %v: %d %q %q", args, code, out, errs)
		}
		return out
	}

	want := `NAME  STATE  SANDBOXES  FREE MEMORY  CPUS  LABELS           LAST HEARTBEAT
a *   ready  2          6GiB         4     zone=a           5 minutes ago
b     ready  1          20GiB        8     disk=ssd,zone=b  5 minutes ago
c     lost   0          1GiB         2     -                3 hours ago
`
	if diff := cmp.Diff(want, ok("node", "ls")); diff != "" {
		t.Errorf("kiln node ls (-want +got):\n%s", diff)
	}
	if out := ok("node", "list", "-o", "wide"); !strings.Contains(out, "MEMORY  VERSION  STARTED") || !strings.Contains(out, "32GiB   v0.9") || !strings.Contains(out, "http://10.0.0.2:7777") {
		t.Errorf("kiln node ls -o wide:\n%s", out)
	}
	if out := ok("node", "ls", "-q"); out != "a\nb\nc\n" {
		t.Errorf("kiln node ls -q: %q", out)
	}
	if out := ok("node", "ls", "--format", `{{.Name}} {{index .Labels "zone"}} {{.Sandboxes}}`); out != "a a 2\nb b 1\nc  0\n" {
		t.Errorf("kiln node ls --format: %q", out)
	}
	var listed []api.Node
	if err := json.Unmarshal([]byte(ok("--json", "node", "ls")), &listed); err != nil || len(listed) != 3 || !listed[0].Self {
		t.Errorf("kiln --json node ls: %+v, %v", listed, err)
	}
	if out := ok("node", "ls", "--format", "json"); strings.Count(out, "\n") != 3 || !strings.HasPrefix(out, `{"name":"a"`) {
		t.Errorf("kiln node ls --format json, an object a line: %q", out)
	}
	var fromYAML []map[string]any
	if err := yaml.Unmarshal([]byte(ok("node", "ls", "--format", "yaml")), &fromYAML); err != nil || len(fromYAML) != 3 || fromYAML[1]["free_memory_bytes"] != 20<<30 {
		t.Errorf("kiln node ls --format yaml: %v, %v", fromYAML, err)
	}

	var b api.Node
	if err := json.Unmarshal([]byte(ok("node", "inspect", "b")), &b); err != nil || b.Name != "b" || b.Labels["disk"] != "ssd" {
		t.Errorf("kiln node inspect b: %+v, %v", b, err)
	}
	if code, _, errs := kiln(t, k.state, "", "node", "inspect", "x"); code != 125 || errs != "kiln: no node x in the cluster (GET /nodes lists them)\n" {
		t.Errorf("kiln node inspect x: %d %q", code, errs)
	}
	k.took()
	if out := ok("node", "drain", "b"); out != "b\n" {
		t.Errorf("kiln node drain b: %q", out)
	}
	if out := ok("node", "ls"); !strings.Contains(out, "\nb     draining") {
		t.Errorf("kiln node ls after the drain:\n%s", out)
	}
	if out := ok("node", "uncordon", "b"); out != "b\n" {
		t.Errorf("kiln node uncordon b: %q", out)
	}
	var undrained []api.Node
	if err := json.Unmarshal([]byte(ok("--json", "node", "undrain", "b", "a")), &undrained); err != nil || len(undrained) != 2 || undrained[0].State != api.NodeReady {
		t.Errorf("kiln --json node undrain b a: %+v, %v", undrained, err)
	}
	code, out, errs := kiln(t, k.state, "", "node", "drain", "x", "b")
	if code != 125 || out != "b\n" || !strings.Contains(errs, "x: no node x") {
		t.Errorf("kiln node drain x b: %d %q %q", code, out, errs)
	}
	if diff := cmp.Diff([]string{"POST /nodes/b/drain", "GET /nodes", "DELETE /nodes/b/drain", "DELETE /nodes/b/drain", "DELETE /nodes/a/drain",
		"POST /nodes/x/drain", "POST /nodes/b/drain"}, k.took()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	// kiln snapshot ls: a NODE column too, with a node's state when it is
	// lost.
	want = `SNAPSHOT ID   NAME   NODE      SANDBOX             IMAGE  PROCESSES  SIZE     COPY     CREATED
dddddddddddd  clean  a         aaaaaaaaaaaa (web)  -      0          1.049MB  reflink  5 minutes ago
eeeeeeeeeeee  -      c (lost)  cccccccccccc        -      0          2.097MB  copy     5 minutes ago
`
	if diff := cmp.Diff(want, ok("snapshot", "ls")); diff != "" {
		t.Errorf("kiln snapshot ls (-want +got):\n%s", diff)
	}

	// kiln ls: a NODE column, since the sandboxes have nodes.
	want = `ID            NAME  STATE      NODE  RUNTIME     CREATED              HOSTNAME
aaaaaaaaaaaa  web   running    a     namespaces  TIME  web
bbbbbbbbbbbb  db    running    b     namespaces  TIME  db
cccccccccccc        node_lost  c     gvisor      TIME  kiln-cccccccccccc
`
	got := strings.ReplaceAll(ok("ls"), time.Date(2026, 12, 5, 3, 0, 0, 0, time.Local).Format(time.DateTime), "TIME")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kiln ls (-want +got):\n%s", diff)
	}
	k.took()
	if out := ok("ls", "-q", "--filter", "node=b"); out != "bbbbbbbbbbbb\n" {
		t.Errorf("kiln ls -q --filter node=b: %q", out)
	}
	if out := ok("sandbox", "ls", "--format", "{{.Node}}"); out != "a\nb\nc\n" {
		t.Errorf("kiln sandbox ls --format {{.Node}}: %q", out)
	}
	if code, _, errs := kiln(t, k.state, "", "ls", "-f", "node=a", "-f", "node=b"); code != 125 || !strings.Contains(errs, "--filter node given twice") {
		t.Errorf("two nodes: %d %q", code, errs)
	}
	if out := ok("sandbox", "create", "--node", "b", "--constraint", "zone=b", "--constraint", "disk=ssd"); out != strings.Repeat("b", 64)+"\n" {
		t.Errorf("kiln sandbox create --node b: %q", out)
	}
	for _, args := range [][]string{
		{"sandbox", "create", "--constraint", "zone"},
		{"sandbox", "create", "--constraint", "=a"},
		{"run", "--rm", "--constraint", "zone", "--", "true"},
	} {
		if code, _, errs := kiln(t, k.state, "", args...); code != 125 || !strings.Contains(errs, "want KEY=VALUE") || !strings.Contains(errs, "--help") {
			t.Errorf("kiln %v: %d %q", args, code, errs)
		}
	}
	if diff := cmp.Diff([]string{"GET /sandboxes?node=b", "GET /sandboxes", `POST /sandboxes {"node":"b","constraints":["zone=b","disk=ssd"]}`}, k.took()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	// A kilnd in no cluster says so.
	k.mu.Lock()
	k.noCluster = true
	k.mu.Unlock()
	if code, _, errs := kiln(t, k.state, "", "node", "ls"); code != 125 || errs != "kiln: this kilnd is in no cluster (kilnd --cluster): it has no nodes\n" {
		t.Errorf("kiln node ls, no cluster: %d %q", code, errs)
	}
}
