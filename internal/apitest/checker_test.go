package apitest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/sandkiln/sandkiln/api"
)

// msg is one message a server sends a kiln.v1 watcher.
type msg struct {
	typ  websocket.MessageType
	data []byte
}

func (m msg) String() string { return describe(m.typ, m.data) }

func text(v any) msg {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return msg{websocket.MessageText, b}
}

func hello(spans map[string]api.HelloSpan) msg {
	return text(api.Hello{Type: api.TypeHello, Streams: spans})
}

func frame(stream byte, offset, seq uint64, data string) msg {
	return msg{websocket.MessageBinary, api.AppendFrame(nil, api.Frame{Stream: stream, Offset: offset, Seq: seq, Data: []byte(data)})}
}

func gap(stream string, from, to int64) msg {
	return text(api.Gap{Type: api.TypeGap, Stream: stream, From: from, To: to, LostBytes: to - from})
}

func end(stream string, total int64) msg {
	return text(api.End{Type: api.TypeEnd, Stream: stream, TotalBytes: total})
}

func exit(code int) msg {
	return text(api.ExitMessage{Type: api.TypeExit, Exit: api.Exit{ExitCode: &code}})
}

// take feeds msgs to c and returns the first error, with the message's
// index.
func take(c *Checker, msgs []msg) (int, error) {
	for i, m := range msgs {
		if _, err := c.Message(m.typ, m.data); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

// twoStreams is a process that wrote "out1\n", "err1\n", "out2" and exited
// 7, as a watcher from the beginning is told of it.
var twoStreams = []msg{
	hello(map[string]api.HelloSpan{"stdout": {Total: 9}, "stderr": {Total: 5}}),
	frame(api.StreamStdout, 0, 0, "out1\n"),
	frame(api.StreamStderr, 0, 5, "err1\n"),
	frame(api.StreamStdout, 5, 10, "out2"),
	end("stdout", 9),
	end("stderr", 5),
	exit(7),
}

// with returns msgs with msgs[i] replaced by m.
func with(msgs []msg, i int, m ...msg) []msg {
	out := append([]msg(nil), msgs[:i]...)
	out = append(out, m...)
	return append(out, msgs[i+1:]...)
}

func TestCheckerAccounts(t *testing.T) {
	c := &Checker{Keep: true}
	if i, err := take(c, twoStreams); err != nil {
		t.Fatalf("message %d: %v", i, err)
	}
	got := map[string]Stream{}
	for name, s := range c.Streams {
		got[name] = *s
	}
	want := map[string]Stream{
		"stdout": {Name: "stdout", Keep: true, Next: 9, Delivered: 9, Frames: 2, Data: []byte("out1\nout2"), Ended: true, Total: 9, last: 5},
		"stderr": {Name: "stderr", Keep: true, Next: 5, Delivered: 5, Frames: 1, Data: []byte("err1\n"), Ended: true, Total: 5},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(Stream{}), cmp.Comparer(func(a, b func(string, int64, []byte) error) bool { return a == nil && b == nil })); diff != "" {
		t.Errorf("streams (-want +got):\n%s", diff)
	}
	if c.Exit == nil || c.Exit.String() != "process exited with code 7" || c.Messages != len(twoStreams) {
		t.Errorf("exit %v after %d messages", c.Exit, c.Messages)
	}
	if diff := cmp.Diff(map[string]int64{"stdout": 9, "stderr": 5}, c.Position()); diff != "" {
		t.Errorf("position (-want +got):\n%s", diff)
	}

	// Resumed, with a gap, and each frame given to Check.
	var checked []string
	c = &Checker{From: map[string]int64{"stdout": 2}, Check: func(stream string, off int64, data []byte) error {
		checked = append(checked, fmt.Sprintf("%s@%d:%s", stream, off, data))
		return nil
	}}
	resumed := []msg{
		hello(map[string]api.HelloSpan{"stdout": {First: 4, Total: 9}, "stderr": {Total: 5}}),
		gap("stdout", 2, 5),
		frame(api.StreamStderr, 0, 5, "err1\n"),
		frame(api.StreamStdout, 5, 10, "out2"),
		end("stdout", 9),
		end("stderr", 5),
		exit(7),
	}
	if i, err := take(c, resumed); err != nil {
		t.Fatalf("resumed: message %d: %v", i, err)
	}
	if s := c.Streams["stdout"]; s.From != 2 || s.Lost != 3 || s.Gaps != 1 || s.Delivered != 4 || s.Data != nil {
		t.Errorf("resumed stdout %+v", s)
	}
	if diff := cmp.Diff([]string{"stderr@0:err1\n", "stdout@5:out2"}, checked); diff != "" {
		t.Errorf("checked (-want +got):\n%s", diff)
	}
}

// TestCheckerRefuses: every way a connection can break the contract is
// refused at the message that breaks it, saying what was wrong.
func TestCheckerRefuses(t *testing.T) {
	h := twoStreams[0]
	o1, e1, o2 := twoStreams[1], twoStreams[2], twoStreams[3]
	badCheck := func(stream string, off int64, data []byte) error {
		if off == 5 {
			return errors.New("not the pattern")
		}
		return nil
	}
	for _, tc := range []struct {
		name   string
		c      Checker
		msgs   []msg
		at     int // the message refused
		reason string
	}{
		{"a frame before the hello", Checker{}, twoStreams[1:], 0, "message 1 is a stdout frame of 5 bytes at offset 0, want the hello first"},
		{"an end before the hello", Checker{}, twoStreams[4:], 0, "want the hello first"},
		{"a second hello", Checker{}, with(twoStreams, 1, h), 1, "second hello"},
		{"a hello of no stream", Checker{}, []msg{hello(nil)}, 0, "names no stream"},
		{"a hello of an unknown stream", Checker{}, []msg{hello(map[string]api.HelloSpan{"stdin": {}})}, 0, `names stream "stdin"`},
		{"a hello retaining more than produced", Checker{}, []msg{hello(map[string]api.HelloSpan{"stdout": {First: 10, Total: 9}})}, 0, "stdout is retained from 10 of 9"},
		{"a resume past what the hello says", Checker{From: map[string]int64{"stdout": 10}}, twoStreams, 0, "resumed stdout at 10, but the hello says it has produced 9"},
		{"a resume of a stream not in the hello", Checker{From: map[string]int64{"terminal": 1}}, twoStreams, 0, "resumed terminal at 1, a stream the hello does not name"},
		{"a frame overlapping", Checker{}, with(twoStreams, 3, frame(api.StreamStdout, 3, 10, "1\nout2")), 3,
			"stdout frame of 6 bytes at offset 3, expected 5 (overlaps 2 bytes already accounted)"},
		{"a frame leaving a hole", Checker{}, with(twoStreams, 3, frame(api.StreamStdout, 6, 11, "ut2")), 3,
			"stdout frame of 3 bytes at offset 6, expected 5 (leaves a hole of 1 bytes)"},
		{"a frame before the resume offset", Checker{From: map[string]int64{"stdout": 5}}, twoStreams, 1, "stdout frame of 5 bytes at offset 0, expected 5"},
		{"a frame of a stream not in the hello", Checker{}, with(twoStreams, 1, frame(api.StreamTerminal, 0, 0, "x")), 1,
			"a terminal frame at offset 0, a stream the hello does not name"},
		{"a malformed frame", Checker{}, with(twoStreams, 1, msg{websocket.MessageBinary, []byte{1, 0}}), 1, "malformed kiln.v1 frame"},
		{"a seq that does not rise", Checker{}, with(twoStreams, 3, frame(api.StreamStdout, 5, 5, "out2")), 3, "stdout frame at offset 5 has seq 5, after seq 5"},
		{"a seq inside the previous frame", Checker{}, with(twoStreams, 3, frame(api.StreamStdout, 5, 8, "out2")), 3,
			"stdout frame at offset 5 has seq 8, inside the previous frame's bytes, which end at seq 10"},
		{"a seq below the offset", Checker{}, with(twoStreams, 1, frame(api.StreamStdout, 0, 0, "out1\n"), frame(api.StreamStdout, 5, 4, "out2")), 2,
			"stdout frame at offset 5 has seq 4: seq counts the bytes of every stream before it"},
		{"a gap from the wrong offset", Checker{}, with(twoStreams, 3, gap("stdout", 6, 9)), 3, "stdout gap [6, 9) at offset 6, expected one from 5 (leaves a hole of 1 bytes)"},
		{"an empty gap", Checker{}, with(twoStreams, 3, gap("stdout", 5, 5)), 3, "stdout gap [5, 5) is empty"},
		{"a gap miscounting its loss", Checker{}, with(twoStreams, 3, text(api.Gap{Type: api.TypeGap, Stream: "stdout", From: 5, To: 9, LostBytes: 3})), 3,
			"stdout gap [5, 9) says 3 bytes lost, want 4"},
		{"a gap where none may be", Checker{NoGaps: true}, with(twoStreams, 3, gap("stdout", 5, 9)), 3, "stdout gap [5, 9) of 4 bytes where nothing may be lost"},
		{"a gap of an unknown stream", Checker{}, with(twoStreams, 3, gap("terminal", 0, 9)), 3, `a gap of stream "terminal", which the hello does not name`},
		{"an end short of what was delivered", Checker{}, with(with(twoStreams, 4, end("stdout", 8)), 0,
			hello(map[string]api.HelloSpan{"stdout": {Total: 8}, "stderr": {Total: 5}})), 4,
			"stdout ends at 8, but 9 bytes are accounted (resumed at 0, 9 delivered, 0 lost)"},
		{"an end past what was delivered", Checker{}, with(twoStreams, 3, end("stdout", 9)), 3, "stdout ends at 9, but 5 bytes are accounted"},
		{"an end below the hello's total", Checker{}, []msg{h, o1, end("stdout", 5)}, 2, "stdout ends at 5, below the 9 the hello said it had produced"},
		{"a second end", Checker{}, with(twoStreams, 5, end("stdout", 9)), 5, "stdout ends again at 9, after its end at 9"},
		{"a frame after the end", Checker{}, []msg{h, o1, e1, end("stderr", 5), frame(api.StreamStderr, 5, 10, "x")}, 4,
			"stderr frame of 1 bytes at offset 5 after the stream's end at 5"},
		{"a gap after the end", Checker{}, []msg{h, o1, e1, end("stderr", 5), gap("stderr", 5, 6)}, 4, "stderr gap [5, 6) after the stream's end at 5"},
		{"the exit before an end", Checker{}, with(twoStreams, 5, exit(7)), 5, "the exit (process exited with code 7) before the end of stderr, at offset 5"},
		{"a message after the exit", Checker{}, append(twoStreams[:7:7], o2), 7, "message 8, a stdout frame of 4 bytes at offset 5, after the exit"},
		{"a second exit", Checker{}, append(twoStreams[:7:7], exit(7)), 7, "after the exit"},
		{"a message of unknown type", Checker{}, with(twoStreams, 1, text(map[string]string{"type": "ack"})), 1, `message 2 is of unknown type: "{\"type\":\"ack\"}"`},
		{"a text message that is not JSON", Checker{}, with(twoStreams, 1, msg{websocket.MessageText, []byte("[1 bytes of stdout lost]\n")}), 1, "message 2"},
		{"a frame the check refuses", Checker{Check: badCheck}, twoStreams, 3, "stdout frame of 4 bytes at offset 5: not the pattern"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			i, err := take(&c, tc.msgs)
			if err == nil {
				t.Fatalf("accepted %v", tc.msgs)
			}
			if i != tc.at || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("refused message %d (%v): %v\nwant message %d refused: %s", i, tc.msgs[i], err, tc.at, tc.reason)
			}
		})
	}
}

