// Package outexport keeps processes' output in NATS JetStream as it is produced, so that it outlives its node: a node's exporter publishes each process's output, offsets and records on a subject of the node's stream, and a reader on any node turns a subject back into the same kiln.v1 frames.
//
// One stream per node, KILN_OUT_<node>, holds subjects
// kiln.<node>.out.<sandbox>.<process>, one per process. Each message is
// a chunk of one of the process's streams, or a record (begin, gap, end),
// and every message carries the offset vector (each stream's offset
// before it), so a reader always knows exactly what it missed, whether
// the exporter never had it (a gap record) or the stream has discarded
// it since. The exporter appends with compare-and-append
// (Nats-Expected-Last-Subject-Sequence), one publish in flight per
// process: a retried publish is never stored twice, and a second writer
// on the same subject is fenced out.
//
// The exporter is one more reader of each process's ring, attached in
// the mode that never holds it: it may fall behind or lose its place, and
// then records the exact loss, but never slows the process.
//
// kilnd, in a cluster, implements Source by dialling the sandbox's agent
// as it does to read a process's logs, makes one Exporter for its node
// (New, with a NATS connection of its own for the export), calls Follow
// for each process that starts and, when it starts, for each process its
// sandboxes have, Purge when it deletes a sandbox, and Close before it
// closes the connection. Any node serves a process's output from
// JetStream with NewReader, whose Reader gives the kiln.v1 messages to
// relay.
package outexport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// Defaults of Config.
const (
	DefaultMaxAge = 24 * time.Hour
	// maxMsgSize is the stream's MaxMsgSize: NATS's default max_payload,
	// which counts headers too.
	maxMsgSize = 1 << 20
	// maxChunk bounds a chunk's bytes in one message: under the
	// stream's MaxMsgSize, with room for the headers. A burst's export
	// costs the servers per byte (three copies written, checksummed and
	// replicated) and per message (a proposal, its acks, the exporter's
	// round trip): the largest messages cost least, which on a small
	// machine is the burst's own time (BenchmarkExportCPU).
	maxChunk = maxMsgSize - 8<<10
)

// Config sets up an Exporter.
type Config struct {
	// Node names this node: its stream is KILN_OUT_<Node>, its subjects
	// kiln.<Node>.out.…. Letters, digits, '-' and '_'.
	Node string
	// Conn is the connection the export publishes on; its owner closes
	// it after Close. Export traffic is bulk: a connection of its own
	// keeps it from delaying heartbeats and the like. Connect with
	// nats.RetryOnFailedConnect(true) and nats.MaxReconnects(-1), so
	// that a NATS down at start or for long is waited for; a short
	// nats.PingInterval (5 s) notices a dead server sooner.
	Conn *nats.Conn
	// Source opens processes' output.
	Source Source
	// Log is where the exporter tells what it cannot do; nil discards.
	Log *slog.Logger

	// The node stream's settings, applied when the exporter starts.
	// Replicas: 1 for a single NATS server, 3 for a cluster (0 is 1).
	// MaxBytes bounds the stream (0: no bound); beyond it the oldest
	// messages go, and readers are told exactly what they lost. MaxAge
	// is how long messages are kept (0: DefaultMaxAge).
	Replicas int
	MaxBytes int64
	MaxAge   time.Duration
}

// Exporter exports the output of the processes of one node it is told to
// follow. Its methods may be called from any goroutine.
type Exporter struct {
	cfg    Config
	js     jetstream.JetStream
	stream string
	writer string // this exporter's UUID, in every message it publishes
	log    *slog.Logger
	// ready is closed once the stream is set up.
	ready chan struct{}
	// stopSetup ends the stream's setup.
	stopSetup context.CancelFunc
	wg        sync.WaitGroup
	stats     counters

	// mu guards followers and closed.
	mu        sync.Mutex
	followers map[procKey]*follower
	closed    bool
}

// procKey names a process of the node.
type procKey struct{ sandbox, process string }

