package daemon

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// FuzzParseLogQuery parses the query of GET /sandboxes/{id}/logs/{pid}.
// Bad values are invalid arguments (400); what is accepted is what the query
// says, within bounds, and reads back the same once written out.
func FuzzParseLogQuery(f *testing.F) {
	for _, q := range []string{"", "stream=stdout&tail=2", "stream=stderr&follow=1&format=json", "since=10m&until=2026-01-02T03:04:05.5Z",
		"tail=-1", "tail=9223372036854775807", "tail=99999999999999999999", "stream=both", "since=-5m", "since=yesterday",
		"format=xml", "follow=maybe", "stream=%ff", "until=0001-01-01T00:00:00Z", "since=2562047h"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.URL.RawQuery = raw
		lq, err := parseLogQuery(r)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("%q: error %v is not an invalid argument", raw, err)
			}
			rec := httptest.NewRecorder()
			reply.Error(rec, err)
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("%q: %v answered with %d", raw, err, rec.Code)
			}
			if msg := err.Error(); !utf8.ValidString(msg) || len(msg) > 512 {
				t.Fatalf("%q: message %q", raw, msg)
			}
			return
		}
		q := r.URL.Query()
		fl := lq.filter
		if fl.Stdout != (q.Get("stream") == "stdout") || fl.Stderr != (q.Get("stream") == "stderr") || fl.Meta {
			t.Fatalf("%q: streams %+v", raw, fl)
		}
		wantTail := -1
		if v := q.Get("tail"); v != "" {
			wantTail, _ = strconv.Atoi(v)
		}
		if fl.Tail != wantTail || fl.Tail < -1 {
			t.Fatalf("%q: tail %d", raw, fl.Tail)
		}
		if lq.json != (q.Get("format") == "json") {
			t.Fatalf("%q: json %v", raw, lq.json)
		}
		if q.Get("since") == "" && !fl.Since.IsZero() || q.Get("until") == "" && !fl.Until.IsZero() {
			t.Fatalf("%q: since %v, until %v", raw, fl.Since, fl.Until)
		}
		back := url.Values{"follow": {strconv.FormatBool(lq.follow)}, "tail": {strconv.Itoa(fl.Tail)}}
		if fl.Tail < 0 {
			back.Del("tail")
		}
		switch {
		case fl.Stdout:
			back.Set("stream", "stdout")
		case fl.Stderr:
			back.Set("stream", "stderr")
		}
		if lq.json {
			back.Set("format", "json")
		}
		if !fl.Since.IsZero() {
			back.Set("since", fl.Since.Format(time.RFC3339Nano))
		}
		if !fl.Until.IsZero() {
			back.Set("until", fl.Until.Format(time.RFC3339Nano))
		}
		r.URL.RawQuery = back.Encode()
		again, err := parseLogQuery(r)
		if err != nil {
			t.Fatalf("%q: written out as %q, refused: %v", raw, r.URL.RawQuery, err)
		}
		ag := again.filter
		if again.follow != lq.follow || again.json != lq.json || ag.Stdout != fl.Stdout || ag.Stderr != fl.Stderr ||
			ag.Tail != fl.Tail || !ag.Since.Equal(fl.Since) || !ag.Until.Equal(fl.Until) {
			t.Fatalf("%q: %+v read back from %q as %+v", raw, lq, r.URL.RawQuery, again)
		}
	})
}

// FuzzCredentials holds kilnd's token check and the stripping of
// credentials bound for an agent against arbitrary Authorization and
// Sec-WebSocket-Protocol headers: a request passes only with the exact token
// in one of the two forms, and whatever is forwarded carries neither an
// Authorization header nor a kiln.token.* subprotocol, the other protocols
// kept in order.
func FuzzCredentials(f *testing.F) {
	const token = "3f1c0a9d2b7e4c5a8f6e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a"
	for _, tc := range [][2]string{
		{"Bearer " + token, ""}, {"Bearer " + token + " ", ""}, {"bearer " + token, ""}, {"Bearer " + token[:63], ""},
		{"Bearer " + token[:63] + "b", ""}, {"Bearer " + token + "0", ""}, {"", "kiln.v1, kiln.token." + token},
		{"", "kiln.token." + token[:63] + "b, kiln.token." + token}, {"Bearer x", "kiln.token." + token},
		{"", " , kiln.raw,,kiln.token.\xff"}, {"Basic " + token, ""}, {"", "KILN.TOKEN." + token},
	} {
		f.Add(tc[0], tc[1])
	}
	f.Fuzz(func(t *testing.T, auth, protocols string) {
		d := &Daemon{token: token}
		r := httptest.NewRequest("GET", "/", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		if protocols != "" {
			r.Header.Set("Sec-WebSocket-Protocol", protocols)
		}
		offered := offeredProtocols(r)
		if d.authorized(r) == nil {
			bearer, isBearer := strings.CutPrefix(auth, "Bearer ")
			if !(isBearer && strings.TrimSpace(bearer) == token) && !(!isBearer && slices.Contains(offered, api.TokenProtocolPrefix+token)) {
				t.Fatalf("authorized with Authorization %q and protocols %q", auth, protocols)
			}
		}
		out := r.Header.Clone()
		stripCredentials(r, out)
		if v, ok := out["Authorization"]; ok {
			t.Fatalf("Authorization %q forwarded", v)
		}
		fwd := &http.Request{Header: out}
		kept := offeredProtocols(fwd)
		if slices.ContainsFunc(kept, isTokenProtocol) {
			t.Fatalf("protocols %q forwarded as %q", protocols, out.Values("Sec-WebSocket-Protocol"))
		}
		if want := slices.DeleteFunc(slices.Clone(offered), isTokenProtocol); !slices.Equal(kept, want) {
			t.Fatalf("protocols %q forwarded as %q, want %q", protocols, kept, want)
		}
	})
}

// FuzzAgentPath: a process call's path goes to the agent as the client
// escaped it, less /sandboxes/{id}: the same escaped segments, so that an
// escaped slash or dot in an id never becomes a separator or a dot-dot.
func FuzzAgentPath(f *testing.F) {
	for _, p := range []string{"/sandboxes/x/exec", "/sandboxes/x/exec-stream/", "/sandboxes/x/exec-stream/..%2F..%2Fy/wait",
		"/sandboxes/x/exec-stream/%2e%2e", "/sandboxes/%30x/exec-stream/a%2Fb", "/sandboxes/x", "/sandboxes/x/exec-stream/%E2%80%AE%00"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, target string) {
		u, err := url.ParseRequestURI(target)
		if err != nil || !strings.HasPrefix(u.Path, "/sandboxes/") {
			return
		}
		path, rawPath := agentPath(u)
		esc := strings.Split(u.EscapedPath(), "/")
		if len(esc) < 4 {
			if path != "/" || rawPath != "" {
				t.Fatalf("%q: no process call, forwarded as %q (%q)", target, path, rawPath)
			}
			return
		}
		if want := "/" + strings.Join(esc[3:], "/"); rawPath != want {
			t.Fatalf("%q: forwarded as %q, want %q", target, rawPath, want)
		}
		if got := (&url.URL{Path: path, RawPath: rawPath}).EscapedPath(); got != rawPath {
			t.Fatalf("%q: the agent's request line has %q, not %q", target, got, rawPath)
		}
	})
}
