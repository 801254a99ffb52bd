package daemon

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// recorder is a ResponseWriter that can be hijacked and counts the
// bytes its ReadFrom took.
type recorder struct {
	*httptest.ResponseRecorder
	readFrom int64
}

func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, _ := net.Pipe()
	return c, bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c)), nil
}

func (r *recorder) ReadFrom(src io.Reader) (int64, error) {
	n, err := io.Copy(r.ResponseRecorder, src)
	r.readFrom += n
	return n, err
}

// TestObservedWriter: a request's status is reported once, a switch of
// protocols as it happens (before the handler returns), anything else
// when the handler returns; the server's ReadFrom is kept.
func TestObservedWriter(t *testing.T) {
	for _, c := range []struct {
		name    string
		handle  func(w http.ResponseWriter)
		atOnce  bool // reported before the handler returned
		want    int
		readTo  int64
		written string
	}{
		{"nothing written", func(w http.ResponseWriter) {}, false, 200, 0, ""},
		{"a body", func(w http.ResponseWriter) { io.WriteString(w, "hi") }, false, 200, 0, "hi"},
		{"not found", func(w http.ResponseWriter) { w.WriteHeader(404); w.WriteHeader(500) }, false, 404, 0, ""},
		{"continue, then created", func(w http.ResponseWriter) { w.WriteHeader(100); w.WriteHeader(201) }, false, 201, 0, ""},
		{"switching protocols", func(w http.ResponseWriter) { w.WriteHeader(101) }, true, 101, 0, ""},
		{"hijacked", func(w http.ResponseWriter) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Fatal(err)
			}
			conn.Close()
		}, true, 101, 0, ""},
		// As http.ServeContent copies a file: io.CopyN, a reader without WriteTo.
		{"a file", func(w http.ResponseWriter) { io.CopyN(w, strings.NewReader("file"), 4) }, false, 200, 4, "file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{ResponseRecorder: httptest.NewRecorder()}
			var got []int
			ow := &observedWriter{ResponseWriter: rec, observe: func(code int) { got = append(got, code) }}
			c.handle(ow)
			if reported := len(got) > 0; reported != c.atOnce {
				t.Errorf("reported before the handler returned: %v, want %v", reported, c.atOnce)
			}
			ow.done()
			if len(got) != 1 || got[0] != c.want {
				t.Errorf("reported %v, want [%d]", got, c.want)
			}
			if rec.readFrom != c.readTo || rec.Body.String() != c.written {
				t.Errorf("ReadFrom took %d bytes, body %q; want %d, %q", rec.readFrom, rec.Body.String(), c.readTo, c.written)
			}
		})
	}
}
