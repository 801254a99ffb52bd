// Command kilnd runs sandboxes and serves their processes' API.
//
// Its binary plays more than kilnd: kilnd re-executes it as each
// sandbox's agent (the sandbox's first process, which serves the
// processes' API inside), as the spawner that starts each of a sandbox's
// processes confined, as a files helper, and, on the host, as the helper
// that starts runsc in a gVisor sandbox's cgroups and the one that holds
// a user namespace while an image's layers are id-mapped. Which one a
// run is, its environment says: roles.Play reads it and runs that role's
// one function; kilnd's own is daemonMain.
package main

import (
	"os"

	"github.com/sandkiln/sandkiln/internal/roles"
)

func main() {
	os.Exit(roles.Play(func() int { return daemonMain(os.Args[1:]) }))
}
