package sandbox_test

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestDiskMountedAgain: a disk's image outlives its mount, and mounted
// again it has what was written to it; mounted still (its image backing a
// loop device), it is refused a second mount, as is an image that is not
// one of the disks'.
func TestDiskMountedAgain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("disks need root")
	}
	if err := sandbox.DisksAvailable(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	disks, err := sandbox.NewDisks(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer disks.Close()
	disk, err := disks.Take(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer disks.Release(disk.Image)
	diskWrite(t, disk.Mount, "kept", "written before\n")

	if m, err := disks.Mount(disk.Image); err == nil || !strings.Contains(err.Error(), "still attached") {
		if m != nil {
			m.Close()
		}
		t.Fatalf("a second mount while the first is there: %v", err)
	}
	disk.Mount.Close() // its last holder: the mount ends, and its loop device
	m, err := disks.Mount(disk.Image)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := diskRead(t, m, "kept"); got != "written before\n" {
		t.Errorf("mounted again: %q", got)
	}
	if _, err := disks.Mount("/etc/passwd"); err == nil {
		t.Error("a file that is not a disk's image was mounted")
	}
}

func diskWrite(t *testing.T, mount *os.File, name, content string) {
	t.Helper()
	fd, err := unix.Openat(int(mount.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
}

func diskRead(t *testing.T, mount *os.File, name string) string {
	t.Helper()
	fd, err := unix.Openat(int(mount.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b := make([]byte, 64)
	n, _ := f.Read(b)
	return string(b[:n])
}
