package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestParseReport: a report is done only with its end line; each binary's
// status is read, one that printed none is not invented, and the times are
// the guest's.
func TestParseReport(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     report
	}{
		{"complete", "v2vm-up 3.5\nv2vm-run sandbox\n--- PASS: TestLimits (1.00s)\nv2vm-exit sandbox 0\nv2vm-exit daemon 1\nv2vm-end 63.5\n",
			report{Binaries: []result{{"sandbox", 0}, {"daemon", 1}}, Done: true, Booted: 3500 * time.Millisecond, Ran: time.Minute}},
		{"cut off", "v2vm-up 4\nv2vm-run sandbox\n=== RUN   TestLimits\n", report{Booted: 4 * time.Second}},
		{"garbled status", "v2vm-up 1\nv2vm-exit sandbox x\n", report{Binaries: []result{{"sandbox", -1}}, Booted: time.Second}},
		{"a test's own line is not an end", "v2vm-up 1\n    v2vm-end 9\n", report{Booted: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseReport(tc.in)
			tc.want.Output = tc.in
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("parseReport (-want +got):\n%s", d)
			}
		})
	}
}
