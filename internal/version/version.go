// Package version says which build of sandkiln this binary is.
package version

import (
	"runtime"
	"runtime/debug"

	"github.com/sandkiln/sandkiln/api"
)

// Get describes this binary's build: the module's version ("devel" for a
// build from a checkout), the commit and whether the tree had changes, and
// the Go toolchain.
func Get() api.Version {
	v := api.Version{Version: "devel", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if m := bi.Main.Version; m != "" && m != "(devel)" {
		v.Version = m
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}
