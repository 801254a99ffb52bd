package client

import (
	"encoding/json"

	"github.com/sandkiln/sandkiln/api"
)

// Exit is how a process ended, as a value: its Code, and Signal when a
// signal ended it. The zero Exit is an exit not known.
type Exit struct {
	code   int
	signal string
	known  bool // code or signal is set
	oom    bool
	cut    bool
}

// ExitOf reads kilnd's description of an exit.
func ExitOf(e api.Exit) Exit {
	e = e.WithCode() // a record of before signals had codes
	x := Exit{signal: e.Signal, oom: e.OOMKilled, code: -1, known: e.ExitCode != nil || e.Signal != "", cut: e.OutputCut != ""}
	if e.ExitCode != nil {
		x.code = *e.ExitCode
	}
	return x
}

// Code is the process's exit code: its own, or, when a signal ended it
// (Signal says which), 128 plus the signal's number, as the shell and
// Docker give it (137 for KILL). It is -1 when the exit is not known.
func (e Exit) Code() int {
	if !e.known {
		return -1
	}
	return e.code
}

// OutputCut reports that the output did not end by itself: something the
// process left behind held it open past the drain time after its exit,
// and it was cut there (see api.ExecRequest.DrainMS).
func (e Exit) OutputCut() bool { return e.cut }

// Signal names the signal that ended the process ("KILL", "TERM"), or is
// empty when it exited with a code.
func (e Exit) Signal() string { return e.signal }

// Known reports whether the exit is known: a code or a signal.
func (e Exit) Known() bool { return e.known }

// OOMKilled reports that the kernel's out-of-memory killer ended the
// process: its sandbox's memory limit was reached.
func (e Exit) OOMKilled() bool { return e.oom }

// API is the exit as kilnd describes it.
func (e Exit) API() api.Exit {
	out := api.Exit{Signal: e.signal, OOMKilled: e.oom}
	if e.known && e.code >= 0 {
		code := e.code
		out.ExitCode = &code
	}
	if e.cut {
		out.OutputCut = api.OutputCutDrain
	}
	return out
}

// String is the seed's closing line: "process exited with code N", or
// killed by a signal.
func (e Exit) String() string { return e.API().String() }

// MarshalJSON writes the exit as kilnd does: exit_code or signal.
func (e Exit) MarshalJSON() ([]byte, error) { return json.Marshal(e.API()) }

// UnmarshalJSON reads kilnd's form.
func (e *Exit) UnmarshalJSON(b []byte) error {
	var w api.Exit
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = ExitOf(w)
	return nil
}
