// Package daemontest runs a kilnd in a test process, on a state directory of its own, its sandboxes' agents the test binary re-executed.
package daemontest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// Env is the sandboxes' base environment in tests.
var Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"}

// Kilnd is a running kilnd. The test binary's TestMain must call
// roles.PlayIfReexecuted first: kilnd re-executes the test binary as each
// sandbox's agent.
//
// In a test binary, every answer kilnd gives is held to its OpenAPI
// document (apitest.Validator): Stop and Close report those that did not
// match, so the test that owns the kilnd fails with them.
type Kilnd struct {
	State   string
	Daemon  *daemon.Daemon
	log     *tailBuffer
	stop    func() error
	stopped atomic.Bool
}

// Log is the end of what kilnd logged (its last logTail bytes), when its
// configuration named no logger of its own; "" otherwise.
func (k *Kilnd) Log() string {
	if k.log == nil {
		return ""
	}
	return k.log.String()
}

// LogOnFailure has t print kilnd's log (Log) when t has failed by its
// end: the one place a host failure's cause is written.
func (k *Kilnd) LogOnFailure(t testing.TB) {
	t.Cleanup(func() {
		if t.Failed() && k.log != nil {
			t.Logf("kilnd's log (its end):\n%s", k.Log())
		}
	})
}

// logTail is how much of kilnd's log a Kilnd keeps.
const logTail = 64 << 10

// tailBuffer keeps the last logTail bytes written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - logTail; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// Start serves state (made if missing) on its unix socket and, when
// listen is set, on TCP, and returns once the socket answers.
func Start(state, listen string) (*Kilnd, error) {
	return StartConfig(daemon.Config{StateDir: state, Listen: listen})
}

// StartT is Start for a test: on a state directory of t's own, closed
// when t ends (an error then fails t); t is skipped without root, which
// kilnd needs.
func StartT(t testing.TB, listen string) *Kilnd {
	t.Helper()
	return StartConfigT(t, daemon.Config{Listen: listen})
}

// StartConfigT is StartT with more of kilnd's configuration; an empty
// StateDir is a directory of t's own.
func StartConfigT(t testing.TB, cfg daemon.Config) *Kilnd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	k, err := StartConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k.LogOnFailure(t)
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("kilnd: %v", err)
		}
	})
	return k
}

// uidsEnv carries the registry ShareUIDs made to the test binary's
// re-runs: a test in a network namespace of its own, a kilnd in a
// process of its own.
const uidsEnv = "SANDKILN_TEST_UIDS"

// sharedUIDs is the registry ShareUIDs made or found: set in TestMain,
// before any test runs, and only read after.
var sharedUIDs string

// NoRaceExitSleep spares the processes a test binary starts the second
// a binary built with the race detector, as the tests' is, sleeps at its
// exit (the detector's atexit_sleep_ms): an agent's exit is part of every
// stop and delete, and the second is none of what they take outside the
// tests. TestMain calls it before m.Run; GORACE reaches the re-executed
// test binary through the environment.
func NoRaceExitSleep() {
	if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
}

// ShareUIDs gives the kilnds a test binary starts one registry of
// windows of host uids, as the kilnds of one host share theirs. A test
// binary whose tests run kilnds side by side calls it in TestMain, before
// m.Run: without it each kilnd claims alone, in its state directory, and
// two running at once hand their sandboxes the same host users, whose
// files, signals and per-user kernel limits are then shared. Their
// egress ranges stay their own (ClaimsDir). The registry reaches the
// test binary's re-runs through the environment; remove, for TestMain
// once the tests have run, removes it where it was made.
func ShareUIDs() (remove func() error, err error) {
	if dir := os.Getenv(uidsEnv); dir != "" {
		sharedUIDs = dir
		return func() error { return nil }, nil
	}
	dir, err := os.MkdirTemp("", "kilnd-uids-")
	if err != nil {
		return nil, err
	}
	if err := os.Setenv(uidsEnv, dir); err != nil {
		os.Remove(dir)
		return nil, err
	}
	sharedUIDs = dir
	return func() error { return os.RemoveAll(dir) }, nil
}

// kilnds bounds how many kilnds of a test binary run at once while they
// share a registry (ShareUIDs): it has 15 windows (sandbox.ClaimUIDs),
// and a kilnd that finds none free fails to start. Tests side by side on
// a machine of many CPUs wait here for one to stop instead; 10 leaves
// windows for the kilnds of the binary's re-runs.
var kilnds = make(chan struct{}, 10)

// ClaimsDir makes dir/claims, the claims directory StartConfig gives a
// kilnd on state directory dir whose configuration names none, and
// returns it: the kilnd's egress range is claimed there, never in the
// host's registry, and its window of host uids in the registry ShareUIDs
// made, if it did. Kilnds that are to see each other's egress ranges are
// given one.
func ClaimsDir(dir string) (string, error) {
	claims := filepath.Join(dir, "claims")
	if sharedUIDs == "" {
		return claims, nil
	}
	if err := os.MkdirAll(claims, 0o700); err != nil {
		return "", err
	}
	// kilnd claims its window in ClaimsDir/uids (daemon.New).
	link := filepath.Join(claims, "uids")
	if err := os.Symlink(sharedUIDs, link); err != nil {
		if target, _ := os.Readlink(link); target != sharedUIDs {
			return "", err
		}
	}
	return claims, nil
}

