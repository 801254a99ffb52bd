package cluster_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/natstest"
)

// echoApp serves, on 127.0.0.1:8000, /workspace/blob at /blob and the
// request's headers at /headers.
const echoApp = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.endswith('/headers'):
            body = str(self.headers).encode()
        else:
            body = open('/workspace/blob', 'rb').read()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()
`

// steadyBeat is the heartbeat of startSteadyNode's nodes: unreachable to
// the others after 2.5 s unheard, which the pauses of a loaded machine
// running -race stay short of, and lost after lostAfter still.
const steadyBeat = 500 * time.Millisecond

// startSteadyNode is startNode, heartbeats every steadyBeat.
func startSteadyNode(t *testing.T, name string, urls []string) *node {
	t.Helper()
	cfg := daemon.Config{StateDir: t.TempDir(), Listen: "127.0.0.1:0", Cluster: &cluster.Config{
		Servers: urls, Node: name, Heartbeat: steadyBeat, LostAfter: lostAfter}}
	return &node{name: name, k: daemontest.StartConfigT(t, cfg), cfg: cfg}
}

// snapshotsOn is what n's GET /snapshots lists: each snapshot's node and
// node_state, by id.
func snapshotsOn(t *testing.T, n *node, tok string) (map[string]api.Snapshot, string) {
	t.Helper()
	code, body := n.do(t, tok, "GET", "/snapshots", "")
	var list []api.Snapshot
	if code != 200 || json.Unmarshal(body, &list) != nil {
		return nil, fmt.Sprintf("%d %s", code, body)
	}
	out := map[string]api.Snapshot{}
	for _, s := range list {
		out[s.ID] = s
	}
	return out, string(body)
}

// TestClusterSnapshotsAndPreviews: a snapshot taken on b is listed by
// every node as b's, inspected, exported and removed through the
// others, and a sandbox made from it through a is made on b; a create
// naming another node is told where the snapshot is. A preview of an
// app in a sandbox of b's, made through a, has a URL of a's previews'
// host, which serves it byte for byte; the app sees neither a's token
// nor the cluster's, and a's previews' host serves no API. A node gone,
// its snapshots are listed with its state.
func TestClusterSnapshotsAndPreviews(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	nats := natstest.Cluster(t, 3)
	urls := nats.URLs()
	a := startSteadyNode(t, "a", []string{urls[0], urls[1], urls[2]})
	b := startSteadyNode(t, "b", []string{urls[1], urls[2], urls[0]})
	c := startSteadyNode(t, "c", []string{urls[2], urls[0], urls[1]})
	for _, n := range []*node{a, b, c} {
		ready(t, n)
	}
	tok := a.token(t)
	all := map[string]string{"a": api.NodeReady, "b": api.NodeReady, "c": api.NodeReady}
	for _, n := range []*node{a, b, c} {
		nodesSeen(t, n, tok, all)
	}
	_, js := natsClient(t, urls)
	for _, name := range []string{"KV_" + cluster.BucketSnapshots, "KV_" + cluster.BucketPreviews} {
		replicated(t, js, name)
	}
	ctx := context.Background()
	viaA, err := client.New(client.Options{Addr: a.url(), Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer viaA.Close()

	// A sandbox on b, made through a, with a file of random bytes.
	web, err := viaA.CreateSandbox(ctx, client.SandboxOptions{Name: "web", Node: "b"})
	if err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, 300<<10)
	rand.Read(blob)
	if _, err := web.WriteFile(ctx, "/workspace/blob", bytes.NewReader(blob), 0o644); err != nil {
		t.Fatal(err)
	}

	// Taken through c, the snapshot is b's; every node lists it so.
	code, body := c.do(t, tok, "POST", "/sandboxes/web/snapshots", `{"name":"kept"}`)
	var snap api.Snapshot
	if code != http.StatusCreated || json.Unmarshal(body, &snap) != nil || snap.Node != "b" || snap.NodeState != api.NodeReady {
		t.Fatalf("snapshot through c: %d %s", code, body)
	}
	for _, n := range []*node{a, b, c} {
		eventually(t, n.name+" lists b's snapshot", func() (bool, string) {
			got, said := snapshotsOn(t, n, tok)
			s, ok := got[snap.ID]
			return ok && len(got) == 1 && s.Node == "b" && s.NodeState == api.NodeReady && s.Name == "kept" && s.Sandbox == web.ID, said
		})
	}
	if code, body := a.do(t, tok, "GET", "/snapshots?sandbox=web", ""); code != 200 || !strings.Contains(string(body), snap.ID) {
		t.Errorf("a's list of web's snapshots: %d %s", code, body)
	}
	// Its name is the cluster's: b's sandbox's name taken on c is refused.
	if code, body := c.do(t, tok, "POST", "/sandboxes", `{"node":"c","name":"other"}`); code != http.StatusCreated {
		t.Fatalf("create on c: %d %s", code, body)
	}
	if code, body := a.do(t, tok, "POST", "/sandboxes/other/snapshots", `{"name":"kept"}`); code != http.StatusConflict || !strings.Contains(string(body), "node b") {
		t.Errorf("a second snapshot named kept, on c: %d %s, want 409 naming node b", code, body)
	}
	// Inspected through c by name and by prefix; exported through a.
	for _, ref := range []string{"kept", snap.ID[:8], snap.ID} {
		code, body := c.do(t, tok, "GET", "/snapshots/"+ref, "")
		var got api.Snapshot
		if code != 200 || json.Unmarshal(body, &got) != nil || got.ID != snap.ID || got.Node != "b" {
			t.Errorf("GET /snapshots/%s through c: %d %s", ref, code, body)
		}
	}
	export, err := viaA.ExportSnapshot(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	var size int64
	for tr := tar.NewReader(export); ; {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("export through a, after %q: %v", entries, err)
		}
		m, _ := io.Copy(io.Discard, tr)
		entries, size = append(entries, hdr.Name), size+m
	}
	export.Close()
	if len(entries) < 2 || entries[0] != "snapshot.json" || size < int64(len(blob)) {
		t.Errorf("export through a: entries %q, %d bytes", entries, size)
	}

	// Made from it through a: on b, with its files.
	from, err := viaA.CreateSandbox(ctx, client.SandboxOptions{Snapshot: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := from.Info(ctx); info.Node != "b" {
		t.Errorf("made from b's snapshot on %q, want b", info.Node)
	}
	r, err := from.Exec(ctx, client.ExecOptions{Shell: "sha256sum < /workspace/blob"})
	want, _ := web.Exec(ctx, client.ExecOptions{Shell: "sha256sum < /workspace/blob"})
	if err != nil || string(r.Stdout) != string(want.Stdout) || len(r.Stdout) < 64 {
		t.Errorf("the file in the sandbox made from the snapshot: %q %v, want %q", r.Stdout, err, want.Stdout)
	}
	for body, want := range map[string]string{
		`{"snapshot":"kept","node":"c"}`:     "is on node b",
		`{"snapshot":"nowhere-at-all"}`:      "no snapshot",
		`{"snapshot":"kept","node":"b"}`:     "",
		`{"snapshot":"` + snap.ID[:6] + `"}`: "",
	} {
		code, got := a.do(t, tok, "POST", "/sandboxes", body)
		switch {
		case want == "" && code != http.StatusCreated:
			t.Errorf("create %s through a: %d %s", body, code, got)
		case want == "":
			var sb api.Sandbox
			json.Unmarshal(got, &sb)
			if sb.Node != "b" {
				t.Errorf("create %s through a: on %q, want b", body, sb.Node)
			}
			a.do(t, tok, "DELETE", "/sandboxes/"+sb.ID+"?logs=true", "")
		case code/100 != 4 || !strings.Contains(string(got), want):
			t.Errorf("create %s through a: %d %s, want a 4xx saying %q", body, code, got, want)
		}
	}

	// A preview of an app of web's, made through a: a URL of a's
	// previews' host (its API's listener, ID.localhost:PORT).
	if _, err := web.WriteFile(ctx, "/workspace/app.py", strings.NewReader(echoApp), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := web.Start(ctx, client.StartOptions{Shell: "exec python3 /workspace/app.py"}); err != nil {
		t.Fatal(err)
	}
	_, aPort, _ := net.SplitHostPort(a.k.Daemon.TCPAddr())
	eventually(t, "the app through a's port route", func() (bool, string) {
		code, body := a.do(t, tok, "GET", "/sandboxes/web/ports/8000/headers", "")
		return code == 200, fmt.Sprintf("%d %.200s", code, body)
	})
	p, err := web.Preview(ctx, 8000, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(p.URL)
	if err != nil || u.Host != p.ID+".localhost:"+aPort {
		t.Fatalf("preview made through a: URL %q, want one of a's host %s.localhost:%s", p.URL, p.ID, aPort)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", a.k.Daemon.TCPAddr())
	}}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	ownA, _ := os.ReadFile(filepath.Join(a.k.State, daemon.TokenName))
	get := func(target, bearer string) (int, http.Header, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", target, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		req.Header.Set("Cookie", "app=kept")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	code, _, got := get(p.URL+"blob", "")
	if code != 200 || !bytes.Equal(got, blob) {
		t.Fatalf("the preview through a: %d, %d bytes (want %d), equal %v", code, len(got), len(blob), bytes.Equal(got, blob))
	}
	for _, bearer := range []string{"", tok, strings.TrimSpace(string(ownA))} {
		code, hdrs, got := get(p.URL+"headers", bearer)
		seen := string(got)
		if code != 200 || !strings.Contains(seen, "app=kept") {
			t.Errorf("the app's request through a: %d %q", code, seen)
		}
		for _, secret := range []string{tok, strings.TrimSpace(string(ownA)), cluster.ForwardedHeader, cluster.PreviewHeader, "Authorization"} {
			if strings.Contains(seen, secret) || strings.Contains(fmt.Sprint(hdrs), secret) {
				t.Errorf("the app, or the answer, has %q: %q %v", secret, seen, hdrs)
			}
		}
	}
	// a's previews' host serves that preview and no API, with any token.
	for _, target := range []string{"/", "/sandboxes", "/snapshots", "/sandboxes/web", "/sandboxes/web/ports/8000/blob", "/nodes", "/preview/"} {
		for _, bearer := range []string{"", tok} {
			if code, _, body := get("http://"+u.Host+target, bearer); code != http.StatusNotFound && code != http.StatusUnauthorized {
				t.Errorf("GET %s on the preview's host through a: %d %.200s", target, code, body)
			}
		}
	}
	// b serves another node's preview request (with the cluster's token,
	// naming the preview) as a preview, and nothing else so.
	for _, tc := range []struct {
		path, bearer string
		want         int
	}{
		{u.Path + "blob", "", http.StatusUnauthorized},
		{u.Path + "blob", "not-the-token", http.StatusUnauthorized},
		{"/sandboxes", tok, http.StatusNotFound},
		{"/preview/not-the-token/blob", tok, http.StatusUnauthorized},
		{u.Path + "blob", tok, http.StatusOK},
	} {
		req, _ := http.NewRequest("GET", b.url()+tc.path, nil)
		req.Header.Set(cluster.ForwardedHeader, "a")
		req.Header.Set(cluster.PreviewHeader, p.ID)
		if tc.bearer != "" {
			req.Header.Set("Authorization", "Bearer "+tc.bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("a preview's request to b's API, %s (token %v): %d, want %d", tc.path, tc.bearer != "", resp.StatusCode, tc.want)
		}
	}
	// Revoked through c, it is served by no node.
	viaC, err := client.New(client.Options{Addr: c.url(), Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer viaC.Close()
	onC, err := viaC.Sandbox(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if err := onC.RevokePreview(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if code, _, body := get(p.URL+"blob", ""); code != http.StatusUnauthorized {
		t.Errorf("a revoked preview through a: %d %.200s", code, body)
	}

	// Removed through c: gone from every node's list.
	if code, body := c.do(t, tok, "DELETE", "/snapshots/kept", ""); code != http.StatusNoContent {
		t.Fatalf("remove through c: %d %s", code, body)
	}
	for _, n := range []*node{a, b, c} {
		eventually(t, n.name+" lists no snapshot", func() (bool, string) {
			got, said := snapshotsOn(t, n, tok)
			return got != nil && len(got) == 0, said
		})
	}
	if code, body := a.do(t, tok, "GET", "/snapshots/"+snap.ID, ""); code != http.StatusNotFound {
		t.Errorf("a removed snapshot through a: %d %s", code, body)
	}

	// b's kilnd stops: its snapshot is listed with its node's state; what
	// needs its files is refused, naming b.
	again, err := viaA.Handle("other").Snapshot(ctx, api.SnapshotRequest{})
	if err != nil || again.Node != "c" {
		t.Fatalf("a snapshot on c: %+v %v", again, err)
	}
	code, body = a.do(t, tok, "POST", "/sandboxes/web/snapshots", `{"name":"on-b"}`)
	if code != http.StatusCreated {
		t.Fatalf("snapshot of web: %d %s", code, body)
	}
	json.Unmarshal(body, &snap)
	eventually(t, "a lists both", func() (bool, string) {
		got, said := snapshotsOn(t, a, tok)
		return len(got) == 2 && got[snap.ID].Node == "b", said
	})
	for _, sb := range []*client.Sandbox{web, from, viaA.Handle("other")} {
		if err := sb.Delete(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.k.Stop(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b's snapshot lost to a", func() (bool, string) {
		got, said := snapshotsOn(t, a, tok)
		return got[snap.ID].NodeState == api.NodeLost && got[again.ID].NodeState == api.NodeReady, said
	})
	if code, body := a.do(t, tok, "GET", "/snapshots/on-b", ""); code != 200 || !strings.Contains(string(body), `"lost"`) {
		t.Errorf("b's snapshot, b lost: %d %s", code, body)
	}
	for _, tc := range [][2]string{{"GET", "/snapshots/on-b/export"}, {"POST", "/sandboxes"}} {
		code, body := a.do(t, tok, tc[0], tc[1], `{"snapshot":"on-b"}`)
		if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "node b") {
			t.Errorf("%s %s from b's snapshot, b lost: %d %s, want 503 naming node b", tc[0], tc[1], code, body)
		}
	}
}
