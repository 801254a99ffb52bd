package client

import (
	"errors"
	"iter"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func chunks(cs ...Chunk) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		for _, c := range cs {
			if !yield(c, nil) {
				return
			}
		}
	}
}

func lines(t *testing.T, max int, cs ...Chunk) []Line {
	t.Helper()
	var out []Line
	for l, err := range ReadLines(chunks(cs...), max) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func b(stream, s string) Chunk { return Chunk{Stream: stream, Bytes: []byte(s)} }

func TestReadLines(t *testing.T) {
	cases := []struct {
		name string
		max  int
		in   []Chunk
		want []Line
	}{
		{"two streams apart", 0, []Chunk{b("stdout", "a\nb"), b("stderr", "x\n"), b("stdout", "c\n")},
			[]Line{{"stdout", "a", false, false}, {"stderr", "x", false, false}, {"stdout", "bc", false, false}}},
		{"CRLF", 0, []Chunk{b("stdout", "dos\r"), b("stdout", "\nnext\r\n")},
			[]Line{{"stdout", "dos", false, false}, {"stdout", "next", false, false}}},
		{"final partial line", 0, []Chunk{b("stdout", "done\nprompt> ")},
			[]Line{{"stdout", "done", false, false}, {"stdout", "prompt> ", true, false}}},
		{"clipped", 4, []Chunk{b("stdout", "abcdefgh\nij\n")},
			[]Line{{"stdout", "abcd", false, true}, {"stdout", "ij", false, false}}},
		{"clipped across chunks, at a character boundary", 4, []Chunk{b("stdout", "ab"), b("stdout", "cé"), b("stdout", "zz\nok\n")},
			[]Line{{"stdout", "abc", false, true}, {"stdout", "ok", false, false}}},
		{"exactly the limit", 3, []Chunk{b("stdout", "abc\n")}, []Line{{"stdout", "abc", false, false}}},
		{"a gap ends the line it cut", 0, []Chunk{b("stdout", "hal"), {Stream: "stdout", Lost: 10}, b("stdout", "f\n")},
			[]Line{{"stdout", "hal", true, false}, {"stdout", "f", false, false}}},
		{"invalid bytes", 0, []Chunk{b("stdout", "a\xffb\n")}, []Line{{"stdout", "a\uFFFDb", false, false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, lines(t, tc.max, tc.in...)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestUTF8SplitEverywhere splits multi-byte characters at every position,
// through both the output decoder and the line reader.
func TestUTF8SplitEverywhere(t *testing.T) {
	const s = "aé€𝄞z\n"
	for i := 0; i <= len(s); i++ {
		for j := i; j <= len(s); j++ {
			var d decoders
			text := d.decode("stdout", []byte(s[:i])) + d.decode("stdout", []byte(s[i:j])) + d.decode("stdout", []byte(s[j:]))
			if text != s {
				t.Fatalf("split at %d,%d: %q", i, j, text)
			}
			got := lines(t, 0, b("stdout", s[:i]), b("stdout", s[i:j]), b("stdout", s[j:]))
			if len(got) != 1 || got[0].Text != strings.TrimSuffix(s, "\n") {
				t.Fatalf("lines split at %d,%d: %+v", i, j, got)
			}
		}
	}
	// A sequence cut by a gap, or left at the end, is one replacement.
	var d decoders
	if got := d.decode("stdout", []byte("x\xe2\x82")) + d.flush("stdout"); got != "x\uFFFD" {
		t.Errorf("cut sequence: %q", got)
	}
}

func TestReadLinesError(t *testing.T) {
	boom := errors.New("broken")
	seq := func(yield func(Chunk, error) bool) {
		if yield(b("stdout", "half"), nil) {
			yield(Chunk{}, boom)
		}
	}
	var got []Line
	var gotErr error
	for l, err := range ReadLines(seq, 0) {
		if err != nil {
			gotErr = err
			break
		}
		got = append(got, l)
	}
	if len(got) != 1 || !got[0].Partial || !errors.Is(gotErr, boom) {
		t.Errorf("lines %+v, err %v", got, gotErr)
	}
}

func TestTail(t *testing.T) {
	tail := NewTail(TailOptions{MaxBytes: 16, MaxLines: 2})
	if l, trunc := tail.Snapshot(); len(l) != 0 || trunc {
		t.Errorf("empty tail: %v %v", l, trunc)
	}
	tail.Push(b("stdout", "one\n"))
	tail.Push(b("stdout", "two\n"))
	if l, trunc := tail.Snapshot(); len(l) != 2 || trunc || l[1].Text != "two" {
		t.Errorf("small window: %+v %v", l, trunc)
	}
	tail.Push(b("stdout", "three\n"))
	tail.Push(b("stdout", "four\nfi"))
	l, trunc := tail.Snapshot()
	want := []Line{{"stdout", "four", false, false}, {"stdout", "fi", true, false}}
	if diff := cmp.Diff(want, l); diff != "" || !trunc {
		t.Errorf("rolled window (-want +got):\n%s, truncated %v", diff, trunc)
	}
	gap := NewTail(TailOptions{})
	gap.Push(b("stdout", "a\n"))
	gap.Push(Chunk{Stream: "stdout", Lost: 5})
	if _, trunc := gap.Snapshot(); !trunc {
		t.Error("a gap does not mark the window truncated")
	}
}

// FuzzDecoderSplit: however output is cut into chunks, the decoded text is
// the same, and valid UTF-8.
func FuzzDecoderSplit(f *testing.F) {
	f.Add([]byte("aé€𝄞\xff\xc3"), 2, 5)
	f.Fuzz(func(t *testing.T, b []byte, i, j int) {
		if len(b) == 0 {
			return
		}
		i, j = abs(i)%(len(b)+1), abs(j)%(len(b)+1)
		if i > j {
			i, j = j, i
		}
		var whole, split decoders
		one := whole.decode("s", b) + whole.flush("s")
		parts := split.decode("s", b[:i]) + split.decode("s", b[i:j]) + split.decode("s", b[j:]) + split.flush("s")
		if one != parts {
			t.Fatalf("%q cut at %d,%d: %q, whole %q", b, i, j, parts, one)
		}
		if !utf8.ValidString(one) {
			t.Fatalf("invalid UTF-8 out: %q", one)
		}
	})
}

func abs(i int) int {
	if i < 0 {
		if i == -i { // the smallest int
			return 0
		}
		return -i
	}
	return i
}
