package ring

import "fmt"

// Stream names one output stream of a process. A process has stdout and
// stderr, or a single PTY stream when it runs on a terminal.
type Stream uint8

const (
	Stdout Stream = iota
	Stderr
	PTY

	// NumStreams is the number of distinct streams; Offsets is indexed by Stream.
	NumStreams = 3
)

var streamNames = [NumStreams]string{"stdout", "stderr", "pty"}

func (s Stream) String() string {
	if int(s) < NumStreams {
		return streamNames[s]
	}
	return fmt.Sprintf("stream(%d)", uint8(s))
}

// ParseStream is the inverse of String.
func ParseStream(name string) (Stream, error) {
	for i, n := range streamNames {
		if n == name {
			return Stream(i), nil
		}
	}
	return 0, fmt.Errorf("ring: unknown stream %q", name)
}

// Offsets holds one source-byte position per stream: the number of bytes
// emitted on that stream before some point. Streams a process does not have
// stay zero.
type Offsets [NumStreams]int64

// Kind tells what an Event carries.
type Kind uint8

const (
	// Data carries bytes of one stream starting at Offset.
	Data Kind = iota + 1
	// Gap says the bytes [Offset, To) of Stream were evicted before the
	// cursor reached them; the cursor continues at To.
	Gap
	// End says Stream has ended after Offset bytes in all (its total).
	End
	// Exit is never produced by a ring: the process layer appends it after
	// every stream's End, once the process's exit has been observed.
	Exit
)

func (k Kind) String() string {
	switch k {
	case Data:
		return "data"
	case Gap:
		return "gap"
	case End:
		return "end"
	case Exit:
		return "exit"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is one step of what a cursor delivers.
type Event struct {
	Kind   Kind
	Stream Stream
	// Offset is where Data begins, where a Gap begins, or an End's total.
	Offset int64
	// To is where a Gap ends (exclusive).
	To int64
	// Seq orders Data events across the process's streams.
	Seq uint64
	// Data is valid only until the next call to Cursor.Next or Cursor.Close;
	// a consumer that keeps it must copy it.
	Data []byte
}

// Lost is the number of bytes a Gap reports missing.
func (e Event) Lost() int64 {
	if e.Kind != Gap {
		return 0
	}
	return e.To - e.Offset
}
