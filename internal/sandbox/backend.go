package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/internal/handoff"
)

// A Backend makes sandboxes of one kind (a runtime) and finds them again
// after kilnd restarts. Everything a kind of sandbox holds on the host
// (cgroups, uid ranges, runtime state) stays behind it.
type Backend interface {
	// Name is the runtime's name in the API.
	Name() string
	// Create makes a sandbox and returns once its agent answers; on
	// failure nothing of it is left running. Options.UIDBase is the
	// backend's to choose. With Options.Restart it starts a stopped
	// sandbox of its own again, from that instance's files.
	Create(ctx context.Context, o Options) (Instance, error)
	// Adopt takes back a sandbox from the state its Instance gave, whether
	// its agent still runs or not (Alive says): what it holds stays held
	// until it is destroyed.
	Adopt(state json.RawMessage) (Instance, error)
	// EndLeftover ends what a create interrupted by a crash of kilnd left
	// of sandbox id, in directory dir, which has no state recorded.
	EndLeftover(id, dir string) error
}

// An Instance is one sandbox of a backend.
type Instance interface {
	// Dial connects to the agent's API.
	Dial(ctx context.Context) (net.Conn, error)
	// Alive reports whether the agent still runs.
	Alive() bool
	// AwaitExit blocks until the agent has exited or stop is closed.
	AwaitExit(stop <-chan struct{})
	// End kills whatever is left once the agent is gone and frees the
	// host resources that only a running sandbox needs.
	End()
	// Halt ends every process in the sandbox, then its agent, whose own
	// shutdown ends their captured runs, and waits, bounded, until its
	// agent has exited. Its files (its directory, writable layers and
	// captured logs) and its uid range stay, for Destroy or for a Create
	// that starts it again (Options.Restart); End, once the agent is gone,
	// frees the rest.
	Halt() error
	// Destroy ends the sandbox and removes it, its captured logs (and the
	// directory holding them) kept when keepLogs.
	Destroy(keepLogs bool) error
	// InitExit is the exit of the sandbox's init command, once recorded.
	InitExit() *handoff.InitExit
	// AgentPID is the agent's process, or the process standing for it,
	// in kilnd's pid namespace.
	AgentPID() int
	// State is what Adopt needs to find the sandbox again: opaque to
	// kilnd, recorded with the sandbox.
	State() json.RawMessage
	// Stats reads the sandbox's resource figures from its cgroups; it
	// fails once the sandbox has ended.
	Stats() (Stats, error)
	// ExitReason says why the agent ended, once it has, when the backend
	// knows more than that it exited; empty otherwise.
	ExitReason() string
	// Pause stops every process of the sandbox where it is, its memory
	// kept, and returns once none runs; Resume lets them run on. Both may
	// be called again on a sandbox paused or running already, one at a
	// time (kilnd's lifecycle ops are). A namespace sandbox's agent runs
	// on while it is paused, holding its processes' output and their
	// watchers; a gVisor sandbox's is paused with it and answers nothing
	// until the resume (pause.go). Halt and Destroy end a paused sandbox
	// as they end a running one.
	Pause() error
	Resume() error
}

// Runtime names.
const (
	RuntimeNamespaces = "namespaces"
	RuntimeGVisor     = "gvisor"
)

// idleConnTimeout is how long kilnd keeps an idle connection to an agent.
const idleConnTimeout = 5 * time.Second

// Transport is an HTTP transport whose every request goes to the agent
// that dial reaches.
func Transport(dial func(context.Context) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConnsPerHost: 16,
		// An idle connection holds its two buffers, half a MiB in all, in
		// kilnd for each sandbox: a burst of calls reuses it, an idle
		// sandbox holds none for long (a unix socket dial is cheap).
		IdleConnTimeout: idleConnTimeout,
		// A file or a tar going in moves in larger writes than 4 KiB.
		WriteBufferSize: 256 << 10,
		ReadBufferSize:  256 << 10,
	}
}

// IDRanges hands out the host uid ranges sandboxes map their users to,
// one per sandbox, so that the users of two sandboxes are never the same
// host users: files, signals and the kernel's per-user limits stay apart.
// The one exception are the gVisor sandboxes restored from another's
// memory (Share): their processes are saved with their users, which no
// host process ever runs as (gVisor's kernel runs them all).
type IDRanges struct {
	first int // the window's first uid (see ClaimUIDs)

	mu   sync.Mutex
	used map[int][]string // base → the sandboxes that hold it
}

