package client

import (
	"encoding/json"
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// TestExitValue: an exit read without pointers, whatever ended the process,
// and written back as kilnd writes it.
func TestExitValue(t *testing.T) {
	three := 3
	for _, tc := range []struct {
		wire   api.Exit
		code   int
		signal string
		known  bool
		text   string
	}{
		{api.Exit{ExitCode: &three}, 3, "", true, "process exited with code 3"},
		{api.SignalExit("KILL"), 137, "KILL", true, "process killed by signal KILL"},
		{api.Exit{ExitCode: api.SignalExit("KILL").ExitCode, Signal: "KILL", OOMKilled: true}, 137, "KILL", true, "process killed by signal KILL: out of memory"},
		{api.SignalExit("TERM"), 143, "TERM", true, "process killed by signal TERM"},
		{api.Exit{ExitCode: &three, OutputCut: api.OutputCutDrain}, 3, "", true, "process exited with code 3"},
		{api.Exit{}, -1, "", false, "process exit unknown"},
	} {
		e := ExitOf(tc.wire)
		if e.OutputCut() != (tc.wire.OutputCut != "") {
			t.Errorf("%+v: output cut %v", tc.wire, e.OutputCut())
		}
		if e.Code() != tc.code || e.Signal() != tc.signal || e.Known() != tc.known || e.OOMKilled() != tc.wire.OOMKilled || e.String() != tc.text {
			t.Errorf("%+v: code %d signal %q known %v text %q", tc.wire, e.Code(), e.Signal(), e.Known(), e)
		}
		want, _ := json.Marshal(tc.wire)
		got, err := json.Marshal(e)
		if err != nil || string(got) != string(want) {
			t.Errorf("%+v as JSON: %s, want %s", tc.wire, got, want)
		}
		var back Exit
		if err := json.Unmarshal(got, &back); err != nil || back != e {
			t.Errorf("%s read back: %+v, %v", got, back, err)
		}
	}
	if (Exit{}).Code() != -1 {
		t.Error("the zero Exit has a code")
	}
	// A record written before signals had codes gets its code when read.
	if e := ExitOf(api.Exit{Signal: "KILL"}); e.Code() != 137 {
		t.Errorf("an old record's KILL: code %d, want 137", e.Code())
	}
}
