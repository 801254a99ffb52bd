package capture

import (
	"fmt"
	"time"
)

// RunState is what a log says about one run's capture.
type RunState uint8

const (
	// Lossless: begin and end were read, and end says nothing was dropped.
	Lossless RunState = iota + 1
	// Lossy: begin and end were read, and end counts dropped bytes.
	Lossy
	// Interrupted: begin without end. The writer never finished: the
	// process, the agent or the machine died, or the writer was stopped
	// or failed; the tail may be missing. A run still being written reads
	// this way too, until it ends.
	Interrupted
	// RetentionLoss: end without begin. Rotation removed the run's start.
	RetentionLoss
	// Unknown: output with neither begin nor end retained. Nothing can be
	// said about its completeness.
	Unknown
	// Corrupted: records out of order, duplicated or invalid, or lines
	// that could not be read. Never a successful capture.
	Corrupted
)

var runStateNames = [...]string{
	Lossless: "lossless", Lossy: "lossy", Interrupted: "interrupted",
	RetentionLoss: "retention-loss", Unknown: "unknown", Corrupted: "corrupted",
}

func (s RunState) String() string {
	if s > 0 && int(s) < len(runStateNames) {
		return runStateNames[s]
	}
	return fmt.Sprintf("runstate(%d)", uint8(s))
}

// Complete reports whether the state proves a capture that lost nothing.
func (s RunState) Complete() bool { return s == Lossless }

// Run is one run as read from a log.
type Run struct {
	// ID is the run's UUID; empty for output before any metadata.
	ID    string
	State RunState
	// Began and Ended are the times of the begin and end records, zero
	// when not read.
	Began, Ended time.Time
	// Dropped is, per log stream, the end record's count of bytes the run
	// lost in capture.
	Dropped [NumLogStreams]int64
	// Described is the sum of the run's drop records read: where in the
	// output loss happened is known for these bytes.
	Described [NumLogStreams]int64
	// Bytes is the payload read per log stream.
	Bytes [NumLogStreams]int64
	// Missed is set when the reader itself missed part of this run:
	// rotation removed files while it was behind.
	Missed bool
	// Damaged counts unreadable lines within the run.
	Damaged int
	// Problems say why a run is corrupted.
	Problems []string
	// Parent is the run this one continues, as its begin record says: a
	// process restored from a memory snapshot goes on in a run of its
	// own. ContinuedBy is the run that continues this one in the log:
	// this run's records end where that one's begin says, which stands
	// for its end (its loss there is what its drop records describe).
	Parent, ContinuedBy string

	begun, ended bool
}

// Classifier groups records by run and classifies each run, reading the
// records in log order. The zero value is ready.
type Classifier struct {
	runs  []*Run
	byID  map[string]*Run
	cur   *Run // the run output belongs to now, if any
	began bool // a begin was read: later output has a run to belong to
	// opening is the run a file's header named, until the record after
	// it says whether the run begins there (its begin record) or goes on
	// from an earlier file.
	opening string
	// reached is set by the reader before it applies a begin record that
	// names the run it continues: the streams stood, at the end of the
	// records before the begin's file, where the begin says.
	reached bool
}

// Runs returns every run read so far, oldest first, classified.
func (c *Classifier) Runs() []Run {
	c.settle()
	out := make([]Run, len(c.runs))
	for i, r := range c.runs {
		out[i] = *r
		out[i].Problems = append([]string(nil), r.Problems...)
		out[i].State = r.state()
	}
	return out
}

func (r *Run) state() RunState {
	if len(r.Problems) > 0 || r.Damaged > 0 {
		return Corrupted
	}
	switch {
	case r.begun && r.ended:
		if r.Dropped == [NumLogStreams]int64{} {
			return Lossless
		}
		return Lossy
	case r.begun:
		return Interrupted
	case r.ended:
		return RetentionLoss
	}
	return Unknown
}

func (r *Run) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// current is the run output belongs to now: the open run, or a run
// without begin for output that has none.
func (c *Classifier) current() *Run {
	if c.cur == nil {
		c.cur = c.add("")
	}
	return c.cur
}

func (c *Classifier) add(id string) *Run {
	r := &Run{ID: id}
	c.runs = append(c.runs, r)
	if id != "" {
		if c.byID == nil {
			c.byID = make(map[string]*Run)
		}
		c.byID[id] = r
	}
	return r
}

// name gives a run without begin the id its metadata reveals.
func (c *Classifier) name(r *Run, id string) {
	r.ID = id
	if c.byID == nil {
		c.byID = make(map[string]*Run)
	}
	c.byID[id] = r
}

// leading reports whether r is output read before any begin whose run
// the metadata may still name: a run whose begin rotation removed.
func (c *Classifier) leading(r *Run) bool {
	return r != nil && !r.begun && !c.began && r.ID == ""
}

func (c *Classifier) data(rec Record) {
	c.settle()
	c.current().Bytes[rec.Stream] += int64(rec.PayloadLen())
}

// file applies a file's header: the file holds run id. Whether the run
// begins in it is for the next record to say.
func (c *Classifier) file(id string) {
	c.settle()
	c.opening = id
}

// settle applies the header read last, now that the record after it is
// not its run's begin: the run began in an earlier file.
func (c *Classifier) settle() {
	if id := c.opening; id != "" {
		c.opening = ""
		c.header(Meta{Event: eventFile, Run: id}, time.Time{})
	}
}

