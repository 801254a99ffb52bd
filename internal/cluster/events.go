// The cluster's events: each node publishes what happens to its
// sandboxes to one stream, KILN_EVENTS, whose sequence numbers the events
// for every reader on every node alike.
//
// A node's events are first its kilnd's own (a seqlog.Log numbered under
// the kilnd's epoch): emitting one never waits for NATS. A publisher
// reads that log behind the kilnd and appends its events to the node's
// subject, kiln.events.<node>, in atomic batches (each stored whole or
// not at all), one in flight, with compare-and-append
// (Nats-Expected-Last-Subject-Sequence): a retried batch whose first try
// was stored is recognised (each message's headers name the kilnd's
// epoch and number) and never stored twice. While NATS cannot be
// reached the events wait in the kilnd's log; those the log let go before
// they were published are told by one gap event, naming the node, whose
// lost counts them exactly.
//
// A reader on any node reads the stream from the sequence after its
// cursor with an ordered consumer: the stream's sequence is the event's
// seq, the stream's epoch (kept in its metadata, made once by the node
// that creates it) the event's epoch. Events the stream no longer holds
// (older than its max age, or past its size) are told by a gap.

package cluster

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/seqlog"
)

// The cluster's stream of events.
const (
	// EventsStream holds every node's events, on subjects
	// kiln.events.<node>.
	EventsStream = "KILN_EVENTS"
	// EventsMaxAge and EventsMaxBytes bound what it keeps; the oldest
	// go first.
	EventsMaxAge   = 24 * time.Hour
	EventsMaxBytes = 512 << 20
	// EpochPrefix begins the epoch of the cluster's stream, so that a
	// cursor is known for the cluster's where the cluster is not reached.
	EpochPrefix = "cluster-"
	// maxEventSize bounds an event's JSON: a line as clients take it.
	maxEventSize = 64 << 10

	epochKey  = "kiln_epoch" // the stream's metadata key of its epoch
	hdrEpoch  = "Kiln-Epoch" // the publishing kilnd's epoch
	hdrSeq    = "Kiln-Seq"   // the event's number in that kilnd's log
	eventsAll = "kiln.events.*"
)

// EventsSubject is node's subject in EventsStream.
func EventsSubject(node string) string { return "kiln.events." + Token(node) }

// IsClusterEpoch reports whether epoch names the cluster's stream of
// events rather than one kilnd.
func IsClusterEpoch(epoch string) bool { return strings.HasPrefix(epoch, EpochPrefix) }

// EventsConfig sets up a node's Events.
type EventsConfig struct {
	// Conn is the connection the events are published and read on; its
	// owner closes it after Close. Connect it as Node.Connect does.
	Conn *nats.Conn
	// Node is the node's name; Replicas the stream's (0 is 1).
	Node     string
	Replicas int
	// Local is the kilnd's own log of events, LocalEpoch its epoch: the
	// publisher reads it and never writes it.
	Local      *seqlog.Log[api.Event]
	LocalEpoch string
	// MaxAge and MaxBytes bound the stream when this node creates it (0:
	// EventsMaxAge, EventsMaxBytes).
	MaxAge   time.Duration
	MaxBytes int64
	Log      *slog.Logger
}

// Events publishes a node's events to the cluster's stream and opens
// readers of it. Its methods may be called from any goroutine.
type Events struct {
	cfg     EventsConfig
	js      jetstream.JetStream
	subject string
	log     *slog.Logger
	cancel  context.CancelFunc
	done    sync.WaitGroup
	stats   eventCounters

	// mu guards stream and epoch: set once the stream is reached, and
	// again should it have been made anew.
	mu     sync.Mutex
	stream jetstream.Stream
	epoch  string

	// The publisher's own, its goroutine's alone: pos is the number of
	// the last event of the kilnd's log published (or counted in a gap),
	// last the stream sequence of the subject's last message, wrote
	// whether this publisher stored one, noBatch that the stream takes
	// no atomic batches.
	pos     int64
	last    uint64
	wrote   bool
	noBatch bool
}

