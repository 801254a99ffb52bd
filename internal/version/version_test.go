package version

import (
	"runtime"
	"testing"
)

func TestGet(t *testing.T) {
	v := Get()
	if v.Version == "" || v.GoVersion != runtime.Version() || v.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("version %+v", v)
	}
}