// New starts an exporter: it sets up the node's stream in the background,
// trying again until it can, and follows no process until told to.
func New(cfg Config) (*Exporter, error) {
	if !validName(cfg.Node) {
		return nil, fmt.Errorf("%w: outexport: node name %q: letters, digits, '-' and '_'", errdefs.ErrInvalidArgument, api.Clip(cfg.Node))
	}
	if cfg.Conn == nil || cfg.Source == nil {
		return nil, fmt.Errorf("%w: outexport: a connection and a source are needed", errdefs.ErrInvalidArgument)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, fmt.Errorf("outexport: %w", err)
	}
	x := &Exporter{
		cfg:       cfg,
		js:        js,
		stream:    StreamName(cfg.Node),
		writer:    uuid.NewString(),
		log:       cfg.Log.With("node", cfg.Node),
		ready:     make(chan struct{}),
		followers: map[procKey]*follower{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.stopSetup = cancel
	x.wg.Go(func() { x.setup(ctx) })
	return x, nil
}

// StreamName is node's stream.
func StreamName(node string) string { return "KILN_OUT_" + node }

// Subject is the subject of a process's output.
func Subject(node, sandbox, process string) string {
	return "kiln." + node + ".out." + sandbox + "." + process
}

// sandboxSubjects is the filter of every subject of a sandbox's processes.
func sandboxSubjects(node, sandbox string) string {
	return "kiln." + node + ".out." + sandbox + ".>"
}

// validName reports whether s may be a node's name: a stream name's part
// and a subject's token.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// validToken reports whether s may be a subject's token: a sandbox's or a
// process's id (hex digits, a UUID) always is.
func validToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c == '.' || c == '*' || c == '>' || c >= 0x7f {
			return false
		}
	}
	return true
}

// streamConfig is the node stream's configuration (see the design note:
// limits retention, oldest discarded, file storage, direct gets for
// readers' lookups on every replica).
func (x *Exporter) streamConfig() jetstream.StreamConfig {
	maxBytes := x.cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        x.stream,
		Description: "kiln: the output of node " + x.cfg.Node + "'s processes",
		Subjects:    []string{"kiln." + x.cfg.Node + ".out.>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxBytes:    maxBytes,
		MaxAge:      x.cfg.MaxAge,
		MaxMsgSize:  maxMsgSize,
		Replicas:    x.cfg.Replicas,
		Storage:     jetstream.FileStorage,
		AllowDirect: true,
		AllowMsgTTL: true,
	}
}

// setup creates or updates the node's stream, trying again until it
// succeeds or ctx ends, then lets the followers publish.
func (x *Exporter) setup(ctx context.Context) {
	var b backoff
	var last string
	for {
		actx, cancel := context.WithTimeout(ctx, requestTimeout)
		_, err := x.js.CreateOrUpdateStream(actx, x.streamConfig())
		cancel()
		if err == nil {
			close(x.ready)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if apiCode(err) != 0 && x.exists(ctx) {
			// JetStream answered, and refused the settings (a storage
			// type that cannot change, say): the stream there takes the
			// node's subjects all the same.
			x.log.Error("outexport: the node's stream keeps settings other than this exporter's", "stream", x.stream, "err", err)
			close(x.ready)
			return
		}
		if err.Error() != last { // once per cause, not once per try
			x.log.Warn("outexport: the node's stream cannot be set up yet", "stream", x.stream, "err", err)
			last = err.Error()
		}
		if b.wait(ctx) != nil {
			return
		}
	}
}

// exists reports whether the node's stream is there.
func (x *Exporter) exists(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := x.js.Stream(ctx, x.stream)
	return err == nil
}

// Follow starts exporting a process's output, from where its subject
// ends (the process's start for a new one), until its exit is exported,
// it cannot be read any more, another writer takes its subject, or the
// exporter closes. Following a process already followed does nothing;
// one whose export has ended (its end record is there) is not followed
// again; one left to another writer is followed again, and one of the
// two then gives way. kilnd calls it for each process that starts, and on
// start for each process its sandboxes have (exited ones too, whose
// export may not have finished).
func (x *Exporter) Follow(sandbox string, p api.Process) error {
	if !validToken(sandbox) || !validToken(p.ID) {
		return fmt.Errorf("%w: outexport: sandbox %q or process %q is not a subject token", errdefs.ErrInvalidArgument, api.Clip(sandbox), api.Clip(p.ID))
	}
	k := procKey{sandbox, p.ID}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed || x.followers[k] != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{x: x, key: k, proc: p, subject: Subject(x.cfg.Node, sandbox, p.ID), cancel: cancel, done: make(chan struct{})}
	x.followers[k] = f
	x.stats.following.Add(1)
	x.wg.Go(func() {
		defer close(f.done)
		defer cancel()
		f.run(ctx)
		x.stats.following.Add(-1)
		x.mu.Lock()
		if x.followers[k] == f {
			delete(x.followers, k)
		}
		x.mu.Unlock()
	})
	return nil
}

// stopFollowing stops following the sandbox's processes and waits until
// their followers have ended.
func (x *Exporter) stopFollowing(sandbox string) {
	x.mu.Lock()
	var fs []*follower
	for k, f := range x.followers {
		if k.sandbox == sandbox {
			fs = append(fs, f)
			f.cancel()
		}
	}
	x.mu.Unlock()
	for _, f := range fs {
		<-f.done
	}
}

// Purge removes a deleted sandbox's output from the stream, once it has
// stopped following its processes: kilnd calls it when it deletes a
// sandbox with its logs. It tries again while JetStream is unreachable,
// until ctx ends.
func (x *Exporter) Purge(ctx context.Context, sandbox string) error {
	if !validToken(sandbox) {
		return fmt.Errorf("%w: outexport: sandbox %q is not a subject token", errdefs.ErrInvalidArgument, api.Clip(sandbox))
	}
	x.stopFollowing(sandbox)
	var b backoff
	for {
		err := x.purge(ctx, sandbox)
		if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil // nothing of the node's is kept
		}
		if b.wait(ctx) != nil {
			return fmt.Errorf("%w: outexport: purge of sandbox %s: %w", errdefs.ErrUnavailable, sandbox, err)
		}
	}
}