// EventStats count what a node's publisher did since it started.
type EventStats struct {
	Published int64 // events stored in the stream
	Lost      int64 // events of this node that never reached it (its gaps' lost)
	Retries   int64 // publishes tried again (NATS unreachable, an election, a timeout)
}

type eventCounters struct{ published, lost, retries atomic.Int64 }

// NewEvents starts publishing the node's events, in the background,
// waiting for NATS as long as it takes.
func NewEvents(cfg EventsConfig) (*Events, error) {
	if cfg.Conn == nil || cfg.Local == nil {
		return nil, fmt.Errorf("%w: cluster: events need a connection and a log", errdefs.ErrInvalidArgument)
	}
	cfg.Replicas = max(cfg.Replicas, 1)
	if cfg.MaxAge == 0 {
		cfg.MaxAge = EventsMaxAge
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = EventsMaxBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, fmt.Errorf("cluster: events: %w", err)
	}
	x := &Events{cfg: cfg, js: js, subject: EventsSubject(cfg.Node), log: cfg.Log.With("node", cfg.Node)}
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	x.done.Go(func() { x.run(ctx) })
	return x, nil
}

// Close stops publishing and waits for the publisher. What it had not
// published stays in the kilnd's log.
func (x *Events) Close() {
	x.cancel()
	x.done.Wait()
}

// Stats reports what the publisher has done so far.
func (x *Events) Stats() EventStats {
	return EventStats{Published: x.stats.published.Load(), Lost: x.stats.lost.Load(), Retries: x.stats.retries.Load()}
}

// Epoch is the cluster stream's epoch, "" until it has been reached.
func (x *Events) Epoch() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.epoch
}

// Ready reports whether readers can be opened now: the stream has been
// reached and the connection is up.
func (x *Events) Ready() bool {
	return x.Epoch() != "" && x.cfg.Conn.IsConnected()
}

func (x *Events) current() (jetstream.Stream, string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.stream, x.epoch
}

