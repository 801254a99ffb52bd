package daemon_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// TestHTTPConventions holds kilnd to what HTTP clients and code generators
// expect of an API: a create answers 201 with the new resource's Location,
// a method its path does not take answers 405 with Allow, a path no route
// has 404, and no API route answers with a redirect.
func TestHTTPConventions(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	send := func(method, path, body string) (*http.Response, api.ErrorBody) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+k.addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+k.d.Token())
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e struct{ Error api.ErrorBody }
		if resp.StatusCode >= 300 {
			if err := json.Unmarshal(b, &e); err != nil {
				t.Errorf("%s %s: %d answered %q, not the API's error shape", method, path, resp.StatusCode, b)
			}
		}
		return resp, e.Error
	}

	resp, _ := send("POST", "/sandboxes", "{}")
	if resp.StatusCode != 201 {
		t.Fatalf("create answered %d, want 201", resp.StatusCode)
	}
	loc := resp.Header.Get("Location")
	if got, _ := send("GET", loc, ""); !strings.HasPrefix(loc, "/sandboxes/") || got.StatusCode != 200 {
		t.Errorf("create's Location %q answers %d", loc, got.StatusCode)
	}

	for _, c := range []struct{ method, path, allow string }{
		{"PUT", "/sandboxes", "GET, HEAD, POST"},
		{"DELETE", "/sandboxes", "GET, HEAD, POST"},
		{"PATCH", loc, "GET, HEAD, DELETE"},
		{"POST", "/healthz", "GET, HEAD"},
		{"POST", "/version", "GET, HEAD"},
		{"DELETE", "/images", "GET, HEAD"},
		{"PUT", "/images/busybox", "GET, HEAD, DELETE"},
		{"POST", loc + "/logs", "GET, HEAD"},
	} {
		resp, e := send(c.method, c.path, "")
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != c.allow || e.Code != api.CodeMethod {
			t.Errorf("%s %s: %d, Allow %q, code %q; want 405, Allow %q, %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), e.Code, c.allow, api.CodeMethod)
		}
	}
	// Paths a ServeMux would redirect (a slash added) are not routes.
	for _, path := range []string{loc + "/files", loc + "/ports", loc + "/exec-stream/x/..", "/nothing", "/sandboxes/"} {
		for _, method := range []string{"GET", "DELETE"} {
			resp, e := send(method, path, "")
			if resp.StatusCode == 405 || resp.StatusCode/100 == 3 || resp.StatusCode/100 == 2 || resp.Header.Get("Location") != "" {
				t.Errorf("%s %s: %d (Location %q, %s), want a refusal without a redirect", method, path, resp.StatusCode, resp.Header.Get("Location"), e.Message)
			}
		}
	}
}
