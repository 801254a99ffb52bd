package capture

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Names in a capture directory. Nothing else in it is read.
const (
	// ActiveName is the file the writer appends to.
	ActiveName = "output.log"
	// tempName is where a rotation builds the next active file before
	// renaming it over ActiveName, so that ActiveName never goes missing.
	tempName = ".output.log.next"
	// reserveName holds space set aside for the run's last records, freed
	// when the file system fills up.
	reserveName = ".reserve"
)

// archiveName is the name of the file with sequence number seq once it is
// no longer active: output.log.<seq>. Sequence numbers only rise, and an
// archive is never renamed again.
func archiveName(seq int64) string { return ActiveName + "." + strconv.FormatInt(seq, 10) }

// parseArchive returns the sequence number of an archive's name.
func parseArchive(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, ActiveName+".")
	if !ok || s == "" || s[0] == '0' || len(s) > 18 {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0
}

// Dir is an open capture directory: one per captured process. Every file
// operation goes through the directory's handle with names that are
// constants of this package, never through a path, and never follows a
// symbolic link.
type Dir struct {
	f *os.File
}

// OpenDir opens path as a capture directory, refusing a symbolic link.
func OpenDir(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("capture: open directory %s: %w", path, err)
	}
	return &Dir{f: os.NewFile(uintptr(fd), path)}, nil
}

// NewDir wraps an open directory handle; the Dir owns it from then on.
func NewDir(f *os.File) (*Dir, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("capture: %s: %w", f.Name(), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, fmt.Errorf("capture: %s is not a directory", f.Name())
	}
	return &Dir{f: f}, nil
}

// Sub makes (if needed) and opens the subdirectory name, one path
// component, without following a symbolic link: each captured process of a
// sandbox gets one under the sandbox's logs directory.
func (d *Dir) Sub(name string) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	err := unix.Mkdirat(d.fd(), name, 0o700)
	runtime.KeepAlive(d)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, d.wrap("mkdir", name, err)
	}
	return d.OpenSub(name)
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("capture: %q is not a directory name", name)
	}
	return nil
}

// OpenSub opens the existing subdirectory name, for reading.
func (d *Dir) OpenSub(name string) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	fd, err := unix.Openat(d.fd(), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	runtime.KeepAlive(d)
	if err != nil {
		return nil, d.wrap("open", name, err)
	}
	return &Dir{f: os.NewFile(uintptr(fd), d.f.Name()+"/"+name)}, nil
}

// Close closes the directory handle. Writers and readers opened from the
// directory keep working: they hold handles of their own.
func (d *Dir) Close() error { return d.f.Close() }

// Name is the directory's name, for messages.
func (d *Dir) Name() string { return d.f.Name() }

func (d *Dir) fd() int { return int(d.f.Fd()) }

func (d *Dir) wrap(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: d.f.Name() + "/" + name, Err: err}
}

// open opens a file of the directory without following a symbolic link.
// It refuses anything but a regular file, without blocking on a FIFO.
func (d *Dir) open(name string, flag int, perm uint32) (*os.File, error) {
	return d.openAs(name, name, flag, perm)
}

// openAs is open for a file that will be renamed to final: its messages
// use that name.
func (d *Dir) openAs(name, final string, flag int, perm uint32) (*os.File, error) {
	fd, err := unix.Openat(d.fd(), name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, perm)
	runtime.KeepAlive(d)
	if err != nil {
		return nil, d.wrap("open", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, d.wrap("stat", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, d.wrap("open", name, errors.New("not a regular file"))
	}
	// A regular file ignores O_NONBLOCK; clear it anyway so the runtime
	// treats the descriptor as the plain blocking file it is.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, d.wrap("open", name, err)
	}
	return os.NewFile(uintptr(fd), d.f.Name()+"/"+final), nil
}

func (d *Dir) rename(from, to string) error {
	err := unix.Renameat(d.fd(), from, d.fd(), to)
	runtime.KeepAlive(d)
	return d.wrap("rename", from, err)
}

func (d *Dir) link(from, to string) error {
	err := unix.Linkat(d.fd(), from, d.fd(), to, 0)
	runtime.KeepAlive(d)
	return d.wrap("link", from, err)
}

func (d *Dir) remove(name string) error {
	err := unix.Unlinkat(d.fd(), name, 0)
	runtime.KeepAlive(d)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return d.wrap("remove", name, err)
}

// stat describes name without following a symbolic link.
func (d *Dir) stat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	runtime.KeepAlive(d)
	return st, d.wrap("stat", name, err)
}

func (d *Dir) sync() error {
	return d.wrap("sync", ".", d.f.Sync())
}

// WriteFile replaces the file name with data atomically and durably: a
// temporary file, synced, renamed over it, the directory synced.
func (d *Dir) WriteFile(name string, data []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	tmp := "." + name + ".tmp"
	if err := d.remove(tmp); err != nil {
		return err
	}
	f, err := d.open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = d.rename(tmp, name)
	}
	if err != nil {
		d.remove(tmp)
		return err
	}
	return d.sync()
}

// ReadFile reads the file name of the directory, not through a link.
func (d *Dir) ReadFile(name string) ([]byte, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	f, err := d.open(name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 1<<20))
}

// List returns the names of the directory's subdirectories (a sandbox's
// logs directory holds one per captured process), sorted.
func (d *Dir) List() ([]string, error) {
	ents, err := d.entries()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// entries reads the directory through a descriptor of its own, so that
// concurrent listings do not share a read position.
func (d *Dir) entries() ([]os.DirEntry, error) {
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	runtime.KeepAlive(d)
	if err != nil {
		return nil, d.wrap("open", ".", err)
	}
	f := os.NewFile(uintptr(fd), d.f.Name())
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("capture: list %s: %w", d.f.Name(), err)
	}
	return ents, nil
}

// archives lists the archives' sequence numbers in rising order.
func (d *Dir) archives() ([]int64, error) {
	ents, err := d.entries()
	if err != nil {
		return nil, err
	}
	var seqs []int64
	for _, e := range ents {
		if seq, ok := parseArchive(e.Name()); ok {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}