// run publishes until ctx ends, starting again after each failure.
func (x *Events) run(ctx context.Context) {
	wait := 50 * time.Millisecond
	var said string
	for {
		before := x.stats.published.Load()
		err := x.publishAll(ctx)
		if ctx.Err() != nil {
			return
		}
		if x.stats.published.Load() != before {
			wait = 50 * time.Millisecond // it published since the last failure
		}
		x.stats.retries.Add(1)
		if err.Error() != said { // once per cause, not once per try
			x.log.Warn("cluster: events not published yet; trying again", "err", err)
			said = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// publishAll sets the stream up if need be, finds where the node's
// subject stands, then publishes the events of the kilnd's log as they
// come, up to maxBatch at once; it returns only with an error.
func (x *Events) publishAll(ctx context.Context) error {
	if err := x.setup(ctx); err != nil {
		return err
	}
	if err := x.resume(ctx); err != nil {
		return err
	}
	for {
		evs, lost, _, wake := x.cfg.Local.After(x.pos)
		var batch []pending
		if lost > 0 {
			gap := api.Event{Type: api.EventGap, Time: time.Now().UTC(), Node: x.cfg.Node, Lost: lost,
				Reason: fmt.Sprintf("node %s's events that never reached the cluster: NATS was not reached before its kilnd's log let them go", x.cfg.Node)}
			batch = append(batch, pending{gap, x.pos + lost, lost})
		}
		for _, e := range evs[:min(len(evs), maxBatch-len(batch))] {
			p := pending{e: e, seq: e.Seq}
			if oversize(e) {
				p.lost = 1 // stored as a gap that counts it
			}
			batch = append(batch, p)
		}
		if len(batch) > 0 {
			if err := x.publishBatch(ctx, batch); err != nil {
				return err
			}
			continue // from where the publisher stands now
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
	}
}

// maxBatch is how many events are published at once: one atomic batch,
// stored whole or not at all (JetStream's limit is 1,000).
const maxBatch = 256

// pending is an event to publish: its number in the kilnd's log (the
// last it stands for, for a gap), and the events of the node's it counts
// as lost: a gap of the publisher's, or an event too large.
type pending struct {
	e    api.Event
	seq  int64
	lost int64
}

// setup creates the stream, or opens it, and learns its epoch.
func (x *Events) setup(ctx context.Context) error {
	if s, _ := x.current(); s != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	epoch := make([]byte, 8)
	rand.Read(epoch)
	cfg := jetstream.StreamConfig{
		Name:        EventsStream,
		Description: "kiln: what happens to every node's sandboxes",
		Subjects:    []string{eventsAll},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      x.cfg.MaxAge,
		MaxBytes:    x.cfg.MaxBytes,
		MaxMsgSize:  maxEventSize + 1024, // and its headers
		Duplicates:  min(2*time.Minute, x.cfg.MaxAge),
		Replicas:    x.cfg.Replicas,
		Storage:     jetstream.FileStorage,
		// A node's events go in batches, each stored whole or not at all.
		AllowAtomicPublish: true,
		// The epoch is made once, by the node that creates the stream;
		// the others find it there. (A second CreateStream with another
		// epoch is refused as a stream of other settings.)
		Metadata: map[string]string{epochKey: EpochPrefix + fmt.Sprintf("%x", epoch)},
	}
	s, err := x.js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = x.js.Stream(ctx, EventsStream)
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", EventsStream, err)
	}
	info := s.CachedInfo()
	if info.Config.Replicas < x.cfg.Replicas {
		// Made by a node that saw fewer servers: more copies now.
		up := info.Config
		up.Replicas = x.cfg.Replicas
		if u, err := x.js.UpdateStream(ctx, up); err == nil {
			s, info = u, u.CachedInfo()
		}
	}
	got := info.Config.Metadata[epochKey]
	if !IsClusterEpoch(got) {
		// Made without one (by hand): its creation names it.
		got = EpochPrefix + strconv.FormatInt(info.Created.UnixNano(), 16)
	}
	x.mu.Lock()
	x.stream, x.epoch = s, got
	x.mu.Unlock()
	return nil
}

// resume learns the node's subject's last message: the publisher goes on
// after it. When it is this kilnd's, the events up to its number are
// published; when another's (a former run of this node's kilnd), this
// kilnd's log is published from its first.
func (x *Events) resume(ctx context.Context) error {
	s, _ := x.current()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	// The stream allows no direct get: its leader answers, with the last
	// message stored.
	m, err := s.GetLastMsgForSubject(ctx, x.subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		x.last = 0
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		x.forget()
		return err
	case err != nil:
		return fmt.Errorf("the last event of %s: %w", x.subject, err)
	}
	x.last = m.Sequence
	if m.Header.Get(hdrEpoch) != x.cfg.LocalEpoch {
		if x.wrote {
			x.log.Warn("cluster: another kilnd publishes events as this node: are two kilnds named alike?", "subject", x.subject)
		}
		return nil
	}
	if n, err := strconv.ParseInt(m.Header.Get(hdrSeq), 10, 64); err == nil && n > x.pos {
		x.pos = n
	}
	return nil
}

// forget drops the stream: the next setup finds it, or makes it anew.
func (x *Events) forget() {
	x.mu.Lock()
	x.stream = nil
	x.mu.Unlock()
}

// message is p's message on the node's subject.
func (x *Events) message(p pending) *nats.Msg {
	e := p.e
	e.Node = x.cfg.Node
	b, _ := json.Marshal(e)
	if p.lost == 1 && e.Type != api.EventGap {
		lost := api.Event{Type: api.EventGap, Time: e.Time, Node: x.cfg.Node, Sandbox: e.Sandbox, Name: e.Name, Lost: 1,
			Reason: fmt.Sprintf("an event of %d bytes, past the %d an event may have", len(b), maxEventSize)}
		b, _ = json.Marshal(lost)
	}
	m := &nats.Msg{Subject: x.subject, Data: b, Header: nats.Header{}}
	m.Header.Set(hdrEpoch, x.cfg.LocalEpoch)
	m.Header.Set(hdrSeq, strconv.FormatInt(p.seq, 10))
	return m
}

// The headers of JetStream's atomic batches.
const (
	hdrBatchID     = "Nats-Batch-Id"
	hdrBatchSeq    = "Nats-Batch-Sequence"
	hdrBatchCommit = "Nats-Batch-Commit"
	// errAtomicDisabled: the stream takes no batches (made by a server
	// before 2.12, or without them).
	errAtomicDisabled = 10174
)

// publishBatch stores the events of batch after the subject's last
// message, all or none: one JetStream atomic batch whose first message
// expects the subject's last sequence (a compare-and-append), so that a
// retried batch whose first try was stored is refused, and recognised
// (resume) by the kilnd's number its last message carries. On a stream
// that takes no batches, the events go one at a time, the same way. It
// returns nil once the publisher has moved (stored, or settled by
// resume): the caller reads the log again from where it stands.
func (x *Events) publishBatch(ctx context.Context, batch []pending) error {
	if x.noBatch {
		batch = batch[:1]
	}
	msgs := make([]*nats.Msg, len(batch))
	for i, p := range batch {
		msgs[i] = x.message(p)
	}
	n := len(msgs)
	msgs[0].Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(x.last, 10))
	if n > 1 {
		id := make([]byte, 12)
		rand.Read(id)
		for i, m := range msgs {
			m.Header.Set(hdrBatchID, fmt.Sprintf("%x", id))
			m.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
		}
		msgs[n-1].Header.Set(hdrBatchCommit, "1")
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var err error
	if n > 1 {
		// The first is answered (empty, once staged), the others follow
		// it on the same connection, in order; the commit is answered
		// with the batch's acknowledgement, or why it was refused.
		var resp *nats.Msg
		if resp, err = x.cfg.Conn.RequestMsgWithContext(ctx, msgs[0]); err == nil && len(resp.Data) > 0 {
			err = ackError(resp.Data)
		}
		for _, m := range msgs[1 : n-1] {
			if err == nil {
				err = x.cfg.Conn.PublishMsg(m)
			}
		}
	}
	var ack *jetstream.PubAck
	if err == nil {
		ack, err = x.js.PublishMsg(ctx, msgs[n-1])
	}
	if err == nil {
		x.last, x.pos, x.wrote = ack.Sequence, batch[n-1].seq, true
		x.stored(batch[:n])
		return nil
	}
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, nats.ErrNoResponders):
		x.forget() // deleted? made anew, it has another epoch
		return err
	case apiCode(err) == errAtomicDisabled:
		x.log.Info("cluster: the stream of events takes no atomic batches: events are published one at a time", "stream", EventsStream)
		x.noBatch = true
		return nil
	case apiCode(err) != jetstream.JSErrCodeStreamWrongLastSequence:
		return err
	}
	pos := x.pos
	if err := x.resume(ctx); err != nil {
		return err
	}
	if x.pos > pos {
		// Stored by an earlier try whose answer was lost: a batch is
		// whole, so all of it up to the number its last carries.
		for i, p := range batch {
			if p.seq <= x.pos {
				x.stored(batch[i : i+1])
			}
		}
	}
	return nil
}

// stored counts the events of batch as stored.
func (x *Events) stored(batch []pending) {
	x.stats.published.Add(int64(len(batch)))
	for _, p := range batch {
		x.stats.lost.Add(p.lost)
	}
}

// oversize reports whether e is past the size an event may have (with
// room for the node's name).
func oversize(e api.Event) bool {
	b, _ := json.Marshal(e)
	return len(b) > maxEventSize-512
}

// ackError is the error a JetStream acknowledgement carries, if any.
func ackError(data []byte) error {
	var r struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("an answer that is no acknowledgement: %w", err)
	}
	if r.Error != nil {
		return r.Error
	}
	return nil
}