func (x *Exporter) purge(ctx context.Context, sandbox string) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s, err := x.js.Stream(ctx, x.stream)
	if err != nil {
		return err
	}
	return s.Purge(ctx, jetstream.WithPurgeSubject(sandboxSubjects(x.cfg.Node, sandbox)))
}

// Close stops following every process and waits until the exporter's
// goroutines have ended. What was not exported stays in the rings: an
// exporter started again resumes where each subject ends.
func (x *Exporter) Close() {
	x.mu.Lock()
	x.closed = true
	for _, f := range x.followers {
		f.cancel()
	}
	x.mu.Unlock()
	x.stopSetup()
	x.wg.Wait()
}

// Stats count what an exporter did since it started.
type Stats struct {
	Following int64 // processes followed now
	Messages  int64 // messages stored
	Bytes     int64 // output bytes stored
	Lost      int64 // output bytes recorded as lost (gap records)
	Retries   int64 // publishes tried again (JetStream unreachable, an election, a timeout)
	Conflicts int64 // compare-and-appends refused, then settled
	Fenced    int64 // processes left to another writer of their subject
	Ended     int64 // processes whose end record is stored
	Rests     int64 // pauses of followers the output outran (see restShare)
}

// counters are Stats, counted as they happen.
type counters struct {
	following, messages, bytes, lost, retries, conflicts, fenced, ended, rests atomic.Int64
}

// Stats reports what the exporter has done so far.
func (x *Exporter) Stats() Stats {
	c := &x.stats
	return Stats{
		Following: c.following.Load(), Messages: c.messages.Load(), Bytes: c.bytes.Load(), Lost: c.lost.Load(),
		Retries: c.retries.Load(), Conflicts: c.conflicts.Load(), Fenced: c.fenced.Load(), Ended: c.ended.Load(),
		Rests: c.rests.Load(),
	}
}

// Timing of the exporter's tries.
const (
	// requestTimeout bounds one publish or API request: an R3 stream
	// whose leader was killed answers again after 5–7 s; a publish that
	// timed out is tried again with the same expectation, so it is never
	// stored twice.
	requestTimeout = 5 * time.Second
	backoffFirst   = 50 * time.Millisecond
	backoffMax     = 2 * time.Second
)

// backoff spaces tries: from backoffFirst, doubling up to backoffMax.
type backoff struct{ d time.Duration }

// wait waits the next interval, or until ctx ends (its error).
func (b *backoff) wait(ctx context.Context) error {
	b.d = min(max(2*b.d, backoffFirst), backoffMax)
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *backoff) reset() { b.d = 0 }
