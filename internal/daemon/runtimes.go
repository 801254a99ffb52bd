package daemon

import (
	"path/filepath"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// RuntimeNames are the runtimes kilnd knows, the default first.
var RuntimeNames = []string{sandbox.RuntimeNamespaces, sandbox.RuntimeGVisor}

// runscDir is runsc's state directory, in kilnd's.
const runscDir = "runsc"

// bindsDir is where, in the state directory, a gVisor sandbox's mounts
// are mounted for runsc (sandbox.GVisor.Binds).
const bindsDir = "binds"

// Backends are the sandbox backends cfg gives, by runtime name, and why
// those this host cannot create sandboxes with cannot: they are there all
// the same, to take back and end the sandboxes an earlier run made.
func Backends(cfg Config) (map[string]sandbox.Backend, map[string]error) {
	ranges := sandbox.NewIDRanges()
	if cfg.uidFirst != 0 {
		ranges = sandbox.NewIDRangesFrom(cfg.uidFirst)
	}
	backends := map[string]sandbox.Backend{
		sandbox.RuntimeNamespaces: &sandbox.Namespaces{Exe: cfg.Exe, Ranges: ranges, Instance: cfg.Instance},
	}
	unavailable := map[string]error{}
	g := &sandbox.GVisor{Exe: cfg.Exe, Runsc: cfg.Runsc, Root: filepath.Join(cfg.StateDir, runscDir),
		Platform: cfg.RunscPlatform, Ranges: ranges, Instance: cfg.Instance, Binds: filepath.Join(cfg.StateDir, bindsDir)}
	if err := g.Check(); err != nil {
		unavailable[sandbox.RuntimeGVisor] = err
	}
	backends[sandbox.RuntimeGVisor] = g
	return backends, unavailable
}
