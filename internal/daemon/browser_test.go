package daemon_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// TestBrowserCORS: a page of an origin kilnd allows calls the API as a
// browser does: its preflight is answered before authentication (it has
// no token), the calls' answers name the origin (never "*", credentials
// never allowed), and kilnd's error header is readable by the page. Other
// origins' preflights get no permission, and a sandbox's app (a preview)
// answers for itself.
func TestBrowserCORS(t *testing.T) {
	t.Parallel()
	const page = "http://console.example:5173"
	k := startConfig(t, daemon.Config{AllowOrigins: []string{page}})
	defer k.cleanup()
	c := newHostileClient(t, k)

	preflight := func(origin, method, headers string) hostileReply {
		h := http.Header{"Origin": {origin}, "Access-Control-Request-Method": {method}}
		if headers != "" {
			h.Set("Access-Control-Request-Headers", headers)
		}
		return c.send("OPTIONS", "/sandboxes", h, "")
	}
	r := preflight(page, "POST", "authorization,content-type")
	if r.code != 204 || r.header.Get("Access-Control-Allow-Origin") != page ||
		r.header.Get("Access-Control-Allow-Methods") != "POST" ||
		r.header.Get("Access-Control-Allow-Headers") != "authorization,content-type" ||
		r.header.Get("Access-Control-Allow-Credentials") != "" || r.header.Get("Access-Control-Max-Age") == "" {
		t.Errorf("preflight of an allowed origin: %d %v", r.code, r.header)
	}
	for _, origin := range []string{"https://evil.example", "null", page + ".evil.example"} {
		if r := preflight(origin, "POST", "authorization"); r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("preflight of %s allowed: %v", origin, r.header)
		}
	}
	if r := preflight(page, "PATCH", ""); r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight of a method kilnd has no route for allowed: %v", r.header)
	}

	h := hostileBearer(k.d.Token())
	h.Set("Origin", page)
	r = c.send("GET", "/sandboxes", h, "")
	if r.code != 200 || r.header.Get("Access-Control-Allow-Origin") != page || r.header.Get("Vary") == "" {
		t.Errorf("a call from an allowed origin: %d %v", r.code, r.header)
	}
	r = c.send("GET", "/sandboxes/nope", h, "")
	if r.code != 404 || r.header.Get("Access-Control-Allow-Origin") != page || r.header.Get("Access-Control-Expose-Headers") == "" {
		t.Errorf("an error to an allowed origin: %d %v", r.code, r.header)
	}
	// Without the token the page is told so, readably.
	r = c.send("GET", "/sandboxes", http.Header{"Origin": {page}}, "")
	if r.code != 401 || r.header.Get("Access-Control-Allow-Origin") != page {
		t.Errorf("an unauthenticated call from an allowed origin: %d %v", r.code, r.header)
	}
	// A preview is the app's, CORS headers and all, on its own host;
	// kilnd's host serves none.
	_, port, _ := strings.Cut(k.addr, ":")
	for _, origin := range []string{page, "http://" + k.addr, "http://0123456789abcdef.localhost:" + port} {
		r = c.send("GET", "/preview/nope/", http.Header{"Origin": {origin}, "Host": {"0123456789abcdef.localhost:" + port}}, "")
		if r.code != 401 || r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("kilnd's CORS headers on a preview, for %s: %d %v", origin, r.code, r.header)
		}
		r = c.send("OPTIONS", "/preview/nope/", http.Header{"Origin": {origin}, "Host": {"0123456789abcdef.localhost:" + port}, "Access-Control-Request-Method": {"POST"}}, "")
		if r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("kilnd's answer to a preflight of a preview, for %s: %d %v", origin, r.code, r.header)
		}
	}
	if r = c.send("GET", "/preview/nope/", http.Header{"Origin": {page}}, ""); r.code != 404 {
		t.Errorf("a preview's path on kilnd's host: %d %s", r.code, r.body)
	}
}

// TestTokenProtocolAlone: a browser's WebSocket offering the token
// subprotocol alone is answered with it (a handshake whose answer names
// no offered protocol fails) and speaks kiln.raw; beside kiln.v1 the
// answer names kiln.v1 alone, the token never going to the agent.
func TestTokenProtocolAlone(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", map[string]any{"command": "echo", "args": []string{"hi"}}, &st)
	target := "/sandboxes/" + sb + "/exec-stream/" + st.ID + "/logs"
	token := api.TokenProtocolPrefix + k.d.Token()

	ws, r, err := k.hostileDial(target, nil, token)
	if err != nil {
		t.Fatalf("the token alone: %v, %d %s", err, r.code, r.body)
	}
	if got := ws.Subprotocol(); got != token {
		t.Errorf("answered protocol %q, want the token's", got)
	}
	if got := hostileTranscript(t, ws); got != "hi\n[process exited with code 0]\n" {
		t.Errorf("kiln.raw transcript %q", got)
	}

	ws, r, err = k.hostileDial(target, nil, token, api.ProtocolV1)
	if err != nil {
		t.Fatalf("the token beside kiln.v1: %v, %d %s", err, r.code, r.body)
	}
	defer ws.CloseNow()
	if got := ws.Subprotocol(); got != api.ProtocolV1 {
		t.Errorf("answered protocol %q, want kiln.v1", got)
	}
	ctx, cancel := context.WithTimeout(t.Context(), hostileDeadline)
	defer cancel()
	w := &apitest.Checker{Keep: true}
	if err := w.Read(ctx, ws); err != nil {
		t.Fatal(err)
	}
	if got := string(w.Stream("stdout").Data); got != "hi\n" {
		t.Errorf("kiln.v1 output %q", got)
	}

	// A wrong token alone is refused before the agent.
	if _, r, err := k.hostileDial(target, nil, api.TokenProtocolPrefix+"wrong"); err == nil {
		t.Error("a wrong token accepted")
	} else {
		hostileRefused(t, "a wrong token", r, 401)
	}
}
