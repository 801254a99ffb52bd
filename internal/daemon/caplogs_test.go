package daemon_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestLogRotationRefusedOutOfRange: a create request's log rotation out of
// range is a 400 whose message names the field, the range and the value.
func TestLogRotationRefusedOutOfRange(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	for _, tc := range []struct {
		body string
		want []string
	}{
		{`{"logs":{"max_size_bytes":100}}`, []string{"logs.max_size_bytes", "100", "65536", "1073741824"}},
		{`{"logs":{"max_size_bytes":2147483648}}`, []string{"logs.max_size_bytes", "2147483648"}},
		{`{"logs":{"max_size_bytes":-1}}`, []string{"logs.max_size_bytes", "-1"}},
		{`{"logs":{"max_files":1}}`, []string{"logs.max_files", "1", "2 to 100"}},
		{`{"logs":{"max_files":101}}`, []string{"logs.max_files", "101"}},
	} {
		code, body := k.do("POST", "/sandboxes", k.d.Token(), tc.body)
		var e api.Error
		if code != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Code != api.CodeInvalid {
			t.Errorf("%s: %d %s, want 400 invalid_argument", tc.body, code, body)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(e.Error.Message, w) {
				t.Errorf("%s: message %q does not say %q", tc.body, e.Error.Message, w)
			}
		}
	}
	if n := len(k.d.List()); n != 0 {
		t.Errorf("%d sandboxes made by refused requests", n)
	}
}

// TestLogRotationPerSandbox: the rotation a create request sets is the one
// the agent's writer keeps to; kilnd's own default (--log-max-size,
// --log-max-files) holds for a sandbox that sets none.
func TestLogRotationPerSandbox(t *testing.T) {
	t.Parallel()
	k := startConfig(t, daemon.Config{Logs: daemon.Logs{MaxSizeBytes: 128 << 10, MaxFiles: 4}})
	t.Cleanup(k.cleanup) // after the subtests, which run side by side
	// About 1.2 MB of log: many rotations either way.
	script := `i=0; while [ $i -lt 12000 ]; do echo "line $i of a log that rotates: 100 bytes or so, to fill files...."; i=$((i+1)); done`
	for _, tc := range []struct {
		name   string
		create string
		size   int64
		files  int
	}{
		{"its own", `{"logs":{"max_size_bytes":65536,"max_files":3}}`, 64 << 10, 3},
		{"kilnd's", `{}`, 128 << 10, 4},
		{"its size, kilnd's count", `{"logs":{"max_size_bytes":65536}}`, 64 << 10, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := *k
			k.t = t
			var info daemon.Info
			k.json("POST", "/sandboxes", tc.create, &info)
			var st api.Started
			k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", map[string]any{"command": "sh", "args": []string{"-c", script}, "capture": true}, &st)
			// Following the log returns once its run has ended.
			code, body := k.do("GET", "/sandboxes/"+info.ID+"/logs/"+st.ID+"?follow=true&format=json&tail=0", k.d.Token(), nil)
			if code != 200 {
				t.Fatalf("follow: %d %s", code, body)
			}
			dir := filepath.Join(k.state, "sandboxes", info.ID, sandbox.LogsName, st.ID)
			files, err := filepath.Glob(filepath.Join(dir, capture.ActiveName+"*"))
			if err != nil {
				t.Fatal(err)
			}
			if len(files) != tc.files {
				t.Errorf("%d files, want %d: %v", len(files), tc.files, files)
			}
			for _, f := range files {
				fi, err := os.Stat(f)
				if err != nil {
					t.Fatal(err)
				}
				// The end record may take the last file past its size.
				if fi.Size() > tc.size+512 || fi.Size() < tc.size/2 && filepath.Base(f) != capture.ActiveName {
					t.Errorf("%s holds %d bytes, rotating at %d", filepath.Base(f), fi.Size(), tc.size)
				}
			}
			var logs []daemon.CapturedLog
			k.json("GET", "/sandboxes/"+info.ID+"/logs", nil, &logs)
			if len(logs) != 1 || len(logs[0].Runs) != 1 || logs[0].Runs[0].State != capture.RetentionLoss.String() {
				t.Errorf("logs %+v, want one run whose begin rotated away", logs)
			}
		})
	}
}

// ndjson reads a captured log's records through GET …/logs/{pid} with an
// Accept header, and the response's content type.
func (k *kilnd) ndjson(t *testing.T, ctx context.Context, path string, each func(api.LogRecord) bool) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+k.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	dec := json.NewDecoder(resp.Body)
	dec.DisallowUnknownFields()
	for {
		var rec api.LogRecord
		if err := dec.Decode(&rec); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		if !each(rec) {
			break
		}
	}
	return resp.Header.Get("Content-Type")
}