// apiCode is err's JetStream error code, 0 if it has none.
func apiCode(err error) jetstream.ErrorCode {
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode
	}
	return 0
}

// EventReader reads the cluster's events in the stream's order.
type EventReader struct {
	epoch  string
	it     jetstream.MessagesContext // nil when nothing is to be read
	follow bool
	// next is the sequence expected next; last, not following, the
	// stream's last when the reader was opened, where it ends.
	next, last uint64
	// queue holds what comes before the next message: a gap, and the
	// message that told it.
	queue []queued
}

type queued struct {
	e        api.Event
	caughtUp bool
}

// OpenReader opens a reader of the events after seq after, in order:
// following, each as it is stored until ctx ends; else those the stream
// holds now. Events the stream no longer holds come first as a gap. It
// is unavailable while the stream has not been reached.
func (x *Events) OpenReader(ctx context.Context, after uint64, follow bool) (*EventReader, error) {
	s, epoch := x.current()
	if s == nil {
		return nil, fmt.Errorf("%w: the cluster's events have not been reached yet", errdefs.ErrUnavailable)
	}
	ictx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	info, err := s.Info(ictx)
	if err != nil {
		return nil, fmt.Errorf("%w: the cluster's events: %w", errdefs.ErrUnavailable, err)
	}
	first, last := max(info.State.FirstSeq, 1), info.State.LastSeq
	r := &EventReader{epoch: epoch, follow: follow, next: after + 1, last: last}
	if r.next < first {
		gap := r.gap(first - r.next)
		r.next = first
		r.queue = append(r.queue, queued{gap, r.next > last})
	}
	if !follow && r.next > last {
		return r, nil
	}
	cons, err := s.OrderedConsumer(ictx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   r.next,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: the cluster's events: %w", errdefs.ErrUnavailable, err)
	}
	if r.it, err = cons.Messages(jetstream.PullMaxMessages(256)); err != nil {
		return nil, fmt.Errorf("%w: the cluster's events: %w", errdefs.ErrUnavailable, err)
	}
	return r, nil
}

