package mcp_test

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/mcp"
)

func TestPartialRune(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 0},
		{"é", 0},
		{"a\xc3", 1},         // é cut after its first byte
		{"a\xe2\x82", 2},     // € cut after two
		{"a\xf0\x9f\x98", 3}, // an emoji cut after three
		{"€", 0},
		{"a\x82", 0}, // a stray continuation byte: invalid, not pending
		{"\xff", 0},  // never valid: not held
	} {
		if got := mcp.PartialRune([]byte(c.in)); got != c.want {
			t.Errorf("PartialRune(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// TestPage: a page takes chunks up to its bound, cutting the last one,
// counts gaps without spending the bound, and gives back a character it
// ends inside.
func TestPage(t *testing.T) {
	pg := mcp.NewPage(map[string]int64{"stdout": 10, "stderr": 0}, 8)
	if pg.Reached(map[string]int64{"stdout": 11}) {
		t.Error("reached before reading")
	}
	if !pg.Add(client.Chunk{Stream: "stderr", Offset: 5, Lost: 5}) {
		t.Error("a gap filled the page")
	}
	if !pg.Add(client.Chunk{Stream: "stdout", Offset: 10, Bytes: []byte("abc")}) {
		t.Error("3 of 8 bytes filled the page")
	}
	if pg.Add(client.Chunk{Stream: "stderr", Offset: 5, Bytes: []byte("xyz€!")}) {
		t.Error("the page is full and says it is not")
	}
	// stderr holds "xy" + the first two bytes of "€" (xyz€! is cut at 5 bytes: "xyz" and €'s first two).
	if !pg.Cut() || pg.Taken() != 8 {
		t.Errorf("cut %v, taken %d", pg.Cut(), pg.Taken())
	}
	pg.Hold()
	want := map[string][]byte{"stdout": []byte("abc"), "stderr": []byte("xyz")}
	if diff := cmp.Diff(want, pg.Data()); diff != "" {
		t.Errorf("data (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int64{"stdout": 13, "stderr": 8}, pg.Next()); diff != "" {
		t.Errorf("next (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int64{"stderr": 5}, pg.Lost()); diff != "" {
		t.Errorf("lost (-want +got):\n%s", diff)
	}
	if pg.Taken() != 6 {
		t.Errorf("taken after holding back: %d", pg.Taken())
	}
}

// FuzzPagesJoin: however output is cut into chunks and pages, the pages'
// bytes joined are the output, each page within its bound, and no page
// ends inside a character.
func FuzzPagesJoin(f *testing.F) {
	f.Add([]byte("héllo wörld €€€ 😀"), uint8(3), uint16(256))
	f.Add(bytes.Repeat([]byte("é"), 600), uint8(1), uint16(257))
	f.Fuzz(func(t *testing.T, out []byte, chunk uint8, bound uint16) {
		step, max := int(chunk)+1, int(bound)%1024+4
		var joined []byte
		var at int64
		for at < int64(len(out)) {
			pg := mcp.NewPage(map[string]int64{"stdout": at}, max)
			for off := at; off < int64(len(out)); off += int64(step) {
				if !pg.Add(client.Chunk{Stream: "stdout", Offset: off, Bytes: out[off:min(off+int64(step), int64(len(out)))]}) {
					break
				}
			}
			if pg.Next()["stdout"] < int64(len(out)) {
				pg.Hold()
			}
			b := pg.Data()["stdout"]
			if len(b) > max || pg.Next()["stdout"] != at+int64(len(b)) {
				t.Fatalf("page of %d bytes (bound %d) from %d to %d", len(b), max, at, pg.Next()["stdout"])
			}
			if len(b) == 0 {
				// Only a character longer than what is left may stall a
				// page, and a bound of 4 or more holds any character.
				t.Fatalf("no progress at %d of %d", at, len(out))
			}
			// A page may end with the start of a sequence the output does
			// not complete (invalid either way), never inside a character.
			if n := mcp.PartialRune(b); n > 0 {
				if r, size := utf8.DecodeRune(out[pg.Next()["stdout"]-int64(n):]); r != utf8.RuneError && size > n {
					t.Fatalf("page ends inside %q: %q", r, b)
				}
			}
			joined = append(joined, b...)
			at = pg.Next()["stdout"]
		}
		if !bytes.Equal(joined, out) {
			t.Fatalf("joined %q, want %q", joined, out)
		}
	})
}

func TestLastBytes(t *testing.T) {
	in := strings.Repeat("0123456789", 1000)
	for _, n := range []int{1, 7, 100, 9999, 10000, 20000} {
		got, total, err := mcp.LastBytes(strings.NewReader(in), n)
		if err != nil || total != int64(len(in)) || string(got) != in[max(0, len(in)-n):] {
			t.Errorf("LastBytes(%d): %d bytes, total %d, %v", n, len(got), total, err)
		}
	}
	if got := mcp.PartialStart([]byte("\x82\xacabc")); got != 2 {
		t.Errorf("PartialStart: %d", got)
	}
}

func FuzzLogURI(f *testing.F) {
	f.Add("01a2406e-f860", "01a2406e-fb63")
	f.Add("a/b", "c d%")
	f.Fuzz(func(t *testing.T, sandbox, pid string) {
		if sandbox == "" || pid == "" || !utf8.ValidString(sandbox+pid) {
			return
		}
		uri := mcp.LogURI(sandbox, pid)
		sb, p, err := mcp.ParseLogURI(uri)
		if err != nil || sb != sandbox || p != pid {
			t.Fatalf("%q: %q %q %v", uri, sb, p, err)
		}
	})
}

func TestParseLogURIRefuses(t *testing.T) {
	for _, uri := range []string{"", "kiln://sandboxes/a/logs", "kiln://sandboxes//logs/p", "file:///etc/passwd", "kiln://other/a/logs/p", "kiln://sandboxes/a/files/p", "kiln://sandboxes/a/logs/p/q"} {
		if _, _, err := mcp.ParseLogURI(uri); err == nil {
			t.Errorf("%q taken", uri)
		}
	}
}
