package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// Disks make sandboxes' disks: each sandbox's writable layers (its
// workspace and, with an image, the overlay's upper layer) live on an
// ext4 filesystem of their own, in a sparse image file the size of the
// sandbox's quota, on a loop device. A sandbox that fills it gets ENOSPC;
// the host's disk holds what was written and nothing more. (Project quotas
// on a shared filesystem would be cheaper, but need a kernel built with
// ext4 or XFS quota support, which many, this machine among them, are
// not.) The sandbox's mount table shows the loop device, not the host's
// paths.
//
// A disk is never mounted where the host sees it: it is a detached mount
// (fsmount), which the sandbox's agent moves into its own mount namespace,
// and which ends with the sandbox. Making one costs a few milliseconds
// (copying a formatted template's metadata, a loop device, the mount), so a
// few of the default size are made ahead.
type Disks struct {
	dir   string
	spare int64 // the size kept ready
	mu    sync.Mutex
	ready []*Disk // of size spare, not yet taken
	bg    sync.WaitGroup
	busy  bool // a refill runs
	// tmpl is held while a template is made: a refill and a Take may
	// both want it first.
	tmpl sync.Mutex
}

// spareDisks is how many disks of the default size are made ahead.
const spareDisks = 2

// DisksAvailable says why this host cannot make disks, or nil.
func DisksAvailable() error {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return errors.New("sandbox disks need mkfs.ext4 (Debian's e2fsprogs)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("sandbox disks need loop devices: %w", err)
	}
	return nil
}

// NewDisks keeps disks in dir, spare bytes of them made ahead (zero:
// none). keep are the disks in use (from sandbox records); any other one
// found in dir, from a kilnd that stopped, is released.
func NewDisks(dir string, spare int64, keep []string) (*Disks, error) {
	if err := DisksAvailable(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: disks: %w", err)
	}
	d := &Disks{dir: dir, spare: spare}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), templatePrefix) || slices.Contains(keep, path) {
			continue
		}
		// A template of an earlier layout goes too: disks made from now
		// on are of this one.
		os.Remove(path)
	}
	d.refill()
	return d, nil
}

// A Disk is a made disk: its image, and its detached mount, whose owner
// (the sandbox's agent, once it has it) keeps it mounted.
type Disk struct {
	Image string
	Mount *os.File
}

// Take returns a disk of size bytes; the caller owns its mount.
func (d *Disks) Take(bytes int64) (*Disk, error) {
	d.mu.Lock()
	if bytes == d.spare && len(d.ready) > 0 {
		disk := d.ready[len(d.ready)-1]
		d.ready = d.ready[:len(d.ready)-1]
		d.mu.Unlock()
		d.refill()
		return disk, nil
	}
	d.mu.Unlock()
	disk, err := d.make(bytes)
	d.refill()
	return disk, err
}

// refill makes spare disks in the background, one at a time.
func (d *Disks) refill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.spare == 0 || d.busy || len(d.ready) >= spareDisks {
		return
	}
	d.busy = true
	size := d.spare
	d.bg.Go(func() {
		for {
			disk, err := d.make(size)
			d.mu.Lock()
			if err != nil || d.spare != size { // failed, or closed
				d.busy = false
				d.mu.Unlock()
				if err == nil {
					disk.Mount.Close()
					os.Remove(disk.Image)
				}
				return
			}
			d.ready = append(d.ready, disk)
			if len(d.ready) >= spareDisks {
				d.busy = false
				d.mu.Unlock()
				return
			}
			d.mu.Unlock()
		}
	})
}

// CloneFrom makes a disk image that is a copy of src, a disk image of a
// snapshot (see CloneFile), for Mount to mount.
func (d *Disks) CloneFrom(src string) (string, error) {
	img := filepath.Join(d.dir, uuid.Must(uuid.NewV7()).String()+".img")
	if _, err := CloneFile(img, src); err != nil {
		return "", fmt.Errorf("sandbox: disk image: %w", err)
	}
	return img, nil
}

// Settle waits for a refill that runs to end: the spare disks are then
// as many as there will be until the next Take. It must not run beside a
// Take.
func (d *Disks) Settle() { d.bg.Wait() }

// Release deletes the image of a disk Take returned. What still has it
// mounted (the sandbox's mount namespace) keeps it until it ends.
func (d *Disks) Release(image string) error {
	if err := d.owns(image); err != nil {
		return err
	}
	if err := os.Remove(image); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox: release disk: %w", err)
	}
	return nil
}

