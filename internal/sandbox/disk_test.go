package sandbox_test

import (
	"errors"
	"os"
	"path/filepath"
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

// TestDiskImageFewRuns: a disk's image holds its written blocks in a few
// runs, whatever its size: each run is an extent the host frees (and, on a
// filesystem mounted with discard, discards while the delete waits) when
// the image is deleted. Before the template's layout kept the groups'
// metadata together and left out the backup superblocks, a 10 GiB disk
// had 16 runs and a 1 TiB one 533. A template of an earlier layout left in
// the directory is removed.
func TestDiskImageFewRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("disks need root")
	}
	if err := sandbox.DisksAvailable(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	old := filepath.Join(dir, "template-10737418240.img")
	if err := os.WriteFile(old, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	disks, err := sandbox.NewDisks(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer disks.Close()
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the template of the earlier layout: %v; want it removed", err)
	}
	for _, size := range []int64{10 << 30, 1 << 40} {
		disk, err := disks.Take(size)
		if err != nil {
			t.Fatal(err)
		}
		diskWrite(t, disk.Mount, "kept", "written\n")
		disk.Mount.Close()
		if n := dataRuns(t, disk.Image); n > 8 {
			t.Errorf("a disk of %d GiB: its image has %d runs of data; want at most 8", size>>30, n)
		}
		if err := disks.Release(disk.Image); err != nil {
			t.Error(err)
		}
	}
}

// dataRuns counts the runs of data between the holes of the file at path.
func dataRuns(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for off := int64(0); ; n++ {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		if off, err = unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE); err != nil {
			t.Fatal(err)
		}
	}
}
