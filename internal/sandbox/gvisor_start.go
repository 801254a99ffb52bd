// The gVisor backend's start, step by step: the sandbox's root on the host
// (disk, workspace, the image's overlay), its network, the container's
// bundle, and runsc started in the sandbox's cgroups.

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/rootfs"
	"golang.org/x/sys/unix"
)

// Create implements Backend.
func (g *GVisor) Create(ctx context.Context, o Options) (_ Instance, err error) {
	o = o.withDefaults(30 * time.Second) // a kernel starts first
	lowers, err := o.lowers()
	if err != nil {
		return nil, err
	}
	if len(lowers) > 0 {
		if err := g.staticForImages(); err != nil {
			return nil, err
		}
	}
	var saved checkpointRecord
	if o.RestoreFrom != "" {
		if o.Restart != nil {
			return nil, fmt.Errorf("%w: sandbox: a sandbox started again is not restored from a checkpoint", errdefs.ErrInvalidArgument)
		}
		if saved, err = g.readCheckpoint(o.RestoreFrom); err != nil {
			return nil, err
		}
	}
	s, err := begin(o, LogsName, handoff.GuestSock, "bundle")
	if err != nil {
		return nil, err
	}
	defer s.end(&err)
	if o.RestoreFrom != "" {
		o.UIDBase, err = saved.UIDBase, g.Ranges.Share(saved.UIDBase, o.ID)
	} else {
		o.UIDBase, err = claimRange(g.Ranges, o)
	}
	if err != nil {
		return nil, err
	}
	s.o.UIDBase = o.UIDBase
	if o.Restart == nil {
		s.onFailure(func() { g.Ranges.Release(o.UIDBase, o.ID) })
	}
	if err := shiftDisk(g.Exe, o); err != nil {
		return nil, err
	}
	sb := &guestSandbox{Sandbox: Sandbox{ID: o.ID, Dir: o.Dir, UIDBase: o.UIDBase, EndOnOOM: true, ranges: g.Ranges}, Container: "kiln-" + o.ID, Root: g.Root, g: g,
		SharedRange: o.RestoreFrom != "", AgentDials: true}
	if o.RestoreFrom != "" {
		// The agent's capture files as they were when it was saved: it
		// goes on writing them where it was.
		if err := copyTree(filepath.Join(o.RestoreFrom, checkpointLogs), filepath.Join(o.Dir, LogsName)); err != nil {
			return nil, fmt.Errorf("sandbox: restore the captured logs: %w", err)
		}
	}
	if sb.ch, err = g.channels.listen(sb.Socket()); err != nil {
		return nil, err
	}
	s.onFailure(func() { sb.ch.close() })
	workspace, overlay, err := g.root(s, sb, lowers)
	if err != nil {
		return nil, err
	}
	if err := g.bind(s, sb); err != nil {
		return nil, err
	}
	network := "none"
	if o.Network != nil {
		if err := g.network(s, sb); err != nil {
			return nil, err
		}
		network = "sandbox"
	}
	if err := g.writeBundle(o, workspace, sb); err != nil {
		return nil, err
	}
	// The host counts runsc's threads, its kernel's and its file
	// server's with the sandbox's processes: room for them.
	lim := o.Limits
	if lim.Pids > 0 {
		lim.Pids += gvisorThreads
	}
	if lim.MemoryBytes > 0 {
		lim.MemoryBytes += gvisorMemory
	}
	if sb.Cgroups, err = s.cgroups(g.Instance, lim, true, func() { sb.forget() }); err != nil {
		return nil, err
	}
	cmd, err := g.startRunsc(s, sb, network, overlay)
	if err != nil {
		return nil, err
	}
	o.Network = nil // connected already
	// A sandbox restored finds the connections its agent had closed, and
	// makes them again by itself: gVisor has every file a process waits on
	// checked again once it is restored.
	if err := running(ctx, &sb.Sandbox, sb, cmd, o, " in gVisor", nil); err != nil {
		return nil, err
	}
	return sb, nil
}

// staticForImages refuses a kilnd linked dynamically for a sandbox with
// an image: its loader and libraries are the host's, which an image does
// not have, and in gVisor the agent cannot be started before its root is
// the image's.
func (g *GVisor) staticForImages() error {
	exe, err := os.Open(g.Exe)
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	dynamic := rootfs.NeedsLoader(exe)
	exe.Close()
	if dynamic {
		return errors.New("sandbox: a gVisor sandbox with an image needs kilnd linked statically " +
			"(CGO_ENABLED=0 go build ./cmd/kilnd); this one is linked dynamically")
	}
	return nil
}

