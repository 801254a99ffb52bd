package sandbox_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// prepareEnv makes the test binary a kilnd that only readies its cgroups
// and prints what that said.
const prepareEnv = "KILN_TEST_PREPARE_CGROUPS"

func prepareMain() {
	fmt.Println("prepare:", sandbox.PrepareCgroups())
}

// TestRefusedWithoutDelegation: on a pure cgroup v2 host, a kilnd whose
// cgroup is not given the memory, pids and cpu controllers refuses to
// start, naming them and what gives them (Delegate=yes); one whose cgroup
// has them moves into its leaf and enables them.
func TestRefusedWithoutDelegation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root")
	}
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Skip("not a pure cgroup v2 host (make test-v2 runs this test in one)")
	}
	if err := sandbox.PrepareCgroups(); err != nil {
		t.Fatal(err)
	}
	// This process is in its leaf now; beside it, the controllers are
	// enabled. A group there has them; its child, unless it passes them on,
	// has none.
	own := ownV2(t)
	g := filepath.Join(filepath.Dir(own), "kiln-refuse-"+uuid.Must(uuid.NewV7()).String())
	undelegated := filepath.Join(g, "child")
	for _, d := range []string{g, undelegated} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// The leaf a prepared kilnd made, then its group.
		for _, d := range []string{filepath.Join(undelegated, "kilnd"), undelegated, filepath.Join(g, "kilnd"), g} {
			if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
				t.Errorf("remove %s: %v", d, err)
			}
		}
	})
	prepareIn := func(dir string) string {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), prepareEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	got := prepareIn(undelegated)
	for _, want := range []string{"memory, pids, cpu", undelegated, "Delegate=yes"} {
		if !strings.Contains(got, want) {
			t.Errorf("a kilnd in a cgroup without controllers: %q, want it to say %q", got, want)
		}
	}
	if got := prepareIn(g); got != "prepare: <nil>" {
		t.Errorf("a kilnd in a cgroup with the controllers: %q", got)
	}
	b, err := os.ReadFile(filepath.Join(g, "cgroup.subtree_control"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(b)); strings.Join(got, " ") != "cpu memory pids" {
		t.Errorf("the prepared kilnd's cgroup enables %q, want cpu memory pids", got)
	}
}

// ownV2 is this process's v2 cgroup directory.
func ownV2(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return filepath.Join("/sys/fs/cgroup", p)
		}
	}
	t.Fatal("no cgroup v2 line in /proc/self/cgroup")
	return ""
}
