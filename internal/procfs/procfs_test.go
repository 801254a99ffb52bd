package procfs

import (
	"os"
	"strconv"
	"testing"
)

// TestStatOfThisProcess: this process's stat gives its name, its state
// and its parent, as the kernel has them.
func TestStatOfThisProcess(t *testing.T) {
	name, f, err := Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	comm, _ := os.ReadFile("/proc/self/comm")
	if name+"\n" != string(comm) || len(f) < 20 || f[0] != "R" && f[0] != "S" || f[1] != strconv.Itoa(os.Getppid()) {
		t.Errorf("name %q, fields %q", name, f)
	}
	if _, _, err := Stat(-1); err == nil {
		t.Error("a stat of pid -1")
	}
}