// TestCapturedLogNDJSONFollows: Accept: application/x-ndjson gives the
// captured log as records with their stream offsets; with follow=true it
// follows the run as it writes, across rotation, and ends with the run.
func TestCapturedLogNDJSONFollows(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"logs":{"max_size_bytes":65536,"max_files":100}}`, &info)
	const half = 3000
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "line $i, about sixty bytes, of a log that rotates"; i=$((i+1)); done
read go
while [ $i -lt %d ]; do echo "line $i, about sixty bytes, of a log that rotates"; i=$((i+1)); done
printf 'caf\303\251 \377 no newline'`, half, 2*half)
	var st api.Started
	k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", map[string]any{"command": "sh", "args": []string{"-c", script}, "capture": true, "stdin": "pipe"}, &st)
	var want []byte
	for i := range 2 * half {
		want = fmt.Appendf(want, "line %d, about sixty bytes, of a log that rotates\n", i)
	}
	want = append(want, "caf\303\251 \377 no newline"...)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var got []byte
	released := false
	ctype := k.ndjson(t, ctx, "/sandboxes/"+info.ID+"/logs/"+st.ID+"?follow=true", func(rec api.LogRecord) bool {
		if rec.Gap != 0 || rec.LostBytes != 0 || rec.Stream != "stdout" {
			t.Fatalf("record %+v: want stdout records only", rec)
		}
		if rec.Offset == nil || *rec.Offset != int64(len(got)) {
			t.Fatalf("record %+v at offset %v, want %d", rec, rec.Offset, len(got))
		}
		b := []byte(rec.Text)
		if rec.Base64 != "" {
			var err error
			if b, err = base64.StdEncoding.DecodeString(rec.Base64); err != nil || utf8.Valid(b) {
				t.Fatalf("base64 %q: %v", rec.Base64, err)
			}
		}
		if !rec.Partial {
			b = append(b, '\n')
		}
		got = append(got, b...)
		if !released && bytes.HasSuffix(got, fmt.Appendf(nil, "line %d, about sixty bytes, of a log that rotates\n", half-1)) {
			// The run waits for this: what follows is followed live.
			released = true
			k.json("POST", "/sandboxes/"+info.ID+"/exec-stream/"+st.ID+"/stdin/close", nil, nil)
		}
		return true
	})
	if ctype != "application/x-ndjson" {
		t.Errorf("content type %q", ctype)
	}
	if !released || !bytes.Equal(got, want) {
		t.Fatalf("followed %d bytes, want %d (released %t)", len(got), len(want), released)
	}
	archives, _ := filepath.Glob(filepath.Join(k.state, "sandboxes", info.ID, sandbox.LogsName, st.ID, capture.ActiveName+".*"))
	if len(archives) < 3 {
		t.Errorf("%d rotations: want the follow to cross several", len(archives))
	}
}

// TestCapturedLogNDJSONGaps: a loss the log records is a record of its
// own, with its stream, where it begins and how many bytes; the records
// after it stand at their offsets.
func TestCapturedLogNDJSONGaps(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	id := k.sandbox()
	pid := uuid.Must(uuid.NewV7()).String()
	dir := filepath.Join(k.state, "sandboxes", id, sandbox.LogsName, pid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	const run = "0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90"
	ts := "2026-12-04T10:00:00.000000000Z "
	log := ts + `kiln F {"event":"file","seq":1,"run":"` + run + `","at":{"stdout":0,"stderr":0}}` + "\n" +
		ts + `kiln F {"event":"begin","run":"` + run + `"}` + "\n" +
		ts + "stdout F a\n" +
		ts + "stderr P e\n" +
		ts + `kiln F {"event":"drop","run":"` + run + `","stdout":7}` + "\n" +
		ts + "stdout F b\n" +
		ts + `kiln F {"event":"end","run":"` + run + `","dropped":{"stdout":7,"stderr":0}}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, capture.ActiveName), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	at := func(n int64) *int64 { return &n }
	when := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		query string
		want  []api.LogRecord
	}{
		{"", []api.LogRecord{
			{Time: when, Stream: "stdout", Offset: at(0), Text: "a"},
			{Time: when, Stream: "stderr", Offset: at(0), Text: "e", Partial: true},
			{Time: when, Stream: "stdout", Offset: at(2), LostBytes: 7},
			{Time: when, Stream: "stdout", Offset: at(9), Text: "b"},
		}},
		{"?stream=stderr", []api.LogRecord{
			{Time: when, Stream: "stderr", Offset: at(0), Text: "e", Partial: true},
		}},
		// The last line; the loss before it is not among the lines kept.
		{"?tail=1&stream=stdout", []api.LogRecord{
			{Time: when, Stream: "stdout", Offset: at(9), Text: "b"},
		}},
		{"?tail=2&stream=stdout", []api.LogRecord{
			{Time: when, Stream: "stdout", Offset: at(0), Text: "a"},
			{Time: when, Stream: "stdout", Offset: at(2), LostBytes: 7},
			{Time: when, Stream: "stdout", Offset: at(9), Text: "b"},
		}},
	} {
		var got []api.LogRecord
		k.ndjson(t, t.Context(), "/sandboxes/"+id+"/logs/"+pid+tc.query, func(rec api.LogRecord) bool {
			got = append(got, rec)
			return true
		})
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q: records (-want +got):\n%s", tc.query, diff)
		}
	}
	// A prefix of the process's id names its log; once another log's id
	// begins the same, the prefix is refused naming both.
	if code, body := k.do("GET", "/sandboxes/"+id+"/logs/"+pid[:8], k.d.Token(), nil); code != 200 || !strings.Contains(string(body), "b\n") {
		t.Errorf("the log by a prefix: %d %q", code, body)
	}
	twin := pid[:8] + "-0000-4000-8000-000000000000"
	if err := os.MkdirAll(filepath.Join(k.state, "sandboxes", id, sandbox.LogsName, twin), 0o700); err != nil {
		t.Fatal(err)
	}
	if code, body := k.do("GET", "/sandboxes/"+id+"/logs/"+pid[:8], k.d.Token(), nil); code != 400 || !strings.Contains(string(body), pid) || !strings.Contains(string(body), twin) {
		t.Errorf("a prefix two logs share: %d %q", code, body)
	}
	if code, body := k.do("GET", "/sandboxes/"+id+"/logs/"+pid[:3], k.d.Token(), nil); code != 404 {
		t.Errorf("3 characters: %d %q", code, body)
	}
}