// StartConfig is Start with more of kilnd's configuration; what it leaves
// out is the tests' (the agent the test binary, Env, runsc in PATH, the
// instances' claims in ClaimsDir of the state directory, never the
// host's, and in a test binary the OpenAPI validator as its Wrap).
func StartConfig(cfg daemon.Config) (*Kilnd, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("kilnd needs root")
	}
	if cfg.Exe == "" {
		cfg.Exe = os.Args[0]
	}
	if cfg.Env == nil {
		cfg.Env = Env
	}
	if cfg.ClaimsDir == "" {
		var err error
		if cfg.ClaimsDir, err = ClaimsDir(cfg.StateDir); err != nil {
			return nil, err
		}
	}
	if cfg.Runsc == "" {
		// gVisor where runsc is in PATH (and new enough: daemon.Backends).
		cfg.Runsc, _ = exec.LookPath("runsc")
	}
	var openapi *apitest.Validator
	if cfg.Wrap == nil && testing.Testing() {
		var err error
		if openapi, err = apitest.NewValidator(api.OpenAPI); err != nil {
			return nil, err
		}
		cfg.Wrap = openapi.Wrap
	}
	var log *tailBuffer
	if cfg.Log == nil {
		log = &tailBuffer{}
		cfg.Log = slog.New(slog.NewTextHandler(log, nil))
	}
	state := cfg.StateDir
	release := func() {}
	if sharedUIDs != "" {
		kilnds <- struct{}{}
		release = sync.OnceFunc(func() { <-kilnds })
	}
	d, err := daemon.New(cfg)
	if err != nil {
		release()
		return nil, err
	}
	if openapi != nil {
		// A preview's host is the server the document's preview path
		// names of its own.
		openapi.OwnServers = d.PreviewRequest
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx) }()
	k := &Kilnd{State: state, Daemon: d, log: log, stop: sync.OnceValue(func() error {
		cancel()
		err := <-served
		d.Close()
		release()
		// Serve has waited for its handlers, and so for their checks
		// (but those of hijacked connections still open).
		if openapi != nil {
			err = errors.Join(err, openapi.Err())
		}
		return err
	})}
	deadline := time.Now().Add(time.Minute)
	for {
		if c, err := net.Dial("unix", filepath.Join(state, daemon.SocketName)); err == nil {
			c.Close()
			return k, nil
		}
		select {
		case err := <-served:
			served <- err
			k.stop()
			return nil, err
		default:
		}
		if time.Now().After(deadline) {
			k.stop()
			return nil, errors.New("kilnd did not start serving")
		}
		time.Sleep(time.Millisecond)
	}
}

// Stop stops serving; sandboxes keep running, as with a real kilnd. Its
// error includes the answers that did not match the OpenAPI document.
func (k *Kilnd) Stop() error {
	k.stopped.Store(true)
	return k.stop()
}

// Close deletes every sandbox, their logs too, and stops serving; its
// error is Stop's and the deletions'.
func (k *Kilnd) Close() error {
	if k.stopped.Load() {
		// Stopped already: its sandboxes are the next kilnd's to end.
		return nil
	}
	var errs []error
	for _, s := range k.Daemon.List() {
		errs = append(errs, k.Daemon.Delete(s.ID, true))
	}
	errs = append(errs, k.stop())
	return errors.Join(errs...)
}

// CutProxy is a state directory of its own whose socket forwards to a
// kilnd's, cutting every connection once it has carried Cut bytes from
// kilnd, as a network that drops connections does; after RefuseAfter cuts
// (if set), it closes every new connection at once.
type CutProxy struct {
	State       string
	Cut         int64
	RefuseAfter int64
	l           net.Listener
	cuts        atomic.Int64
	wg          sync.WaitGroup
}

// Proxy serves a CutProxy of k in dir.
func (k *Kilnd) Proxy(dir string, cut, refuseAfter int64) (*CutProxy, error) {
	l, err := net.Listen("unix", filepath.Join(dir, daemon.SocketName))
	if err != nil {
		return nil, err
	}
	p := &CutProxy{State: dir, Cut: cut, RefuseAfter: refuseAfter, l: l}
	p.wg.Go(func() { p.serve(filepath.Join(k.State, daemon.SocketName)) })
	return p, nil
}

func (p *CutProxy) serve(upstream string) {
	for {
		down, err := p.l.Accept()
		if err != nil {
			return
		}
		if p.RefuseAfter > 0 && p.cuts.Load() >= p.RefuseAfter {
			down.Close()
			continue
		}
		up, err := net.Dial("unix", upstream)
		if err != nil {
			down.Close()
			continue
		}
		p.wg.Go(func() {
			io.Copy(up, down)
			up.Close()
		})
		p.wg.Go(func() {
			if n, _ := io.CopyN(down, up, p.Cut); n == p.Cut {
				p.cuts.Add(1)
			}
			down.Close()
			up.Close()
		})
	}
}

// Cuts reports how many connections were cut.
func (p *CutProxy) Cuts() int64 { return p.cuts.Load() }

// Close stops serving and waits for the connections to end.
func (p *CutProxy) Close() {
	p.l.Close()
	p.wg.Wait()
}
