package capture

import (
	"context"
	"errors"
	"io"
	"slices"
	"time"
)

// Filter selects records of a log.
type Filter struct {
	// Stdout and Stderr select streams; with neither set, both are.
	Stdout, Stderr bool
	// Since and Until bound record times, inclusive; zero is unbounded.
	Since, Until time.Time
	// Tail keeps only the selected records of the last Tail lines (a line
	// is its P records and the F record that ends it; an unfinished line
	// at the end counts as one). Zero keeps nothing; negative keeps all.
	Tail int
	// Meta also selects the kiln stream's records.
	Meta bool
}

// All selects every record.
var All = Filter{Stdout: true, Stderr: true, Meta: true, Tail: -1}

// Selects reports whether the filter keeps rec, before Tail is applied.
func (f Filter) Selects(rec Record) bool {
	switch rec.Stream {
	case LogStdout:
		if !f.Stdout && f.Stderr {
			return false
		}
	case LogStderr:
		if !f.Stderr && f.Stdout {
			return false
		}
	case LogMeta:
		if !f.Meta {
			return false
		}
	}
	if !f.Since.IsZero() && rec.Time.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && rec.Time.After(f.Until) {
		return false
	}
	return true
}

// Log is a whole log as read, filtered.
type Log struct {
	// Entries are the selected records, with their content copied, and
	// every gap.
	Entries []Entry
	// Runs are all the runs read, filtered or not.
	Runs  []Run
	Stats ReadStats
}

// ReadLog reads dir to the end of what is written and returns what f
// selects, with every run classified.
func ReadLog(ctx context.Context, dir *Dir, f Filter) (Log, error) {
	r := NewReader(dir, ReadOptions{})
	defer r.Close()
	var log Log
	for {
		e, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return log, err
		}
		if e.Gap == 0 && !f.Selects(e.Record) {
			continue
		}
		e.Content = append([]byte(nil), e.Content...)
		log.Entries = append(log.Entries, e)
	}
	if f.Tail >= 0 {
		log.Entries = Tail(log.Entries, f.Tail)
	}
	log.Runs = r.Runs()
	log.Stats = r.Stats()
	return log, nil
}

// First returns where each stream stands at the start of the oldest file
// of dir's log: the oldest offsets a reader finds there. It is false when
// the log does not say (no file yet, or one of the earlier format).
func First(dir *Dir) (Positions, bool) {
	r := NewReader(dir, ReadOptions{})
	defer r.Close()
	if ok, err := r.openFirst(); !ok || err != nil {
		return Positions{}, false
	}
	h, _, err := readHeader(r.f)
	if err != nil || h.At == nil {
		return Positions{}, false
	}
	return *h.At, true
}

// Summarize reads dir to the end of what is written, keeping nothing of
// the output, and returns every run classified with the reader's counts.
func Summarize(ctx context.Context, dir *Dir) ([]Run, ReadStats, error) {
	r := NewReader(dir, ReadOptions{})
	defer r.Close()
	for {
		_, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return r.Runs(), r.Stats(), nil
		}
		if err != nil {
			return nil, ReadStats{}, err
		}
	}
}

// Tail keeps the entries of the last n lines, and the gaps and metadata
// among them. A line is a stream's P records with the F record that ends
// it; a stream's trailing P records are an unfinished last line.
func Tail(es []Entry, n int) []Entry {
	if n == 0 {
		return nil
	}
	line := make([]int, len(es)) // each data entry's line, -1 for the rest
	var ends []int               // each line's last entry
	var pending [NumLogStreams][]int
	end := func(s LogStream) {
		id := len(ends)
		for _, j := range pending[s] {
			line[j] = id
		}
		ends = append(ends, pending[s][len(pending[s])-1])
		pending[s] = pending[s][:0]
	}
	for i, e := range es {
		line[i] = -1
		if e.Gap != 0 || e.Stream == LogMeta {
			continue
		}
		pending[e.Stream] = append(pending[e.Stream], i)
		if !e.Partial {
			end(e.Stream)
		}
	}
	for s := range pending {
		if len(pending[s]) > 0 {
			end(LogStream(s))
		}
	}
	if len(ends) <= n {
		return es
	}
	byEnd := slices.Clone(ends)
	slices.Sort(byEnd)
	last := byEnd[len(byEnd)-n-1] // the end of the newest line not kept
	first := len(es)
	for i, id := range line {
		if id >= 0 && ends[id] > last {
			first = i
			break
		}
	}
	var out []Entry
	for i := first; i < len(es); i++ {
		if id := line[i]; id < 0 || ends[id] > last {
			out = append(out, es[i])
		}
	}
	return out
}
