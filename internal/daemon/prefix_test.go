package daemon_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// TestAnswersCarryNoPrefix: an error kilnd answers is its words alone;
// each client says who spoke ("kilnd: " in the SDKs), once. Refusals of
// every layer are asked for over TCP: routing, authentication, a path,
// a create's check, a lookup.
func TestAnswersCarryNoPrefix(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	for _, tc := range []struct{ method, path, token, body string }{
		{"GET", "/no/such/route", k.d.Token(), ""},
		{"DELETE", "/healthz", k.d.Token(), ""},
		{"GET", "/sandboxes/a/../b", k.d.Token(), ""},
		{"GET", "/sandboxes", "wrong", ""},
		{"GET", "/sandboxes", "", ""},
		{"POST", "/sandboxes", k.d.Token(), `{"limits": {"pids": 1099511627776}}`},
		{"GET", "/sandboxes/no-such-sandbox", k.d.Token(), ""},
		{"POST", "/images/pull", k.d.Token(), `{}`},
	} {
		req, err := http.NewRequest(tc.method, "http://"+k.addr+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e api.Error
		if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode < 400 || e.Error.Message == "" {
			t.Errorf("%s %s: %d %q, want an error", tc.method, tc.path, resp.StatusCode, b)
			continue
		}
		if strings.HasPrefix(e.Error.Message, "kilnd") {
			t.Errorf("%s %s: %q, want no prefix", tc.method, tc.path, e.Error.Message)
		}
	}
}

// TestNoPrefixInErrorClasses holds the package's source to the same: no
// message given to errdefs.New or errdefs.Opaque, nor what hostFailure is
// told, begins with "kilnd: " (the refusals TestAnswersCarryNoPrefix
// cannot reach on a healthy host among them).
func TestNoPrefixInErrorClasses(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			arg := -1
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				switch fn.Sel.Name {
				case "New", "Opaque":
					if x, ok := fn.X.(*ast.Ident); ok && x.Name == "errdefs" {
						arg = 1
					}
				case "hostFailure":
					arg = 0
				}
			}
			if arg < 0 || arg >= len(call.Args) {
				return true
			}
			if lit := firstLiteral(call.Args[arg]); strings.HasPrefix(lit, "kilnd: ") {
				t.Errorf("%s: a message beginning %q", fset.Position(call.Pos()), lit)
			}
			return true
		})
	}
}

// firstLiteral is the string literal a message expression begins with: the
// expression itself, the left of a concatenation, or fmt.Sprintf's format.
func firstLiteral(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		s, _ := strconv.Unquote(e.Value)
		return s
	case *ast.BinaryExpr:
		return firstLiteral(e.X)
	case *ast.CallExpr:
		if len(e.Args) > 0 {
			return firstLiteral(e.Args[0])
		}
	}
	return ""
}