// TestStreamText: decoded text keeps its order, not its offsets.
func TestStreamText(t *testing.T) {
	s := NewStream("stdout", 3)
	s.Keep = true
	for _, step := range []error{s.Text(3, "caf"), s.Text(7, "é\n"), s.Gap(9, 12), s.Text(12, "x")} {
		if step != nil {
			t.Fatal(step)
		}
	}
	if string(s.Data) != "café\nx" || s.Lost != 3 || s.Frames != 3 {
		t.Errorf("stream %+v", s)
	}
	if err := s.Text(11, "y"); err == nil || !strings.Contains(err.Error(), "before offset 12 already taken") {
		t.Errorf("text going back: %v", err)
	}
	if err := NewStream("stderr", 5).Text(4, "z"); err == nil {
		t.Error("text before the resume offset accepted")
	}
}

// transcript is a kiln.v1 connection drawn at random, valid by
// construction: two streams written in chunks, interleaved, read from any
// offsets, each chunk delivered or lost, each stream's end once its last
// chunk is out, then the exit.
func transcript(t *rapid.T) (from map[string]int64, msgs []msg, delivered map[string]string) {
	names := []string{"stdout", "stderr"}
	codes := []byte{api.StreamStdout, api.StreamStderr}
	type chunk struct {
		stream      int
		offset, seq int64
		data        string
	}
	var chunks []chunk
	var written [2]int64
	var seq int64
	for range rapid.IntRange(0, 30).Draw(t, "chunks") {
		s := rapid.IntRange(0, 1).Draw(t, "stream")
		n := rapid.IntRange(1, 12).Draw(t, "size")
		data := strings.Repeat(string(rune('a'+len(chunks)%26)), n)
		chunks = append(chunks, chunk{s, written[s], seq, data})
		written[s] += int64(n)
		seq += int64(n)
	}
	from = map[string]int64{}
	spans := map[string]api.HelloSpan{}
	var at [2]int64 // where each stream stands for the reader
	for i, name := range names {
		at[i] = rapid.Int64Range(0, written[i]).Draw(t, "from "+name)
		if at[i] > 0 {
			from[name] = at[i]
		}
		total := rapid.Int64Range(at[i], written[i]).Draw(t, "hello total "+name)
		spans[name] = api.HelloSpan{First: rapid.Int64Range(0, total).Draw(t, "hello first "+name), Total: total}
	}
	msgs = append(msgs, hello(spans))
	delivered = map[string]string{}
	var last [2]int // the index of each stream's last chunk
	last[0], last[1] = -1, -1
	for i, ch := range chunks {
		last[ch.stream] = i
	}
	var ended [2]bool
	endStream := func(s int) {
		msgs = append(msgs, end(names[s], written[s]))
		ended[s] = true
	}
	for s := range 2 {
		if last[s] < 0 && rapid.Bool().Draw(t, "end early") {
			endStream(s)
		}
	}
	for i, ch := range chunks {
		skip := at[ch.stream] - ch.offset
		if skip < int64(len(ch.data)) {
			skip = max(skip, 0)
			off, data := ch.offset+skip, ch.data[skip:]
			if rapid.Bool().Draw(t, "delivered") {
				msgs = append(msgs, frame(codes[ch.stream], uint64(off), uint64(ch.seq+skip), data))
				delivered[names[ch.stream]] += data
			} else {
				msgs = append(msgs, gap(names[ch.stream], off, off+int64(len(data))))
			}
			at[ch.stream] = off + int64(len(data))
		}
		if s := ch.stream; i == last[s] && rapid.Bool().Draw(t, "end early") {
			endStream(s)
		}
	}
	for s := range 2 {
		if !ended[s] {
			endStream(s)
		}
	}
	return from, append(msgs, exit(0)), delivered
}

