package main

import (
	"bytes"
	"testing"
)

func TestParseDetachKeys(t *testing.T) {
	for in, want := range map[string]string{
		"ctrl-p,ctrl-q": "\x10\x11",
		"ctrl-@":        "\x00",
		"ctrl-\\":       "\x1c",
		"CTRL-A,x":      "\x01x",
		"a,b,c":         "abc",
	} {
		got, err := parseDetachKeys(in)
		if err != nil || string(got) != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ctrl-", "ctrl-1", "ab", "ctrl-p,", "meta-x"} {
		if _, err := parseDetachKeys(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDetacher feeds input in every split and checks what the process gets:
// everything but a completed sequence, in order, nothing after it.
func TestDetacher(t *testing.T) {
	seq := []byte("\x10\x11")
	for _, tc := range []struct {
		in, sent string
		detach   bool
	}{
		{"hello", "hello", false},
		{"ab\x10\x11cd", "ab", true},
		{"\x10x\x10\x11", "\x10x", true},
		{"\x10\x10\x11", "\x10", true},
		{"\x11\x10", "\x11", false}, // \x10 held when the input stops
		{"a\x10", "a", false},
	} {
		for cut := 0; cut <= len(tc.in); cut++ {
			d := &detacher{seq: seq}
			var sent []byte
			detached := false
			for _, part := range []string{tc.in[:cut], tc.in[cut:]} {
				out, done := d.feed([]byte(part))
				sent = append(sent, out...)
				if done {
					detached = true
					break
				}
			}
			if string(sent) != tc.sent || detached != tc.detach {
				t.Errorf("%q cut at %d: sent %q detached %v; want %q %v", tc.in, cut, sent, detached, tc.sent, tc.detach)
			}
			if !detached && !bytes.Equal(append(sent, d.heldBytes()...), []byte(tc.in)) {
				t.Errorf("%q cut at %d: sent plus held %q", tc.in, cut, append(sent, d.heldBytes()...))
			}
		}
	}
}
