package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestPrintRecordsOfALoss: a loss the captured log records is a record of
// its own, said on stderr, never printed as a line of output.
func TestPrintRecordsOfALoss(t *testing.T) {
	var out, errs bytes.Buffer
	c := &cli{stdout: &out, stderr: &errs}
	body := `{"time":"2026-12-04T10:00:00Z","stream":"stdout","offset":0,"text":"a"}
{"time":"2026-12-04T10:00:00Z","stream":"stdout","offset":2,"lost_bytes":7}
{"time":"2026-12-04T10:00:01Z","stream":"stdout","offset":9,"text":"b"}
`
	if err := c.printRecords(strings.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	if want := "2026-12-04T10:00:00Z a\n2026-12-04T10:00:01Z b\n"; out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
	if want := "kiln: 7 bytes of stdout lost by the capture here\n"; errs.String() != want {
		t.Errorf("stderr %q, want %q", errs.String(), want)
	}
}