// accepts reports whether c takes msgs whole, to the exit.
func accepts(c *Checker, msgs []msg) error {
	if i, err := take(c, msgs); err != nil {
		return fmt.Errorf("message %d: %w", i, err)
	}
	if c.Exit == nil {
		return errors.New("no exit")
	}
	return nil
}

// TestCheckerProperties: the checker takes every valid connection, and
// accounts for it exactly; and any one message moved, lost, repeated or
// miscounted in it is refused.
func TestCheckerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		from, msgs, delivered := transcript(t)
		c := &Checker{From: from, Keep: true}
		if err := accepts(c, msgs); err != nil {
			t.Fatalf("a valid connection refused at %v: %v", c, err)
		}
		for name, s := range c.Streams {
			if string(s.Data) != delivered[name] || s.Next != s.From+s.Delivered+s.Lost || s.Next != s.Total || !s.Ended || s.From != from[name] {
				t.Fatalf("%s accounted as %+v, delivered %q", name, s, delivered[name])
			}
		}

		var frames []int
		for i, m := range msgs {
			if m.typ == websocket.MessageBinary {
				frames = append(frames, i)
			}
		}
		var bad []msg
		switch mutation := rapid.IntRange(0, 5).Draw(t, "mutation"); mutation {
		case 0: // a message lost
			i := rapid.IntRange(0, len(msgs)-1).Draw(t, "lost")
			bad = with(msgs, i)
		case 1: // a message repeated
			i := rapid.IntRange(0, len(msgs)-1).Draw(t, "repeated")
			bad = with(msgs, i, msgs[i], msgs[i])
		case 2: // a frame moved by a byte
			if len(frames) == 0 {
				t.Skip("no frame")
			}
			i := frames[rapid.IntRange(0, len(frames)-1).Draw(t, "moved")]
			f, _ := api.ParseFrame(msgs[i].data)
			delta := rapid.SampledFrom([]int64{-1, 1}).Draw(t, "by")
			if int64(f.Offset)+delta < 0 {
				delta = 1
			}
			bad = with(msgs, i, frame(f.Stream, uint64(int64(f.Offset)+delta), f.Seq+uint64(delta), string(f.Data)))
		case 3: // two frames swapped
			if len(frames) < 2 {
				t.Skip("fewer than two frames")
			}
			k := rapid.IntRange(0, len(frames)-2).Draw(t, "swapped")
			i, j := frames[k], frames[k+1]
			bad = append([]msg(nil), msgs...)
			bad[i], bad[j] = bad[j], bad[i]
		case 4: // a gap miscounting what it lost
			var gaps []int
			for i, m := range msgs {
				if strings.Contains(string(m.data), `"gap"`) {
					gaps = append(gaps, i)
				}
			}
			if len(gaps) == 0 {
				t.Skip("no gap")
			}
			i := gaps[rapid.IntRange(0, len(gaps)-1).Draw(t, "miscounted")]
			var g api.Gap
			json.Unmarshal(msgs[i].data, &g)
			g.LostBytes += rapid.SampledFrom([]int64{-1, 1}).Draw(t, "by")
			bad = with(msgs, i, text(g))
		case 5: // the exit before the last end
			i := len(msgs) - 2 // the last end
			bad = with(msgs, i, msgs[len(msgs)-1], msgs[i])[:len(msgs)]
		}
		if err := accepts(&Checker{From: from}, bad); err == nil {
			t.Fatalf("accepted a broken connection:\n%v\nfrom the valid\n%v", bad, msgs)
		}
	})
}