// root makes sb's writable layers on the host, where runsc's file server
// finds them: its workspace, on its disk when it has one (mounted in its
// directory, which is kilnd's alone), and, with an image, the overlay that
// is its root. It returns the workspace and runsc's --overlay2 for the
// root: the host's system directories are read-only, but for an image's,
// which runsc writes through: an overlay on the host whose upper layer,
// on the sandbox's disk, takes the sandbox's writes and the mount points
// runsc makes (it makes them in the root it is given: never in the image).
func (g *GVisor) root(s *startup, sb *guestSandbox, lowers []string) (workspace, overlay string, err error) {
	o := s.o
	again := o.layersExist()
	layers := o.Dir
	if o.Disk != nil {
		sb.DiskMount = filepath.Join(o.Dir, diskName)
		if _, err := mkdir(sb.DiskMount, 0o700, again); err != nil {
			return "", "", fmt.Errorf("sandbox: %w", err)
		}
		if err := unix.MoveMount(int(o.Disk.Fd()), "", unix.AT_FDCWD, sb.DiskMount, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "", "", fmt.Errorf("sandbox: mount the sandbox's disk: %w", err)
		}
		s.onFailure(func() { unix.Unmount(sb.DiskMount, unix.MNT_DETACH) })
		layers = sb.DiskMount
	}
	// The sandbox's root owns its workspace: its processes are the host
	// users of its range, through gVisor's file server too.
	// (A sandbox started again has it from its earlier start, as its
	// processes left it.)
	workspace = filepath.Join(layers, WorkspaceName)
	made, err := mkdir(workspace, 0o755, again)
	if err != nil {
		return "", "", fmt.Errorf("sandbox: workspace: %w", err)
	}
	if made {
		if err := os.Chown(workspace, o.UIDBase, o.UIDBase); err != nil {
			return "", "", fmt.Errorf("sandbox: workspace: %w", err)
		}
	}
	if len(lowers) == 0 {
		return workspace, "root:memory", nil
	}
	if err := g.mountImage(s, sb, lowers, layers); err != nil {
		return "", "", err
	}
	return workspace, "none", nil
}

// mountImage mounts an image's layers, their owners shifted into the
// sandbox's range (its root's files are the sandbox's root's), and the
// overlay on them whose upper layer is in layers: sb's root.
func (g *GVisor) mountImage(s *startup, sb *guestSandbox, lowers []string, layers string) error {
	o := s.o
	trees, err := idmapped(g.Exe, lowers, o.UIDBase)
	if err != nil {
		return err
	}
	defer func() {
		for _, t := range trees {
			t.Close()
		}
	}()
	again := o.layersExist()
	for i, tree := range trees {
		m := filepath.Join(o.Dir, lowerName(i))
		_, err := mkdir(m, 0o755, again)
		if err == nil {
			err = unix.MoveMount(int(tree.Fd()), "", unix.AT_FDCWD, m, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}
		if err != nil {
			return fmt.Errorf("sandbox: mount the rootfs: %w", err)
		}
		if i == 0 {
			sb.ImageMount = m
		} else {
			sb.LayerMounts = append(sb.LayerMounts, m)
		}
		s.onFailure(func() { unix.Unmount(m, unix.MNT_DETACH) })
	}
	upper, work := filepath.Join(layers, "upper"), filepath.Join(layers, "work")
	made, err := mkdir(upper, 0o755, again)
	if err == nil {
		_, err = mkdir(work, 0o755, again)
	}
	if err != nil {
		return fmt.Errorf("sandbox: upper layer: %w", err)
	}
	// The merged root is the upper layer's: the sandbox's root owns it
	// (a sandbox started again has it as its processes left it).
	if made {
		if err := os.Chown(upper, o.UIDBase, o.UIDBase); err != nil {
			return fmt.Errorf("sandbox: upper layer: %w", err)
		}
	}
	sb.RootMount = filepath.Join(o.Dir, rootName)
	if _, err := mkdir(sb.RootMount, 0o755, again); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(append([]string{sb.ImageMount}, sb.LayerMounts...), ":"), upper, work)
	if err := unix.Mount("overlay", sb.RootMount, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("sandbox: mount the rootfs overlay: %w", err)
	}
	s.onFailure(func() { unix.Unmount(sb.RootMount, unix.MNT_DETACH) })
	return nil
}

