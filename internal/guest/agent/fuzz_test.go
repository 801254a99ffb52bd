package agent

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// checkInvalid holds an error from a query or body decoder to what a client
// must get for bad input: the invalid-input class (400, never a 500) and a
// message that is valid UTF-8 and does not echo an unbounded value.
func checkInvalid(t *testing.T, err error, input string) {
	t.Helper()
	if !errors.Is(err, process.ErrInvalid) {
		t.Fatalf("%q: error %v is not an invalid argument", input, err)
	}
	rec := httptest.NewRecorder()
	writeError(rec, err)
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("%q: %v answered with %d", input, err, rec.Code)
	}
	if msg := err.Error(); !utf8.ValidString(msg) || len(msg) > 512 {
		t.Fatalf("%q: message %q", input, msg)
	}
}

// FuzzLogsQuery parses the query of GET …/logs: the offsets a reader
// resumes from, follow and stdin. Bad values are invalid arguments; what is
// accepted is what the query says, and reads back the same once written out.
func FuzzLogsQuery(f *testing.F) {
	for _, q := range []string{"", "stdout=5&stderr=7", "terminal=0&follow=0&stdin=1", "stdout=-1",
		"stdout=9223372036854775808", "stderr=%ff", "follow=perhaps", "stdout=1&stdout=2", "stdout=+3", "stdout=0x10"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw) // as r.URL.Query: malformed pairs are dropped
		from, err := parseFrom(q)
		if err != nil {
			checkInvalid(t, err, raw)
			return
		}
		back := url.Values{}
		for name, st := range map[string]ring.Stream{"stdout": ring.Stdout, "stderr": ring.Stderr, "terminal": ring.PTY} {
			if from[st] < 0 {
				t.Fatalf("%q: %s offset %d", raw, name, from[st])
			}
			if v := q.Get(name); v != "" {
				if n, _ := strconv.ParseInt(v, 10, 64); n != from[st] {
					t.Fatalf("%q: %s offset %d, the query says %q", raw, name, from[st], v)
				}
			} else if from[st] != 0 {
				t.Fatalf("%q: %s offset %d without one in the query", raw, name, from[st])
			}
			back.Set(name, strconv.FormatInt(from[st], 10))
		}
		again, err := parseFrom(back)
		if err != nil || again != from {
			t.Fatalf("%q: %v read back as %v, %v", raw, from, again, err)
		}
		for _, name := range []string{"follow", "stdin"} {
			b, err := parseBool(q, name, name == "follow")
			if err != nil {
				checkInvalid(t, err, raw)
				continue
			}
			want := name == "follow" // the default
			if v := q.Get(name); v != "" {
				want, _ = strconv.ParseBool(v)
			}
			if b != want {
				t.Fatalf("%q: %s is %v", raw, name, b)
			}
		}
	})
}

// FuzzStdinOffset parses POST …/stdin's ?offset=N: absent, a
// non-negative count, or an invalid argument.
func FuzzStdinOffset(f *testing.F) {
	for _, q := range []string{"", "offset=0", "offset=12", "offset=-1", "offset=", "offset=1e3",
		"offset=9223372036854775807", "offset=9223372036854775808", "offset=%00", "offset=1&offset=x"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw)
		offset, given, err := stdinOffset(q)
		if err != nil {
			checkInvalid(t, err, raw)
			return
		}
		if given != (q.Get("offset") != "") || offset < 0 || !given && offset != 0 {
			t.Fatalf("%q: offset %d, given %v", raw, offset, given)
		}
		if !given {
			return
		}
		again, given, err := stdinOffset(url.Values{"offset": {strconv.FormatInt(offset, 10)}})
		if err != nil || !given || again != offset {
			t.Fatalf("%q: offset %d read back as %d, %v, %v", raw, offset, again, given, err)
		}
	})
}

// FuzzParseSignal reads a signal request's name or number: a signal in
// 1..64 that reads back the same by name and by number, or an invalid
// argument.
func FuzzParseSignal(f *testing.F) {
	for _, s := range []string{"TERM", "sigkill", "SIGINT", "9", "0", "65", "-1", "", "SIG", "RTMIN", "+15", "１５", "TERM\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		sig, err := parseSignal(v)
		if err != nil {
			checkInvalid(t, err, v)
			return
		}
		if sig < 1 || sig > 64 {
			t.Fatalf("%q: signal %d", v, sig)
		}
		if again, err := parseSignal(strconv.Itoa(int(sig))); err != nil || again != sig {
			t.Fatalf("%q: signal %d read back by number as %d, %v", v, sig, again, err)
		}
		if name := unix.SignalName(sig); name != "" {
			if again, err := parseSignal(name); err != nil || again != sig {
				t.Fatalf("%q: signal %d read back by name %s as %d, %v", v, sig, name, again, err)
			}
		}
	})
}

// FuzzControlMessage decodes a WebSocket watcher's text messages: what is
// not JSON is malformed (the watcher is closed with 1003), any other refusal
// is a policy violation (1008); what is accepted is stdin_close, a resize
// within bounds, or an ack of known streams, and reads back the same once
// encoded.
func FuzzControlMessage(f *testing.F) {
	for _, m := range []string{`{"type":"stdin_close"}`, `{"type":"resize","cols":80,"rows":24}`, `{"type":"resize","cols":0,"rows":24}`,
		`{"type":"resize","cols":4097,"rows":1}`, `{"type":"resize","cols":-1}`, `{"type":"nope"}`, `{"type":"stdin_close","cols":3}`,
		`not json`, `{"type":"` + "\xff" + `"}`, `{"Type":"STDIN_CLOSE"}`, `[]`,
		`{"type":"ack","offsets":{"stdout":5,"stderr":0}}`, `{"type":"ack","offsets":{"stdin":5}}`, `{"type":"ack","offsets":{"stdout":-1}}`} {
		f.Add([]byte(m))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := controlMessage(data)
		var probe api.ClientMessage
		malformed := json.Unmarshal(data, &probe) != nil
		if errors.Is(err, errBadJSON) != malformed {
			t.Fatalf("%q: error %v, malformed %v", data, err, malformed)
		}
		if err != nil {
			if msg := err.Error(); !utf8.ValidString(msg) || !malformed && len(msg) > 512 {
				t.Fatalf("%q: reason %q", data, msg)
			}
			return
		}
		switch m.Type {
		case api.TypeStdinClose:
		case api.TypeResize:
			if m.Cols == 0 || m.Rows == 0 || m.Cols > api.MaxTTYSize || m.Rows > api.MaxTTYSize {
				t.Fatalf("%q: accepted a %dx%d terminal", data, m.Cols, m.Rows)
			}
		case api.TypeAck:
			for name, off := range m.Offsets {
				if _, ok := streamOf[name]; !ok || off < 0 {
					t.Fatalf("%q: accepted an ack of %q at %d", data, name, off)
				}
			}
		default:
			t.Fatalf("%q: accepted type %q", data, m.Type)
		}
		enc, _ := json.Marshal(m)
		if again, err := controlMessage(enc); err != nil || !cmp.Equal(again, m, cmpopts.EquateEmpty()) {
			t.Fatalf("%q: %+v read back as %+v, %v", data, m, again, err)
		}
	})
}
