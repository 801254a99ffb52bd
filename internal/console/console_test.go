package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestServe: the page comes with a policy whose nonce is the one in the
// page, new each time; the assets it names are served with their types;
// nothing else is.
func TestServe(t *testing.T) {
	h, err := New()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.ServeIndex)
	mux.HandleFunc("GET /assets/{file}", h.ServeAsset)
	get := func(path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		return w
	}
	nonceRE := regexp.MustCompile(`'nonce-([A-Za-z0-9+/=]+)'`)
	var nonces []string
	for range 2 {
		w := get("/")
		csp := w.Header().Get("Content-Security-Policy")
		m := nonceRE.FindStringSubmatch(csp)
		if w.Code != 200 || m == nil || !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Fatalf("GET /: %d, policy %q", w.Code, csp)
		}
		if body := w.Body.String(); !strings.Contains(body, `nonce="`+m[1]+`"`) || strings.Contains(body, noncePlaceholder) {
			t.Errorf("the page does not carry its policy's nonce:\n%s", body)
		}
		nonces = append(nonces, m[1])
	}
	if nonces[0] == nonces[1] {
		t.Error("the same nonce twice")
	}
	names, err := fs.Glob(h.assets, "*")
	if err != nil || len(names) == 0 {
		t.Fatalf("no assets: %v", err)
	}
	page := get("/").Body.String()
	for _, want := range []struct{ ext, ctype string }{{".js", "text/javascript"}, {".css", "text/css"}} {
		found := false
		for _, n := range names {
			if !strings.HasSuffix(n, want.ext) || !strings.Contains(page, "/assets/"+n) {
				continue
			}
			found = true
			if w := get("/assets/" + n); w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), want.ctype) || w.Body.Len() == 0 {
				t.Errorf("%s: %d %q", n, w.Code, w.Header().Get("Content-Type"))
			}
		}
		if !found {
			t.Errorf("the page names no %s asset", want.ext)
		}
	}
	for _, p := range []string{"/assets/nope.js", "/assets/..%2findex.html", "/assets/"} {
		if w := get(p); w.Code != 404 {
			t.Errorf("%s: %d", p, w.Code)
		}
	}
}