// NewIDRanges returns an empty set of ranges, UIDWindow of them from
// DefaultUIDBase.
func NewIDRanges() *IDRanges { return NewIDRangesFrom(DefaultUIDBase) }

// NewIDRangesFrom returns an empty set of ranges, UIDWindow of them from
// first, a window ClaimUIDs gave.
func NewIDRangesFrom(first int) *IDRanges {
	return &IDRanges{first: first, used: map[int][]string{}}
}

// Claim gives sandbox id the lowest free range and returns its base; it
// fails when the window is full.
func (r *IDRanges) Claim(id string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	base := r.first
	for len(r.used[base]) > 0 {
		base += IDRange
	}
	if base >= r.first+UIDWindow*IDRange {
		return 0, fmt.Errorf("sandbox: %d sandboxes hold every uid range of this kilnd", UIDWindow)
	}
	r.used[base] = []string{id}
	return base, nil
}

// Hold marks base as sandbox id's, for a sandbox found again.
func (r *IDRanges) Hold(base int, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, other := range r.used[base] {
		if other != id {
			return fmt.Errorf("sandbox: uid range %d is both %s's and %s's", base, other, id)
		}
	}
	r.used[base] = []string{id}
	return nil
}

// Share marks base as sandbox id's too, whoever else holds it: a gVisor
// sandbox restored from another's memory, whose users it keeps.
func (r *IDRanges) Share(base int, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if base < r.first || base >= r.first+UIDWindow*IDRange || (base-r.first)%IDRange != 0 {
		return fmt.Errorf("sandbox: uid range %d is not one of this kilnd's", base)
	}
	if !slices.Contains(r.used[base], id) {
		r.used[base] = append(r.used[base], id)
	}
	return nil
}

// Release frees base of sandbox id; the range is free once no sandbox
// holds it.
func (r *IDRanges) Release(base int, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := slices.DeleteFunc(r.used[base], func(h string) bool { return h == id })
	if len(held) == 0 {
		delete(r.used, base)
	} else {
		r.used[base] = held
	}
}

// Namespaces is the backend of Linux namespace sandboxes: the agent is
// kilnd's own binary, PID 1 of a set of new namespaces, in cgroups of its
// own, its processes mapped to a uid range of their own.
type Namespaces struct {
	// Exe is the binary re-executed as the agent.
	Exe    string
	Ranges *IDRanges
	// Instance is kilnd's instance (Options.Instance).
	Instance string
}

// Name implements Backend.
func (n *Namespaces) Name() string { return RuntimeNamespaces }

// Create implements Backend.
func (n *Namespaces) Create(ctx context.Context, o Options) (Instance, error) {
	o.Exe, o.Instance = n.Exe, n.Instance
	base, err := claimRange(n.Ranges, o)
	if err != nil {
		return nil, err
	}
	o.UIDBase = base
	sb, err := Create(ctx, o)
	if err != nil {
		if o.Restart == nil {
			n.Ranges.Release(o.UIDBase, o.ID)
		}
		return nil, err
	}
	sb.ranges = n.Ranges
	return sb, nil
}

// claimRange gives the sandbox o makes its uid range: a new one, or the
// one of the stopped instance it starts again from, which its files are
// owned by (held until that sandbox is destroyed, whichever instance of it
// runs).
func claimRange(r *IDRanges, o Options) (int, error) {
	if o.Restart == nil {
		return r.Claim(o.ID)
	}
	prev := o.restarting()
	if prev == nil || prev.ID != o.ID {
		return 0, fmt.Errorf("sandbox: %s is started again from another sandbox's instance", o.ID)
	}
	return prev.UIDBase, r.Hold(prev.UIDBase, o.ID)
}

// Adopt implements Backend.
func (n *Namespaces) Adopt(state json.RawMessage) (Instance, error) {
	var sb Sandbox
	if err := json.Unmarshal(state, &sb); err != nil {
		return nil, fmt.Errorf("sandbox: state: %w", err)
	}
	if sb.ID == "" || sb.Dir == "" {
		return nil, fmt.Errorf("sandbox: state without an id or a directory")
	}
	if err := n.Ranges.Hold(sb.UIDBase, sb.ID); err != nil {
		return nil, err
	}
	sb.ranges = n.Ranges
	sb.adopted()
	return &sb, nil
}

// Release removes, as kilnd stops, its instance's cgroups if no sandbox's
// groups are left in them; those of the sandboxes that run on stay.
func (n *Namespaces) Release() { removeInstanceGroup(n.Instance) }

// EndLeftover implements Backend.
func (n *Namespaces) EndLeftover(id, _ string) error { return endLeftover(n.Instance, id) }
