// A sandbox's mounts: host directories below those kilnd allows, checked
// whole, then opened and checked again by where the descriptor is, so
// that what a sandbox is given is what was checked.

package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/rootfs"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// checkMounts resolves cfg.AllowMounts through symbolic links, once: each
// must be an absolute path of an existing directory, neither holding
// kilnd's state directory nor in it (a sandbox could otherwise be given
// another's files, or kilnd's token).
func (cfg *Config) checkMounts() error {
	if len(cfg.AllowMounts) == 0 {
		return nil
	}
	state, err := filepath.EvalSymlinks(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("kilnd: state directory: %w", err)
	}
	roots := make([]string, 0, len(cfg.AllowMounts))
	for _, dir := range cfg.AllowMounts {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("kilnd: --allow-mount %q: want an absolute path", dir)
		}
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			return fmt.Errorf("kilnd: --allow-mount %s: %w", dir, err)
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			return fmt.Errorf("kilnd: --allow-mount %s: not a directory", dir)
		}
		if within(real, state) || within(state, real) {
			return fmt.Errorf("kilnd: --allow-mount %s: it holds kilnd's state directory, or is in it, which no sandbox may see", dir)
		}
		roots = append(roots, real)
	}
	cfg.AllowMounts = roots
	return nil
}

// within reports whether path is dir or below it; both absolute and
// clean.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// ownMounts are the sandbox's own mount points, which no mount may take
// (a target below them will do); ownTrees those no mount may be in at
// all: the kernel's, and the agent's handles.
var (
	ownMounts = []string{"/tmp", "/root", "/workspace"}
	ownTrees  = []string{"/proc", "/sys", "/dev", handoff.GuestDir, "/.old"}
)

// validateMounts checks a create's mounts, before anything of the host's
// is read: their number, each source's and target's form, targets apart
// from the sandbox's own mounts and from each other. hostSystem is a
// sandbox on the host's system directories, which it has read-only:
// no target may be in them, where no mount point can be made.
func validateMounts(ms []api.Mount, hostSystem bool) error {
	if len(ms) > api.MaxMounts {
		return fmt.Errorf("%w: mounts: %d of them: want at most %d", errdefs.ErrInvalidArgument, len(ms), api.MaxMounts)
	}
	for i, m := range ms {
		field := func(name string) string { return "mounts[" + strconv.Itoa(i) + "]." + name }
		for name, p := range map[string]string{"source": m.Source, "target": m.Target} {
			if err := checkPath(field(name), p); err != nil {
				return err
			}
		}
		t := m.Target
		if t == "/" {
			return fmt.Errorf("%w: %s /: want a directory below /, not the sandbox's root", errdefs.ErrInvalidArgument, field("target"))
		}
		for _, own := range ownTrees {
			if within(t, own) {
				return fmt.Errorf("%w: %s %q: in %s, which is the sandbox's own; want a path outside /proc, /sys, /dev, %s and /.old", errdefs.ErrInvalidArgument, field("target"), t, own, handoff.GuestDir)
			}
		}
		if slices.Contains(ownMounts, t) {
			return fmt.Errorf("%w: %s %q: one of the sandbox's own mounts (%s); a path below it will do", errdefs.ErrInvalidArgument, field("target"), t, strings.Join(ownMounts, ", "))
		}
		if hostSystem {
			for _, d := range rootfs.HostDirs() {
				if within(t, "/"+d) {
					return fmt.Errorf("%w: %s %q: in /%s, which a sandbox without an image has read-only from the host; want a path elsewhere, such as /data or below /workspace", errdefs.ErrInvalidArgument, field("target"), t, d)
				}
			}
		}
		for j, o := range ms[:i] {
			switch {
			case o.Target == t:
				return fmt.Errorf("%w: %s %q: mounts[%d] has that target already", errdefs.ErrInvalidArgument, field("target"), t, j)
			case within(t, o.Target) || within(o.Target, t):
				return fmt.Errorf("%w: %s %q: mounts[%d]'s target %q is in it, or it is in that one; want targets apart", errdefs.ErrInvalidArgument, field("target"), t, j, o.Target)
			}
		}
	}
	return nil
}

// checkPath checks that p, the request's field, is an absolute, clean
// path within PATH_MAX.
func checkPath(field, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: %s: want an absolute path", errdefs.ErrInvalidArgument, field)
	case len(p) >= unix.PathMax:
		return fmt.Errorf("%w: %s: %d bytes: want at most %d", errdefs.ErrInvalidArgument, field, len(p), unix.PathMax-1)
	case !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0):
		return fmt.Errorf("%w: %s %q: want an absolute, clean path (no \"..\" or \".\", no repeated or trailing \"/\")", errdefs.ErrInvalidArgument, field, api.Clip(p))
	}
	return nil
}

// openMounts opens each mount's source and checks where it is, for a
// sandbox created (class: the class of a refusal) or started again. The
// directories are the caller's to close (closeMounts), with an error
// too. A refusal names the source as the request gave it, never where
// it led, and never in the kernel's words.
func (d *Daemon) openMounts(ms []api.Mount, class *errdefs.Class, prefix string) ([]sandbox.Mount, error) {
	if err := d.mountsAllowed(ms, prefix); err != nil || len(ms) == 0 {
		return nil, err
	}
	var out []sandbox.Mount
	for i, m := range ms {
		f, why, err := d.openMount(m.Source)
		if err == nil && why != "" {
			err = errdefs.New(class, fmt.Sprintf("%smounts[%d].source %q: %s", prefix, i, api.Clip(m.Source), why))
		}
		if err != nil {
			closeMounts(out)
			return nil, err
		}
		out = append(out, sandbox.Mount{Dir: f, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return out, nil
}

// mountsAllowed refuses mounts ms, if there are any, of a kilnd that
// allows none.
func (d *Daemon) mountsAllowed(ms []api.Mount, prefix string) error {
	if len(ms) > 0 && len(d.cfg.AllowMounts) == 0 {
		return errdefs.New(errdefs.ErrPermissionDenied, prefix+"mounts: this kilnd allows none: it was started without --allow-mount DIR, which names the host directories sandboxes may mount from")
	}
	return nil
}

// closeMounts closes the directories of ms.
func closeMounts(ms []sandbox.Mount) {
	for _, m := range ms {
		m.Dir.Close()
	}
}

// openMount opens the directory source, following its symbolic links
// (never a magic link of /proc), and reads where the descriptor is, which
// no rename or link swapped meanwhile can change: below one of the
// directories kilnd allows, or why is said. An error is the host's.
func (d *Daemon) openMount(source string) (_ *os.File, why string, _ error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, source, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS})
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, "no such directory", nil
	case errors.Is(err, unix.ENOTDIR):
		return nil, "not a directory", nil
	case errors.Is(err, unix.ELOOP):
		return nil, "too many symbolic links, or a link of /proc", nil
	case errors.Is(err, unix.ENAMETOOLONG):
		return nil, "too long", nil
	case err != nil:
		return nil, "", d.hostFailure("a mount's source cannot be opened", err)
	}
	f := os.NewFile(uintptr(fd), "mount")
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		f.Close()
		return nil, "", d.hostFailure("a mount's source cannot be read", err)
	}
	state, _ := filepath.EvalSymlinks(d.cfg.StateDir)
	allowed := filepath.IsAbs(real) && !within(real, state) && slices.ContainsFunc(d.cfg.AllowMounts, func(root string) bool { return within(real, root) })
	if !allowed {
		f.Close()
		return nil, "not below a directory kilnd allows mounts from (its --allow-mount), symbolic links resolved", nil
	}
	return f, "", nil
}
