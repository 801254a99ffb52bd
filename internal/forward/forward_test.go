package forward

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// closedAfter is a server's body of s that the server closes once s has
// been read: any read after that fails, as Go's server's does once the
// answer has begun.
type closedAfter struct {
	r     *strings.Reader
	reads int
}

func (c *closedAfter) Read(p []byte) (int, error) {
	c.reads++
	if c.r.Len() == 0 {
		return 0, http.ErrBodyReadAfterClose
	}
	return c.r.Read(p)
}

func (c *closedAfter) Close() error { return nil }

// TestBodyEndsWhereItSaid: the declared bytes come whole, then the end,
// as often as it is asked for, without one more read of the server's
// body (which could meet it closed); a body without a declared length is
// read to its own end.
func TestBodyEndsWhereItSaid(t *testing.T) {
	const s = "the whole body"
	src := &closedAfter{r: strings.NewReader(s)}
	r := Body(&http.Request{Body: src, ContentLength: int64(len(s))})
	got, err := io.ReadAll(io.LimitReader(r.Body, int64(len(s))))
	if err != nil || string(got) != s {
		t.Fatalf("read %q, %v", got, err)
	}
	reads := src.reads
	for range 3 {
		if n, err := r.Body.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("after the declared length: %d, %v; want the end", n, err)
		}
	}
	if src.reads != reads {
		t.Errorf("the server's body was read %d more times after its declared length", src.reads-reads)
	}

	chunked := Body(&http.Request{Body: io.NopCloser(strings.NewReader(s)), ContentLength: -1})
	if got, err := io.ReadAll(chunked.Body); err != nil || string(got) != s {
		t.Errorf("without a declared length: %q, %v", got, err)
	}
	if r := Body(&http.Request{Body: http.NoBody}); r.Body != http.NoBody {
		t.Error("no body became one")
	}
	short := Body(&http.Request{Body: io.NopCloser(strings.NewReader("abc")), ContentLength: 10})
	if got, err := io.ReadAll(short.Body); string(got) != "abc" || err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a body shorter than it said: %q, %v", got, err)
	}
}
