package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// Each of the API's codes has its Is… function, true for that code alone,
// but IsInvalid, which takes a request too large as malformed too; an
// Error is found however it was wrapped.
func TestIsCode(t *testing.T) {
	is := map[string]func(error) bool{
		"IsInvalid":            client.IsInvalid,
		"IsTooLarge":           client.IsTooLarge,
		"IsUnauthenticated":    client.IsUnauthenticated,
		"IsPermissionDenied":   client.IsPermissionDenied,
		"IsNotFound":           client.IsNotFound,
		"IsMethodNotAllowed":   client.IsMethodNotAllowed,
		"IsAlreadyExists":      client.IsAlreadyExists,
		"IsOutOfRange":         client.IsOutOfRange,
		"IsFailedPrecondition": client.IsFailedPrecondition,
		"IsUnavailable":        client.IsUnavailable,
		"IsOutcomeUnknown":     client.IsOutcomeUnknown,
		"IsInternal":           client.IsInternal,
		"IsBadGateway":         client.IsBadGateway,
		"IsNoSpace":            client.IsNoSpace,
		"IsPaused":             client.IsPaused,
	}
	tests := []struct {
		code string
		want []string
	}{
		{api.CodeInvalid, []string{"IsInvalid"}},
		{api.CodeTooLarge, []string{"IsInvalid", "IsTooLarge"}},
		{api.CodeUnauthorized, []string{"IsUnauthenticated"}},
		{api.CodeForbidden, []string{"IsPermissionDenied"}},
		{api.CodeNotFound, []string{"IsNotFound"}},
		{api.CodeMethod, []string{"IsMethodNotAllowed"}},
		{api.CodeConflict, []string{"IsAlreadyExists"}},
		{api.CodeOutOfRange, []string{"IsOutOfRange"}},
		{api.CodePrecondition, []string{"IsFailedPrecondition"}},
		{api.CodeUnavailable, []string{"IsUnavailable"}},
		{api.CodeUnknown, []string{"IsOutcomeUnknown"}},
		{api.CodeInternal, []string{"IsInternal"}},
		{api.CodeBadGateway, []string{"IsBadGateway"}},
		{api.CodeNoSpace, []string{"IsNoSpace"}},
		{api.CodePaused, []string{"IsPaused"}},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			err := fmt.Errorf("start: %w", &client.Error{Status: 400, Code: tt.code, Message: "no"})
			var got []string
			for name, f := range is {
				if f(err) {
					got = append(got, name)
				}
			}
			slices.Sort(got)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("helpers true for %s (-want +got):\n%s", tt.code, diff)
			}
		})
	}
	for name, f := range is {
		if f(errors.New("plain")) {
			t.Errorf("%s is true for an error kilnd did not answer with", name)
		}
	}
}

// stalled is a kilnd that takes every request and never finishes its
// answer: with head set it sends the status and the start of a body first.
// arrived receives each request's path once it is in.
func stalled(t *testing.T, head bool) (*client.Client, <-chan string) {
	arrived := make(chan string, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read to the body's end: only then does the server watch the
		// connection, and end the request's context when the client goes.
		io.Copy(io.Discard, r.Body)
		if head {
			w.Write([]byte(`{"id":`))
			w.(http.Flusher).Flush()
		}
		arrived <- r.URL.Path
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(client.Options{Addr: strings.TrimPrefix(srv.URL, "http://"), Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, arrived
}

// A call whose context ends while kilnd has the request is an unknown
// outcome, and says why: errors.Is finds both ErrOutcomeUnknown and the
// context's error through it.
func TestContextEndsDuringCall(t *testing.T) {
	calls := []struct {
		name string
		head bool
		call func(context.Context, *client.Client) error
	}{
		{"create, no answer", false, func(ctx context.Context, c *client.Client) error {
			_, err := c.CreateSandbox(ctx, client.SandboxOptions{})
			return err
		}},
		{"create, half an answer", true, func(ctx context.Context, c *client.Client) error {
			_, err := c.CreateSandbox(ctx, client.SandboxOptions{})
			return err
		}},
		{"exec, no answer", false, func(ctx context.Context, c *client.Client) error {
			_, err := c.Handle("sb").Exec(ctx, client.ExecOptions{Command: "true"})
			return err
		}},
		{"exec, half an answer", true, func(ctx context.Context, c *client.Client) error {
			_, err := c.Handle("sb").Exec(ctx, client.ExecOptions{Command: "true"})
			return err
		}},
	}
	for _, tt := range calls {
		t.Run(tt.name+", deadline", func(t *testing.T) {
			t.Parallel()
			c, arrived := stalled(t, tt.head)
			// Long enough for the request to reach the server first, on
			// a loaded machine too.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			err := tt.call(ctx, c)
			select {
			case <-arrived:
			default:
				t.Fatalf("the deadline passed before the request arrived: %v", err)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrOutcomeUnknown) || !client.IsOutcomeUnknown(err) {
				t.Errorf("error %v: want an unknown outcome because the deadline passed", err)
			}
		})
		t.Run(tt.name+", canceled", func(t *testing.T) {
			c, arrived := stalled(t, tt.head)
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				select {
				case <-arrived:
				case <-ctx.Done():
				}
				cancel()
			}()
			err := tt.call(ctx, c)
			if !errors.Is(err, context.Canceled) || !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("error %v: want an unknown outcome because the context was canceled", err)
			}
		})
	}
}

// TestOnePrefix: kilnd's answers carry no prefix of their own; the SDK
// puts one, "kilnd: ", before each, once.
func TestOnePrefix(t *testing.T) {
	t.Parallel()
	k := startKilndOn(t, "127.0.0.1:0")
	addr := k.Daemon.TCPAddr()
	ctx := ctxT(t)
	wrong, err := client.New(client.Options{Addr: addr, Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	_, unauthenticated := wrong.Sandboxes(ctx)
	pids := int64(1) << 40
	c, err := client.New(client.Options{Addr: addr, Token: k.Daemon.Token()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, invalid := c.CreateSandbox(ctx, client.SandboxOptions{Limits: api.LimitsRequest{Pids: &pids}})
	_, notFound := c.Sandbox(ctx, "no-such-sandbox")
	for name, err := range map[string]error{"unauthenticated": unauthenticated, "invalid": invalid, "not found": notFound} {
		var e *client.Error
		if !errors.As(err, &e) {
			t.Errorf("%s: %v, want an Error", name, err)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "kilnd: ") || strings.Count(msg, "kilnd: ") != 1 || strings.HasPrefix(e.Message, "kilnd") {
			t.Errorf("%s: %q (kilnd said %q), want one prefix, the SDK's", name, msg, e.Message)
		}
	}
}
