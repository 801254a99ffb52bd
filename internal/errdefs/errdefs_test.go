package errdefs_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// answers are every class's API code and HTTP status, as clients see them.
var answers = []struct {
	class  *errdefs.Class
	code   string
	status int
}{
	{errdefs.ErrInvalidArgument, api.CodeInvalid, 400},
	{errdefs.ErrUnauthenticated, api.CodeUnauthorized, 401},
	{errdefs.ErrPermissionDenied, api.CodeForbidden, 403},
	{errdefs.ErrNotFound, api.CodeNotFound, 404},
	{errdefs.ErrMethodNotAllowed, api.CodeMethod, 405},
	{errdefs.ErrAlreadyExists, api.CodeConflict, 409},
	{errdefs.ErrTooLarge, api.CodeTooLarge, 413},
	{errdefs.ErrNoSpace, api.CodeNoSpace, 507},
	{errdefs.ErrOutOfRange, api.CodeOutOfRange, 416},
	{errdefs.ErrFailedPrecondition, api.CodePrecondition, 412},
	{errdefs.ErrUnavailable, api.CodeUnavailable, 503},
	{errdefs.ErrOutcomeUnknown, api.CodeUnknown, 502},
	{errdefs.ErrInternal, api.CodeInternal, 500},
	{errdefs.ErrBadGateway, api.CodeBadGateway, 502},
	{errdefs.ErrCommandNotFound, api.CodeCommandNotFound, 400},
	{errdefs.ErrNotExecutable, api.CodeNotExecutable, 400},
	{errdefs.ErrPaused, api.CodePaused, 409},
}

// Each class answers with its code and status, and the body carries the
// error's message unchanged.
func TestClassAnswers(t *testing.T) {
	for _, a := range answers {
		t.Run(a.code, func(t *testing.T) {
			err := fmt.Errorf("%w: pid %q", errdefs.New(a.class, "thing: went wrong"), "p1")
			rec := httptest.NewRecorder()
			reply.Error(rec, err)
			var got api.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			want := api.Error{Error: api.ErrorBody{Code: a.code, Message: `thing: went wrong: pid "p1"`}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			if rec.Code != a.status {
				t.Errorf("status %d, want %d", rec.Code, a.status)
			}
		})
	}
}

// There is exactly one class per API code: a code added to package api
// needs its class here, and no two classes share a code.
func TestOneClassPerCode(t *testing.T) {
	classes := map[string]string{} // code → class
	for _, a := range answers {
		if other, ok := classes[a.code]; ok {
			t.Errorf("code %s has two classes: %q and %q", a.code, other, a.class)
		}
		classes[a.code] = a.class.Error()
	}
	for name, code := range declared(t, "../../api/api.go", token.CONST, "Code") {
		if _, ok := classes[code]; !ok {
			t.Errorf("api.%s (%q) has no class", name, code)
		}
	}
	if n := len(declared(t, "errdefs.go", token.VAR, "Err")); n != len(answers) {
		t.Errorf("errdefs declares %d classes; this test knows %d", n, len(answers))
	}
}

// declared returns the package-level names of kind in file that begin with
// prefix, each with its value when that is a string literal.
func declared(t *testing.T, file string, kind token.Token, prefix string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != kind {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if !strings.HasPrefix(id.Name, prefix) {
					continue
				}
				names[id.Name] = ""
				if i < len(vs.Values) {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						names[id.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s declares nothing named %s…", file, prefix)
	}
	return names
}

// An error's class is found however it was wrapped, as long as it was
// wrapped with %w; the outermost class, then the first, wins.
func TestClassOf(t *testing.T) {
	full := errdefs.New(errdefs.ErrUnavailable, "stdin: queue full")
	hole := errdefs.New(errdefs.ErrInvalidArgument, "stdin: write would leave a hole")
	plain := errors.New("plain")
	tests := []struct {
		name string
		err  error
		want *errdefs.Class
	}{
		{"a class", errdefs.ErrNotFound, errdefs.ErrNotFound},
		{"a class wrapped", fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, "x"), errdefs.ErrNotFound},
		{"a sentinel", full, errdefs.ErrUnavailable},
		{"wrapped", fmt.Errorf("%w: 3 bytes", full), errdefs.ErrUnavailable},
		{"doubly wrapped", fmt.Errorf("write: %w", fmt.Errorf("%w: 3 bytes", full)), errdefs.ErrUnavailable},
		{"joined", errors.Join(plain, full), errdefs.ErrUnavailable},
		{"joined and wrapped", fmt.Errorf("close: %w", errors.Join(plain, fmt.Errorf("%w: 3 bytes", full))), errdefs.ErrUnavailable},
		{"a class around a sentinel of another", fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, hole), errdefs.ErrFailedPrecondition},
		{"the first of two", fmt.Errorf("%w: %w", hole, full), errdefs.ErrInvalidArgument},
		{"the first of a join", errors.Join(full, hole), errdefs.ErrUnavailable},
		{"no class", plain, nil},
		{"a sentinel formatted with %v", fmt.Errorf("write: %v", full), nil},
		{"nil", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errdefs.ClassOf(tt.err); got != tt.want {
				t.Errorf("ClassOf(%v) = %v, want %v", tt.err, got, tt.want)
			}
			if tt.want != nil && !errors.Is(tt.err, tt.want) {
				t.Errorf("errors.Is(%v, %v) is false", tt.err, tt.want)
			}
		})
	}
}

