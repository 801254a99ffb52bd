package daemon_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestLogRotationRefusedOutOfRange: a create request's log rotation out of
// range is a 400 whose message names the field, the range and the value.
func TestLogRotationRefusedOutOfRange(t *testing.T) {
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
	k := startConfig(t, daemon.Config{Logs: daemon.Logs{MaxSizeBytes: 128 << 10, MaxFiles: 4}})
	defer k.cleanup()
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
