package sandbox_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// nsGetOwnerUID is ioctl_ns(2)'s NS_GET_OWNER_UID.
const nsGetOwnerUID = 0xb704

// TestUserNamespaceOwner: a sandbox's user namespace is owned by the
// first uid of its range, not by root, so that the kernel's per-user
// counts of what its processes hold are charged to that uid on the host;
// and no thread of the agent keeps that uid once it has made it.
func TestUserNamespaceOwner(t *testing.T) {
	t.Parallel()
	for _, base := range []int{sandbox.DefaultUIDBase, sandbox.DefaultUIDBase + sandbox.IDRange} {
		sb := newSandbox(t, sandbox.Options{UIDBase: base})
		spawner := spawnerOf(t, sb)
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", spawner))
		if err != nil {
			t.Fatal(err)
		}
		var owner uint32
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, ns.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner)))
		ns.Close()
		if errno != 0 {
			t.Fatalf("NS_GET_OWNER_UID: %v", errno)
		}
		if int(owner) != base {
			t.Errorf("the user namespace of a sandbox of range %d is owned by uid %d", base, owner)
		}
		threads, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", sb.PID))
		if len(threads) == 0 {
			t.Fatal("no thread of the agent")
		}
		for _, p := range threads {
			b, err := os.ReadFile(p)
			if err != nil {
				continue // a thread that ended since
			}
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "Uid:") && strings.Join(strings.Fields(line)[1:], " ") != "0 0 0 0" {
					t.Errorf("%s: %s", p, line)
				}
			}
		}
	}
}