// A sentinel keeps its message and its identity: errors.Is tells it from
// another of the same class and message, and matches its class.
func TestSentinel(t *testing.T) {
	stopped := errdefs.New(errdefs.ErrFailedPrecondition, "stdin: input stopped")
	twin := errdefs.New(errdefs.ErrFailedPrecondition, "stdin: input stopped")
	wrapped := fmt.Errorf("%w: 2 of 5 accepted bytes delivered", stopped)
	if got, want := wrapped.Error(), "stdin: input stopped: 2 of 5 accepted bytes delivered"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	for _, tt := range []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"itself", stopped, stopped, true},
		{"its class", stopped, errdefs.ErrFailedPrecondition, true},
		{"wrapped, itself", wrapped, stopped, true},
		{"wrapped, its class", wrapped, errdefs.ErrFailedPrecondition, true},
		{"another class", wrapped, errdefs.ErrUnavailable, false},
		{"its twin", wrapped, twin, false},
		{"its class is not it", errdefs.ErrFailedPrecondition, stopped, false},
	} {
		if got := errors.Is(tt.err, tt.target); got != tt.want {
			t.Errorf("%s: errors.Is(%v, %v) = %v, want %v", tt.name, tt.err, tt.target, got, tt.want)
		}
	}
}

// An opaque error answers with its class and its message alone, and
// still reaches its cause: a host's failure is told to a client without
// the host's words, and to kilnd's log with them.
func TestOpaque(t *testing.T) {
	cause := fmt.Errorf("write /sys/fs/cgroup/pids/kiln-x/pids.max: %w", syscall.EINVAL)
	err := fmt.Errorf("create: %w", errdefs.Opaque(errdefs.ErrUnavailable, "sandbox x could not be made", cause))
	if got, want := err.Error(), "create: sandbox x could not be made"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if !errors.Is(err, syscall.EINVAL) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("errors.Is does not reach the cause or the class of %v", err)
	}
	// A class in the cause does not win over the opaque error's own.
	inner := errdefs.Opaque(errdefs.ErrNoSpace, "no space", fmt.Errorf("%w: too big", errdefs.ErrInvalidArgument))
	if got := errdefs.ClassOf(inner); got != errdefs.ErrNoSpace {
		t.Errorf("ClassOf = %v, want no space", got)
	}
	rec := httptest.NewRecorder()
	reply.Error(rec, err)
	if rec.Code != 503 || strings.Contains(rec.Body.String(), "cgroup") {
		t.Errorf("answered %d %s", rec.Code, rec.Body)
	}
}

// The HTTP stack's own errors are answered in the same one place: a body
// past its bound is too large, unless a class says otherwise, and an error
// of no class is internal.
func TestTransportErrors(t *testing.T) {
	rec := httptest.NewRecorder()
	body := http.MaxBytesReader(rec, io.NopCloser(strings.NewReader("0123456789")), 4)
	_, tooLarge := io.ReadAll(body)
	tests := []struct {
		name   string
		err    error
		code   string
		status int
	}{
		{"a body past its bound", tooLarge, api.CodeTooLarge, 413},
		{"a body past its bound, wrapped", fmt.Errorf("decoding: %w", tooLarge), api.CodeTooLarge, 413},
		{"a class around a body past its bound", fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, tooLarge), api.CodeInvalid, 400},
		{"no class", errors.New("disk on fire"), api.CodeInternal, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, status := reply.Code(tt.err); code != tt.code || status != tt.status {
				t.Errorf("Code(%v) = %s %d, want %s %d", tt.err, code, status, tt.code, tt.status)
			}
		})
	}
}
