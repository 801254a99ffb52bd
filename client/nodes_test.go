package client_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// clusterNode is a kilnd in a cluster, as the node routes and /readyz
// describe it, for TestNodesAndReady: no cluster is started, the answers
// are kilnd's as api/openapi.yaml has them.
type clusterNode struct {
	mu       sync.Mutex
	requests []string // "METHOD PATH?QUERY"
	draining bool
	down     bool   // /readyz says the cluster is down
	readyz   string // when set, /readyz's whole answer: "STATUS BODY"
}

func (k *clusterNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	req := r.Method + " " + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		req += "?" + r.URL.RawQuery
	}
	k.requests = append(k.requests, req)
	if r.Header.Get("Authorization") != "Bearer t" && r.URL.Path != "/readyz" {
		w.WriteHeader(401)
		json.NewEncoder(w).Encode(api.Error{Error: api.ErrorBody{Code: api.CodeUnauthorized, Message: "no token"}})
		return
	}
	seen := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	node := func(name string) api.Node {
		n := api.Node{Name: name, State: api.NodeReady, APIURL: "http://" + name + ":7777", Version: "v1", Incarnation: "i-" + name,
			StartedAt: seen.Add(-time.Hour), SeenAt: seen, CPUs: 2, MemoryBytes: 8 << 30, FreeMemoryBytes: 6 << 30, Sandboxes: 1,
			Labels: map[string]string{"zone": "a"}}
		if name == "b" && k.draining {
			n.State = api.NodeDraining
		}
		return n
	}
	answer := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	refuse := func(code int, kind, msg string) {
		answer(code, api.Error{Error: api.ErrorBody{Code: kind, Message: msg}})
	}
	switch {
	case r.Method == "GET" && r.URL.Path == "/readyz":
		if k.readyz != "" {
			code, body, _ := strings.Cut(k.readyz, " ")
			w.WriteHeader(map[string]int{"503": 503, "500": 500, "200": 200}[code])
			w.Write([]byte(body))
			return
		}
		h := api.Health{Status: "ok", Cluster: &api.Cluster{Node: "a", State: "connected"}}
		code := 200
		if k.down {
			h.Status, h.Cluster.State, code = "cluster down", "down", 503
		}
		answer(code, h)
	case r.Method == "GET" && r.URL.Path == "/nodes":
		a := node("a")
		a.Self = true
		answer(200, []api.Node{a, node("b")})
	case r.URL.Path == "/nodes/c", r.URL.Path == "/nodes/c/drain":
		refuse(404, api.CodeNotFound, "no node c in the cluster")
	case r.Method == "GET" && r.URL.Path == "/nodes/b":
		answer(200, node("b"))
	case r.Method == "POST" && r.URL.Path == "/nodes/b/drain":
		k.draining = true
		answer(200, node("b"))
	case r.Method == "DELETE" && r.URL.Path == "/nodes/b/drain":
		k.draining = false
		answer(200, node("b"))
	case r.Method == "GET" && r.URL.Path == "/sandboxes":
		answer(200, []api.Sandbox{{ID: strings.Repeat("b", 64), State: api.SandboxRunning, Node: "b"}})
	default:
		refuse(404, api.CodeNotFound, "no route")
	}
}

// TestNodesAndReady: the node routes and /readyz as the client calls them
// and reads their answers, against a stand-in for a clustered kilnd; a
// kilnd whose cluster is down is an answer of Ready, not an error.
func TestNodesAndReady(t *testing.T) {
	k := &clusterNode{}
	srv := httptest.NewServer(k)
	defer srv.Close()
	c, err := client.New(client.Options{Addr: strings.TrimPrefix(srv.URL, "http://"), Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)

	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0].Name != "a" || !nodes[0].Self || nodes[1].Self || nodes[1].Labels["zone"] != "a" ||
		nodes[1].FreeMemoryBytes != 6<<30 || nodes[1].CPUs != 2 || nodes[1].SeenAt.IsZero() {
		t.Fatalf("Nodes: %+v, %v", nodes, err)
	}
	if n, err := c.Node(ctx, "b"); err != nil || n.Name != "b" || n.State != api.NodeReady {
		t.Errorf("Node b: %+v, %v", n, err)
	}
	if _, err := c.Node(ctx, "c"); !client.IsNotFound(err) {
		t.Errorf("Node c, which the cluster does not have: %v", err)
	}
	if n, err := c.DrainNode(ctx, "b"); err != nil || n.State != api.NodeDraining {
		t.Errorf("DrainNode: %+v, %v", n, err)
	}
	if n, err := c.Node(ctx, "b"); err != nil || n.State != api.NodeDraining {
		t.Errorf("Node b once drained: %+v, %v", n, err)
	}
	if n, err := c.UndrainNode(ctx, "b"); err != nil || n.State != api.NodeReady {
		t.Errorf("UndrainNode: %+v, %v", n, err)
	}
	if _, err := c.DrainNode(ctx, "c"); !client.IsNotFound(err) {
		t.Errorf("DrainNode c: %v", err)
	}
	if list, err := c.SandboxesWhere(ctx, client.SandboxFilter{Node: "b"}); err != nil || len(list) != 1 || list[0].Node != "b" {
		t.Errorf("SandboxesWhere node b: %+v, %v", list, err)
	}

	h, err := c.Ready(ctx)
	if err != nil || h.Status != "ok" || h.Cluster == nil || h.Cluster.Node != "a" || h.Cluster.State != "connected" {
		t.Errorf("Ready: %+v, %v", h, err)
	}
	k.mu.Lock()
	k.down = true
	k.mu.Unlock()
	h, err = c.Ready(ctx)
	if err != nil || h.Status != "cluster down" || h.Cluster == nil || h.Cluster.State != "down" {
		t.Errorf("Ready, the cluster down: %+v, %v", h, err)
	}
	// A 503 that is not kilnd's readiness is an error, kilnd's or the
	// status's; so is any other refusal.
	ready := c.Ready
	for _, c := range []struct {
		answer string
		check  func(error) bool
	}{
		{`503 {"error":{"code":"unavailable","message":"shutting down"}}`, client.IsUnavailable},
		{`503 <html>Service Unavailable</html>`, client.IsInternal},
		{`500 {"error":{"code":"internal","message":"oops"}}`, client.IsInternal},
		{`200 {}`, func(err error) bool { return err != nil }},
	} {
		k.mu.Lock()
		k.readyz = c.answer
		k.mu.Unlock()
		if h, err := ready(ctx); !c.check(err) {
			t.Errorf("Ready answered %s: %+v, %v", c.answer, h, err)
		}
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	want := []string{"GET /nodes", "GET /nodes/b", "GET /nodes/c", "POST /nodes/b/drain", "GET /nodes/b", "DELETE /nodes/b/drain",
		"POST /nodes/c/drain", "GET /sandboxes?node=b", "GET /readyz", "GET /readyz"}
	if got := strings.Join(k.requests[:len(want)], ", "); got != strings.Join(want, ", ") {
		t.Errorf("requests:\n%s\nwant\n%s", got, strings.Join(want, ", "))
	}
}
