// Memory snapshots of gVisor sandboxes: runsc saves the whole sandbox
// (its kernel, its processes' memory, the agent with every process's
// output ring) into an image, and a new sandbox restores from it, its
// processes going on where they were, their output at the same offsets.

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/handoff"
)

// ErrNoMemorySnapshot is the error of a memory snapshot asked of a sandbox
// whose runtime cannot take one: a namespace sandbox's processes run on
// the host's kernel, and CRIU, which could dump them, cannot dump the
// nested user namespaces they run in on the kernels kilnd runs on.
var ErrNoMemorySnapshot = errdefs.New(errdefs.ErrFailedPrecondition,
	"a memory snapshot needs a gVisor sandbox: a namespace sandbox's processes cannot be saved (CRIU cannot dump nested user namespaces), only its files")

// Checkpointer is an instance whose memory can be saved: a gVisor
// sandbox's (see GVisor.Create's Options.RestoreFrom).
type Checkpointer interface {
	Checkpoint(ctx context.Context, dir string, paused func() error) error
}

// Checkpoint refuses a namespace sandbox's memory snapshot
// (ErrNoMemorySnapshot).
func (s *Sandbox) Checkpoint(context.Context, string, func() error) error {
	return ErrNoMemorySnapshot
}

// In a checkpoint's directory: runsc's image, the sandbox's captured logs
// as they were when it was saved, and what a restore needs to know.
const (
	checkpointImage = "image"
	checkpointLogs  = LogsName
	checkpointMeta  = "checkpoint.json"
)

// checkpointRecord is what a restore needs of the saved sandbox beyond
// what its Options say.
type checkpointRecord struct {
	// ID is the saved sandbox's.
	ID string `json:"id"`
	// UIDBase is its uid range's: its processes' users are those of the
	// range in gVisor's kernel, saved with them, and so are the host
	// owners of the files they make. A restored sandbox shares the range.
	UIDBase int `json:"uid_base"`
	// Runsc is the version of runsc that saved it: another cannot restore.
	Runsc string `json:"runsc"`
	// Taken is when the sandbox was saved.
	Taken time.Time `json:"taken"`
}

// Checkpoint saves the sandbox into dir, a new directory, and leaves it
// running: it is paused, its captured logs are copied as they are,
// paused (when not nil) is called, runsc saves the paused sandbox's
// memory (`runsc checkpoint --leave-running`), and the sandbox resumes.
// The pause, the resume and the agent's signal to reconnect go to the
// sandbox's control server directly, as Pause does: a run of runsc each
// took longer than the work. paused is where the caller copies the
// sandbox's writable layer (its disk) consistently with the image:
// nothing in the sandbox runs meanwhile. The agent's connections to kilnd end as the sandbox is saved
// (connections from the sandbox to the host are not saved); it makes
// them again at once, so a request in flight then fails, and the next
// goes through. The sandbox must be running, not paused; a sandbox's
// checkpoints are its caller's to take one at a time.
func (s *guestSandbox) Checkpoint(ctx context.Context, dir string, paused func() error) (err error) {
	if !s.AgentDials {
		return errdefs.New(errdefs.ErrFailedPrecondition, "a memory snapshot needs the sandbox's agent to connect to kilnd: this sandbox's, "+
			"started by an earlier kilnd, listens on a socket gVisor cannot save (start the sandbox again)")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox: checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	v, err := s.g.cachedVersion()
	if err != nil {
		return err
	}
	// Paused and resumed as Pause does, without a run of runsc each
	// (setPaused), but not marked paused: it is for the moment it is saved.
	if err := s.setPaused(true); err != nil {
		return err
	}
	defer func() {
		if rerr := s.setPaused(false); rerr != nil {
			err = errors.Join(err, rerr)
			return
		}
		// Saved, its connections to kilnd are closed, and nothing tells
		// the agent (in a sandbox restored, gVisor has what waits look
		// again): kilnd does.
		if rerr := s.reconnect(); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if err := copyTree(filepath.Join(s.Dir, LogsName), filepath.Join(dir, checkpointLogs)); err != nil {
		return fmt.Errorf("sandbox: checkpoint: the captured logs: %w", err)
	}
	if paused != nil {
		if err := paused(); err != nil {
			return err
		}
	}
	// Uncompressed: a restore then loads its pages as they are needed,
	// in the background, and saving is as fast as the disk.
	if err := s.runscCtx(ctx, "checkpoint", "--image-path", filepath.Join(dir, checkpointImage), "--leave-running",
		"--compression", "none", s.Container); err != nil {
		return err
	}
	b, _ := json.Marshal(checkpointRecord{ID: s.ID, UIDBase: s.UIDBase, Runsc: v, Taken: time.Now().UTC()})
	if err := os.WriteFile(filepath.Join(dir, checkpointMeta), b, 0o600); err != nil {
		return fmt.Errorf("sandbox: checkpoint: %w", err)
	}
	return nil
}

// reconnect tells the agent to make its connections to kilnd again
// (handoff.ReconnectSignal): through the sandbox's control server, else
// by `runsc kill`.
func (s *guestSandbox) reconnect() error {
	err := s.signalDirect(int(handoff.ReconnectSignal))
	if !errors.Is(err, errNoFastPath) {
		return err
	}
	return s.runsc("kill", s.Container, strconv.Itoa(int(handoff.ReconnectSignal)))
}

// runscCtx runs one of runsc's commands on the container, bounded by ctx
// (a checkpoint's may take a while: its memory is written out).
func (s *guestSandbox) runscCtx(ctx context.Context, args ...string) error {
	all := append([]string{"--root", s.Root}, args...)
	out, err := exec.CommandContext(ctx, s.g.Runsc, all...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// readCheckpoint reads the record of the checkpoint in dir, and checks
// that this runsc can restore it.
func (g *GVisor) readCheckpoint(dir string) (checkpointRecord, error) {
	var rec checkpointRecord
	b, err := os.ReadFile(filepath.Join(dir, checkpointMeta))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		return rec, fmt.Errorf("%w: sandbox: not a checkpoint: %w", errdefs.ErrInvalidArgument, err)
	}
	v, err := g.cachedVersion()
	if err != nil {
		return rec, err
	}
	if v != rec.Runsc {
		return rec, fmt.Errorf("%w: sandbox: the checkpoint was taken by runsc %q, this is %q", errdefs.ErrFailedPrecondition, rec.Runsc, v)
	}
	return rec, nil
}

// copyTree copies the directory src, its regular files and directories,
// to dst, a new directory. The files are copied by the kernel
// (copy_file_range), which shares their extents where the file system
// can.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, fi.Mode().Perm()); err != nil && !(rel == "." && errors.Is(err, os.ErrExist)) {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(path, to, fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil // the capture directory holds files and directories only
		}
		// Owners as they were: the agent's files are its runtime's users'.
		st := fi.Sys().(*syscall.Stat_t)
		return os.Lchown(to, int(st.Uid), int(st.Gid))
	})
}

// copyFile copies the regular file src to dst, a new file of mode perm.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