// FuzzChecker: whatever a server sends, the checker does not panic, and
// what it has taken adds up.
func FuzzChecker(f *testing.F) {
	var seed []byte
	for _, m := range twoStreams {
		seed = appendMessage(seed, m)
	}
	f.Add(seed)
	f.Add(appendMessage(appendMessage(nil, twoStreams[0]), gap("stdout", 0, 1<<62)))
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &Checker{Keep: true}
		for len(in) > 2 {
			n := min(int(in[1])<<4|int(in[0]>>4), len(in)-2)
			typ := websocket.MessageText
			if in[0]&1 == 1 {
				typ = websocket.MessageBinary
			}
			if _, err := c.Message(typ, in[2:2+n]); err != nil {
				break
			}
			in = in[2+n:]
		}
		for name, s := range c.Streams {
			if s.Next != s.From+s.Delivered+s.Lost || int64(len(s.Data)) != s.Delivered || s.Ended && s.Total != s.Next {
				t.Fatalf("%s accounted as %+v", name, s)
			}
		}
	})
}

// appendMessage encodes m as FuzzChecker reads messages: the type in the
// low bit of the first byte, the length in the others and the second.
func appendMessage(b []byte, m msg) []byte {
	t := byte(0)
	if m.typ == websocket.MessageBinary {
		t = 1
	}
	n := len(m.data)
	return append(append(b, byte(n&0xf)<<4|t, byte(n>>4)), m.data...)
}