// gap is the gap of the n events before r.next, which the stream no
// longer holds.
func (r *EventReader) gap(n uint64) api.Event {
	return api.Event{Type: api.EventGap, Seq: int64(r.next + n - 1), Lost: int64(n), Epoch: r.epoch, Time: time.Now().UTC(),
		Reason: "events the cluster no longer holds: it keeps them 24 hours, 512 MiB at most"}
}

// Next returns the next event and whether it is the last the stream
// holds now (a reader that caught up); io.EOF, not following, past those
// the stream held when the reader was opened.
func (r *EventReader) Next(ctx context.Context) (api.Event, bool, error) {
	if len(r.queue) > 0 {
		q := r.queue[0]
		r.queue = r.queue[1:]
		return q.e, q.caughtUp, nil
	}
	if r.it == nil || !r.follow && r.next > r.last {
		return api.Event{}, true, io.EOF
	}
	msg, err := r.it.Next(jetstream.NextContext(ctx))
	if err != nil {
		if ctx.Err() != nil {
			return api.Event{}, false, ctx.Err()
		}
		return api.Event{}, false, fmt.Errorf("%w: the cluster's events: %w", errdefs.ErrUnavailable, err)
	}
	meta, err := msg.Metadata()
	if err != nil {
		return api.Event{}, false, fmt.Errorf("%w: the cluster's events: %w", errdefs.ErrUnavailable, err)
	}
	seq := meta.Sequence.Stream
	var e api.Event
	if json.Unmarshal(msg.Data(), &e) != nil || e.Type == "" {
		// Nothing a node published: told, not given.
		e = api.Event{Type: api.EventGap, Lost: 1, Time: meta.Timestamp.UTC(), Reason: "a message of the cluster's stream of events that is no event"}
	}
	e.Seq, e.Epoch = int64(seq), r.epoch
	caughtUp := meta.NumPending == 0
	if seq > r.next {
		// Discarded while this reader read: the gap first.
		gap := r.gap(seq - r.next)
		r.queue = append(r.queue, queued{e, caughtUp})
		r.next = seq + 1
		return gap, false, nil
	}
	r.next = seq + 1
	return e, caughtUp, nil
}

// Close ends the reader.
func (r *EventReader) Close() {
	if r.it != nil {
		r.it.Stop()
	}
}