// bind mounts the caller's directories where runsc's file server finds
// them: each a detached mount, its attributes set (rootfs.BindTree),
// mounted in the sandbox's directory of g.Binds, which only kilnd reads.
// The spec binds each from there, so what runsc opens is what kilnd
// checked, whatever the caller's path names meanwhile.
func (g *GVisor) bind(s *startup, sb *guestSandbox) error {
	o := s.o
	if len(o.Mounts) == 0 {
		return nil
	}
	if g.Binds == "" {
		return errors.New("sandbox: this gVisor runtime has no directory for mounts")
	}
	trees, err := bindTrees(o.Mounts)
	if err != nil {
		return err
	}
	defer func() {
		for _, t := range trees {
			t.Close()
		}
	}()
	dir := g.bindsOf(o.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	s.onFailure(func() { unbind(sb.BindMounts); os.Remove(dir) })
	for i, tree := range trees {
		p := filepath.Join(dir, strconv.Itoa(i))
		if _, err := mkdir(p, 0o700, true); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		sb.BindMounts = append(sb.BindMounts, p)
		if err := unix.MoveMount(int(tree.Fd()), "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("sandbox: mount at %s: %w", o.Mounts[i].Target, err)
		}
	}
	return nil
}

// network gives sb a network namespace of its own, connected (o.Network)
// before runsc takes its link, and an image's root the resolvers.
func (g *GVisor) network(s *startup, sb *guestSandbox) error {
	o := s.o
	sb.NetNS = filepath.Join(o.Dir, netnsName)
	if o.Restart != nil {
		// The earlier start's bind mount point, unmounted as it ended.
		if err := os.Remove(sb.NetNS); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	if err := newNetns(sb.NetNS); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	s.onFailure(func() { unix.Unmount(sb.NetNS, unix.MNT_DETACH) })
	if err := o.Network(sb.NetNS); err != nil {
		return fmt.Errorf("sandbox: connect its network: %w", err)
	}
	if sb.RootMount != "" {
		if err := rootfs.ImageResolvConf(sb.RootMount, o.Resolvers, o.UIDBase); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	return nil
}

// writeBundle writes the container's OCI spec into sb's bundle.
func (g *GVisor) writeBundle(o Options, workspace string, sb *guestSandbox) error {
	spec, err := g.spec(o, workspace, sb.RootMount, sb.NetNS, sb.BindMounts)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "bundle", "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	return nil
}

// startRunsc starts the command that runs sb's container: kilnd's own
// binary, born in the sandbox's v2 group (on a pure v2 host its limited
// procs group: the whole runtime is the sandbox's processes), which joins
// the v1 groups and executes runsc, so that the sentry and the file
// server it forks are held by the groups from the start.
func (g *GVisor) startRunsc(s *startup, sb *guestSandbox, network, overlay string) (*exec.Cmd, error) {
	cg := sb.Cgroups
	cgf, err := cg.openProcs()
	if cgf == nil && err == nil {
		cgf, err = cg.open()
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	defer cgf.Close()
	agentLog, err := s.agentLog()
	if err != nil {
		return nil, err
	}
	defer agentLog.Close()
	if err := os.MkdirAll(g.Root, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: runsc root: %w", err)
	}
	platform := g.Platform
	if platform == "" {
		platform = "systrap"
	}
	args := []string{"--root", g.Root, "--platform", platform, "--network", network, "--ignore-cgroups",
		"--host-uds", "open", "--in-sandbox-cgroup", "v2", "--overlay2", overlay}
	if image := s.o.RestoreFrom; image != "" {
		// Its pages load as they are needed, the rest in the background.
		args = append(args, "restore", "--image-path", filepath.Join(image, checkpointImage), "--background")
	} else {
		args = append(args, "run")
	}
	args = append(args, "--bundle", filepath.Join(s.o.Dir, "bundle"), sb.Container)
	join, err := json.Marshal(joinRequest{Groups: cg.joinDirs(), Path: g.Runsc, Args: append([]string{"runsc"}, args...)})
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(g.Exe)
	cmd.Args = []string{"kiln-runsc"}
	cmd.Env = []string{joinEnv + "=" + string(join), "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = agentLog, agentLog
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox: start runsc: %w", err)
	}
	return cmd, nil
}
