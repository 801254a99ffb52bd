// Package roles is the one place that says which role a run of kilnd's
// binary plays. The binary is kilnd, and re-executed by kilnd it is also
// each sandbox's agent and the helpers around it; a test binary that
// starts sandboxes is re-executed the same way, so its TestMain plays the
// roles as cmd/kilnd does.
package roles

import (
	"os"

	"github.com/sandkiln/sandkiln/internal/files"
	"github.com/sandkiln/sandkiln/internal/guest"
	"github.com/sandkiln/sandkiln/internal/guest/agent"
	"github.com/sandkiln/sandkiln/internal/guest/confine"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Play plays the role this process was started for, each role one
// function, and returns its exit code; daemon is the default role's,
// kilnd's own. The roles other than the daemon's and the agent's never
// return.
//
// Inside a sandbox (package guest):
//   - the agent, its first process, which serves its processes' API;
//   - the spawner, which starts each of its processes, confined;
//   - a files helper, which opens and writes paths as the sandbox's root.
//
// On the host, beside kilnd (package sandbox):
//   - the join, which moves runsc into a gVisor sandbox's cgroups;
//   - the user-namespace holder, which lends its namespace to the id-map
//     of an image's layers.
func Play(daemon func() int) int {
	switch {
	case guest.IsAgent():
		return agent.Main()
	case confine.Is():
		confine.Main()
	case files.Is():
		files.Main()
	case sandbox.IsJoin():
		sandbox.JoinAndExec()
	case sandbox.IsHolder():
		sandbox.HoldUserns()
	}
	return daemon()
}

// PlayIfReexecuted plays the role kilnd re-executed this binary for, and
// exits; it returns when the binary was started for its own purpose. A
// test binary's TestMain calls it first, as does the benchmark's main:
// kilnd started from them re-executes them, not cmd/kilnd.
func PlayIfReexecuted() {
	if code := Play(func() int { return -1 }); code >= 0 {
		os.Exit(code)
	}
}