// header applies a file's header: the file holds run m.Run, which began
// in it (a header of the previous format says so) or in an earlier file.
func (c *Classifier) header(m Meta, at time.Time) {
	if m.Began {
		c.meta(Meta{Event: eventBegin, Run: m.Run}, at)
		return
	}
	c.began = true
	switch r := c.byID[m.Run]; {
	case c.cur != nil && c.cur.ID == m.Run:
	case r != nil && r.begun && !r.ended && (r.Missed || c.cur == nil):
		// Going on after files the reader missed.
		c.cur = r
	case r != nil:
		r.problem("a file of the run after its end or after another run")
		c.cur = r
	default:
		// The run's first files, and its begin, are gone.
		c.cur = c.add(m.Run)
	}
}

func (c *Classifier) meta(m Meta, at time.Time) {
	if m.Event == eventBegin && m.Run == c.opening {
		c.opening = "" // the run begins in the file its header opens
	}
	c.settle()
	switch m.Event {
	case eventFile:
	case eventBegin:
		prev, lead := c.cur, c.leading(c.cur)
		c.cur = nil
		c.began = true
		if r := c.byID[m.Run]; r != nil {
			r.problem("a second begin record")
			c.cur = r
			return
		}
		r := c.add(m.Run)
		r.begun, r.Began, r.Parent = true, at, m.Parent
		c.cur = r
		if m.Parent != "" {
			c.continues(r, prev, lead, at)
		}
	case eventDrop:
		if m.Run == "" { // a drop record of the header's run
			m.Run = c.current().ID
		}
		r := c.claim(m.Run)
		if r == nil {
			c.misplaced(m, "a drop record outside its run")
			return
		}
		r.Described[LogStdout] += m.Stdout
		r.Described[LogStderr] += m.Stderr
	case eventEnd:
		r := c.claim(m.Run)
		if r == nil {
			c.misplaced(m, "an end record outside its run")
			return
		}
		r.ended, r.Ended = true, at
		r.Dropped = [NumLogStreams]int64{m.Dropped.Stdout, m.Dropped.Stderr}
		for s := range r.Described {
			if r.Described[s] > r.Dropped[s] {
				r.problem("drop records count %d bytes of %v, the end record only %d", r.Described[s], LogStream(s), r.Dropped[s])
			}
		}
		c.cur = nil
	}
}

// continues applies the begin of run r, which continues r.Parent: the
// run read before it, prev, ends there, if it is that run (or output
// whose metadata rotation removed, lead) and the streams stood where the
// begin says. A parent whose records the log does not hold (rotated away)
// is not checked.
func (c *Classifier) continues(r, prev *Run, lead bool, at time.Time) {
	p := c.byID[r.Parent]
	if p == nil && lead {
		c.name(prev, r.Parent)
		p = prev
	}
	switch {
	case p == nil:
	case p != prev || p.ended:
		r.problem("it continues run %s, which is not the run before it, or ended", r.Parent)
	case !c.reached:
		r.problem("it continues run %s from offsets that run's records do not end at", r.Parent)
	default:
		p.ended, p.Ended, p.ContinuedBy = true, at, r.ID
		p.Dropped = p.Described
	}
}

// claim returns the run a drop or end record of run id applies to: the
// open run if it is id; output without begin that the record names (its
// begin was removed by rotation, or missed by the reader); or nil when the
// record is out of place.
func (c *Classifier) claim(id string) *Run {
	r, named := c.cur, c.byID[id]
	switch {
	case r != nil && r.ID == id:
		return r
	case c.leading(r) && named == nil:
		c.name(r, id)
		return r
	case c.leading(r) && named.Missed && named.begun && !named.ended:
		// Output after a gap the reader reported, in a run whose begin it
		// read before the gap: the same run.
		for s := range named.Bytes {
			named.Bytes[s] += r.Bytes[s]
		}
		named.Damaged += r.Damaged
		named.Problems = append(named.Problems, r.Problems...)
		c.runs = c.runs[:len(c.runs)-1] // r is the newest run
		c.cur = named
		return named
	case r == nil && !c.began && named != nil && named.Missed && named.begun && !named.ended:
		c.cur = named
		return named
	case r == nil && !c.began && named == nil:
		// Metadata of a run whose begin rotation removed, before any of
		// its output: the start of that run.
		c.cur = c.add(id)
		return c.cur
	}
	return nil
}

// misplaced marks the run a record names (or, if none, the current one)
// corrupted.
func (c *Classifier) misplaced(m Meta, what string) {
	r := c.byID[m.Run]
	if r == nil {
		r = c.add(m.Run)
		if m.Event == eventEnd {
			r.ended = true
		}
	}
	r.problem("%s", what)
}

// invalid marks the current run corrupted by metadata that is not valid.
func (c *Classifier) invalid(err error) {
	c.settle()
	c.current().problem("%v", err)
}

// damaged counts an unreadable line in the current run.
func (c *Classifier) damaged() {
	c.settle()
	c.current().Damaged++
}

// gap records that the reader missed part of the log. The run it was in
// missed bytes; what follows is read as if the log started there, since a
// begin or an end may have been among what was missed.
func (c *Classifier) gap() {
	c.settle()
	if c.cur != nil {
		c.cur.Missed = true
	}
	c.cur, c.began = nil, false
}
