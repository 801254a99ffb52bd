// Command kilnd runs sandboxes and serves their processes' API; re-executed inside a new sandbox, it is that sandbox's agent.
package main

import (
	"os"

	"github.com/sandkiln/sandkiln/internal/agent"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

func main() {
	if sandbox.IsAgent() {
		os.Exit(agent.Main())
	}
	os.Exit(daemonMain(os.Args[1:]))
}
