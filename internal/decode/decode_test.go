package decode_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/decode"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// body decodes b as a handler would, into v.
func body(b string, v any) error {
	return decode.Body(httptest.NewRecorder(), httptest.NewRequest("POST", "/", strings.NewReader(b)), v)
}

// TestBody: what is accepted and what is refused, with the class, the
// status and the sentinel of each refusal.
func TestBody(t *testing.T) {
	// exactly is a request of api.MaxBody bytes, the most accepted.
	exactly := `{"command":"` + strings.Repeat("x", api.MaxBody-len(`{"command":""}`)) + `"}`
	tests := []struct {
		name   string
		body   string
		want   api.ExecRequest
		status int // 0: accepted
	}{
		{"an object", `{"command":"true","args":["a"]}`, api.ExecRequest{Command: "true", Args: []string{"a"}}, 0},
		{"an empty body: every default", ``, api.ExecRequest{}, 0},
		{"white space around", " \n{\"command\":\"true\"}\n ", api.ExecRequest{Command: "true"}, 0},
		{"null", `null`, api.ExecRequest{}, 0},
		{"at the bound", exactly, api.ExecRequest{Command: exactly[len(`{"command":"`) : len(exactly)-2]}, 0},
		{"one byte over the bound", exactly + " ", api.ExecRequest{}, 413},
		{"far over the bound", `{"command":"` + strings.Repeat("x", 2*api.MaxBody), api.ExecRequest{}, 413},
		{"an unknown field", `{"command":"true","comand":"x"}`, api.ExecRequest{}, 400},
		{"a second value", `{"command":"true"} {}`, api.ExecRequest{}, 400},
		{"data after the value", `{"command":"true"}x`, api.ExecRequest{}, 400},
		{"an array", `[]`, api.ExecRequest{}, 400},
		{"a field of the wrong type", `{"command":1}`, api.ExecRequest{}, 400},
		{"a number out of range", `{"timeout_ms":1e400}`, api.ExecRequest{}, 400},
		{"cut short", `{"command":`, api.ExecRequest{}, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got api.ExecRequest
			err := body(tt.body, &got)
			if tt.status == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("decoded (-want +got):\n%s", diff)
				}
				return
			}
			if _, status := reply.Code(err); status != tt.status {
				t.Fatalf("%v answers %d, want %d", err, status, tt.status)
			}
			var maxErr *http.MaxBytesError
			switch tt.status {
			case 413:
				if !errors.Is(err, errdefs.ErrTooLarge) || !errors.As(err, &maxErr) || errors.Is(err, decode.ErrMalformed) {
					t.Errorf("%v: want too large, wrapping the http.MaxBytesError", err)
				}
			case 400:
				if !errors.Is(err, decode.ErrMalformed) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("%v: want malformed, of class invalid argument", err)
				}
			}
		})
	}
}

// FuzzBody decodes request bodies as kilnd's and the agent's handlers do
// (a create, an exec, a signal, a resize). Refusals are malformed or too
// large, answered 400 or 413; what is accepted is empty or one JSON value,
// nothing after it, and decodes the same once encoded again.
func FuzzBody(f *testing.F) {
	for _, b := range []string{`{"command":"sh","args":["-c","true"],"env":{"A":"b"},"tty":{"cols":80,"rows":24}}`,
		`{"signal":"TERM","group":false}`, `{"cols":80,"rows":24}`, `{"command":"true"} trailing`, `{"unknown":1}`,
		`null`, ` {} `, ``, `{"cols":70000}`, `{"command":"a\xffb"}`, `{"command":"\ud800"}`, `[]`, `{}{}`,
		`{"limits":{"cpus":0.5,"pids":64},"init":{"command":"true"}}`} {
		for kind := range uint8(4) {
			f.Add([]byte(b), kind)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, kind uint8) {
		var v, again any
		switch kind % 4 {
		case 0:
			v, again = new(api.ExecRequest), new(api.ExecRequest)
		case 1:
			v, again = new(api.SignalRequest), new(api.SignalRequest)
		case 2:
			v, again = new(api.ResizeRequest), new(api.ResizeRequest)
		case 3:
			v, again = new(api.CreateSandbox), new(api.CreateSandbox)
		}
		err := decode.Body(httptest.NewRecorder(), httptest.NewRequest("POST", "/", bytes.NewReader(b)), v)
		if err != nil {
			if !errors.Is(err, decode.ErrMalformed) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("%q: error %v is neither malformed nor too large", b, err)
			}
			rec := httptest.NewRecorder()
			reply.Error(rec, err)
			if rec.Code != http.StatusBadRequest && rec.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("%q: %v answered with %d", b, err, rec.Code)
			}
			return
		}
		if len(bytes.TrimSpace(b)) > 0 && !json.Valid(b) {
			t.Fatalf("accepted %q, which is not one JSON value", b)
		}
		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := decode.Body(httptest.NewRecorder(), httptest.NewRequest("POST", "/", bytes.NewReader(enc)), again); err != nil {
			t.Fatalf("%q: its encoding %s is refused: %v", b, enc, err)
		}
		// An empty map or list is left out of the encoding (omitempty).
		if diff := cmp.Diff(v, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%q: encoded and decoded again (-first +again):\n%s", b, diff)
		}
	})
}