// Mount mounts again, detached, the disk of image, one Take returned
// whose mount ended with its sandbox, for the sandbox started again: its
// files are as the sandbox left them. The caller owns the mount. A disk
// whose image still backs a loop device is refused: its filesystem may
// still be mounted (its last sandbox not quite gone), and two mounts of
// one ext4 filesystem through two devices would corrupt it.
func (d *Disks) Mount(image string) (*os.File, error) {
	if err := d.owns(image); err != nil {
		return nil, err
	}
	if _, err := os.Stat(image); err != nil {
		return nil, fmt.Errorf("sandbox: disk image: %w", err)
	}
	// The kernel lets go of an autoclear loop device after the last
	// mount through it went, in the background: a sandbox just stopped
	// (gVisor's, whose runtime held the mount, most often) may leave its
	// device attached a moment longer.
	deadline := time.Now().Add(detachWait)
	for {
		dev := backedLoop(image)
		if dev == "" {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sandbox: disk %s is still attached to %s after %v", filepath.Base(image), dev, detachWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return mountDetached(image)
}

// detachWait bounds Mount's wait for a disk's last loop device to go.
const detachWait = 5 * time.Second

// owns checks that image is one of the disks' images.
func (d *Disks) owns(image string) error {
	if filepath.Dir(image) != d.dir || !strings.HasSuffix(image, ".img") || strings.HasPrefix(filepath.Base(image), "template") {
		return fmt.Errorf("sandbox: %s is not one of the disks", image)
	}
	return nil
}

// backedLoop is the loop device whose backing file is image, or "". (The
// kernel names the file by its absolute path, links resolved.)
func backedLoop(image string) string {
	if abs, err := filepath.Abs(image); err == nil {
		image = abs
	}
	if real, err := filepath.EvalSymlinks(image); err == nil {
		image = real
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == image {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		}
	}
	return ""
}

// Close releases the spare disks, once no refill runs; the disks taken
// stay.
func (d *Disks) Close() {
	d.mu.Lock()
	d.spare = 0
	d.mu.Unlock()
	d.bg.Wait()
	d.mu.Lock()
	ready := d.ready
	d.ready = nil
	d.mu.Unlock()
	for _, disk := range ready {
		disk.Mount.Close()
		os.Remove(disk.Image)
	}
}

// make makes a disk of size bytes.
func (d *Disks) make(bytes int64) (*Disk, error) {
	tmpl, err := d.template(bytes)
	if err != nil {
		return nil, err
	}
	img := filepath.Join(d.dir, uuid.Must(uuid.NewV7()).String()+".img")
	if err := sparseCopy(img, tmpl); err != nil {
		os.Remove(img)
		return nil, fmt.Errorf("sandbox: disk image: %w", err)
	}
	mount, err := mountDetached(img)
	if err != nil {
		os.Remove(img)
		return nil, err
	}
	return &Disk{Image: img, Mount: mount}, nil
}

// mountDetached mounts img's ext4 filesystem through a loop device as a
// mount attached to nothing, nosuid and nodev.
func mountDetached(img string) (*os.File, error) {
	dev, err := attachLoop(img)
	if err != nil {
		return nil, err
	}
	defer dev.Close() // the mount holds the device; autoclear frees it after
	fs, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sandbox: disk: fsopen: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", dev.Name()); err != nil {
		return nil, fmt.Errorf("sandbox: disk: %w", err)
	}
	// A new filesystem's inode tables need no zeroing in the background,
	// which would write to the host's disk for each one.
	if err := unix.FsconfigSetFlag(fs, "noinit_itable"); err != nil {
		return nil, fmt.Errorf("sandbox: disk: %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("sandbox: disk: mount %s: %w", dev.Name(), err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("sandbox: disk: fsmount: %w", err)
	}
	return os.NewFile(uintptr(m), "disk"), nil
}

// templatePrefix begins the names of the templates of the layout
// template makes; a template of another name is of an earlier one.
const templatePrefix = "template-v2-"

// template is an empty ext4 image of size bytes, made once: a disk is a
// copy of its few written blocks.
func (d *Disks) template(bytes int64) (string, error) {
	d.tmpl.Lock()
	defer d.tmpl.Unlock()
	path := filepath.Join(d.dir, templatePrefix+strconv.FormatInt(bytes, 10)+".img")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("sandbox: disk template: %w", err)
	}
	err = f.Truncate(bytes)
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("sandbox: disk template: %w", err)
	}
	// -m 0: nothing reserved for host root, whom the sandbox is not.
	// Without the blocks reserved for growing it online, the template's
	// written blocks are 236 KiB, not 4 MiB, at 10 GiB: that is what each
	// disk copies.
	//
	// Its written blocks are also few runs, each an extent of every disk
	// made from it: the groups' bitmaps and inode tables together at the
	// start (-G 4096, one flexible group up to 512 GiB), and no backup
	// superblocks (sparse_super2, none: a disk lives as long as its
	// sandbox, fsck is never run on it). A disk's image is deleted
	// extent by extent, and a host filesystem mounted with discard
	// discards each extent freed as it is freed, waiting for the device:
	// 16 extents at 10 GiB were 4 or 5, 533 at 1 TiB 7.
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^resize_inode,sparse_super2", "-G", "4096",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,num_backup_sb=0", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("sandbox: mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("sandbox: disk template: %w", err)
	}
	return path, nil
}

// attachLoop puts img on a free loop device, which frees itself when its
// last user is gone.
func attachLoop(img string) (*os.File, error) {
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: disk image: %w", err)
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: loop devices: %w", err)
	}
	defer ctl.Close()
	for range 8 { // another may take the free device first
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("sandbox: a free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("sandbox: loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("sandbox: configure %s: %w", dev.Name(), err)
		}
	}
	return nil, errors.New("sandbox: no free loop device")
}

// sparseCopy copies src's data to a new dst of the same size, leaving its
// holes holes.
func sparseCopy(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}
