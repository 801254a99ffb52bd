// A snapshot as a tar, so that a workspace can move between hosts: its
// record, its disk's data (the image is sparse: each run of data an entry
// of its own, at its offset), and its processes' captured logs.

package daemon

import (
	"archive/tar"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Names in a snapshot's tar: the record first, then the disk's data runs
// (disk/ and the run's offset, 16 hex digits), then the captured logs
// (logs/PROCESS/FILE).
const (
	exportRecord = "snapshot.json"
	exportDisk   = "disk/"
	exportLogs   = "logs/"
	// exportRun bounds one data run's entry: a longer run is cut.
	exportRun = 64 << 20
	// maxExportRecord bounds the record's entry on import.
	maxExportRecord = 4 << 20
)

func (d *Daemon) exportSnapshotHandler(w http.ResponseWriter, r *http.Request) {
	snap, err := d.snapshot(r.PathValue("snapshot"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	// Open before the answer begins: a snapshot removed meanwhile is 404,
	// and one removed while it is read is read whole (its files stay
	// until closed).
	disk, err := os.Open(d.snaps.path(snap.ID, snapshotDisk))
	if err != nil {
		reply.Error(w, fmt.Errorf("%w: no snapshot %q", errdefs.ErrNotFound, api.Clip(r.PathValue("snapshot"))))
		return
	}
	defer disk.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", `attachment; filename="snapshot-`+api.ShortID(snap.ID)+`.tar"`)
	tw := tar.NewWriter(w)
	if err := writeExport(tw, snap, disk, d.snaps.path(snap.ID, snapshotLogs)); err != nil {
		// The status is sent: the connection is cut, not ended, so that
		// no client takes what came for the whole tar.
		d.log.Warn("snapshot export cut", "snapshot", snap.ID, "err", err)
		panic(http.ErrAbortHandler)
	}
	tw.Close()
}

// writeExport writes a snapshot's entries.
func writeExport(tw *tar.Writer, snap snapshotRecord, disk *os.File, logs string) error {
	// Its processes' memory stays here: an image of runsc's is for the
	// same runsc, and holds what the sandbox had open on this host.
	snap.Memory = false
	rec, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return err
	}
	now := time.Now()
	if err := writeEntry(tw, exportRecord, rec, now); err != nil {
		return err
	}
	fi, err := disk.Stat()
	if err != nil {
		return err
	}
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(disk.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(disk.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for data < hole {
			n := min(hole-data, exportRun)
			hdr := &tar.Header{Name: exportDisk + fmt.Sprintf("%016x", data), Mode: 0o600, Size: n, ModTime: now, Typeflag: tar.TypeReg}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := io.Copy(tw, io.NewSectionReader(disk, data, n)); err != nil {
				return err
			}
			data += n
		}
		off = hole
	}
	return filepath.WalkDir(logs, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(logs, p)
		if err != nil {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return writeEntry(tw, exportLogs+filepath.ToSlash(rel), b, now)
	})
}

func writeEntry(tw *tar.Writer, name string, b []byte, at time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(b)), ModTime: at, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}

func (d *Daemon) importSnapshotHandler(w http.ResponseWriter, r *http.Request) {
	snap, err := d.ImportSnapshot(r.Body)
	if err != nil {
		reply.Error(w, err)
		return
	}
	d.publishSnapshot(r.Context(), snap)
	w.Header().Set("Location", "/snapshots/"+snap.ID)
	reply.JSON(w, http.StatusCreated, d.ownSnapshot(snap))
}

// ImportSnapshot takes a snapshot from the tar an export wrote, whole or
// not at all, with its id (a snapshot of that id here already is a
// conflict). Its image, if it has one, must be pulled here for a sandbox
// to be made from it.
func (d *Daemon) ImportSnapshot(body io.Reader) (api.Snapshot, error) {
	if d.snaps == nil {
		return api.Snapshot{}, errdefs.Opaque(errdefs.ErrUnavailable, "this kilnd cannot keep snapshots (kilnd's log says why, when it started)", d.snapsErr)
	}
	s := d.snaps
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: snapshot import: "+format, append([]any{errdefs.ErrInvalidArgument}, args...)...)
	}
	tr := tar.NewReader(body)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != exportRecord || hdr.Typeflag != tar.TypeReg || hdr.Size > maxExportRecord {
		return api.Snapshot{}, bad("the tar must begin with %s, a file of at most %d bytes, as kiln snapshot export writes it", exportRecord, maxExportRecord)
	}
	var snap snapshotRecord
	dec := json.NewDecoder(io.LimitReader(tr, maxExportRecord))
	if err := dec.Decode(&snap); err != nil {
		return api.Snapshot{}, bad("%s: %v", exportRecord, err)
	}
	if snap.Processes == nil {
		snap.Processes = []api.Process{}
	}
	// Where it was is not where it is: the API tells its node. And it is
	// kept here, whatever it was there.
	snap.Node, snap.NodeState, snap.Transient = "", "", false
	if err := checkImported(snap); err != nil {
		return api.Snapshot{}, bad("%s: %v", exportRecord, err)
	}
	s.mu.Lock()
	_, exists := s.byID[snap.ID]
	var named error
	if snap.Name != "" {
		if _, err := s.lookup(snap.Name); err == nil || s.taking[snap.Name] {
			named = fmt.Errorf("%w: a snapshot named %q exists: remove it, or rename it, first", errdefs.ErrAlreadyExists, snap.Name)
		} else {
			s.taking[snap.Name] = true
			defer func() {
				s.mu.Lock()
				delete(s.taking, snap.Name)
				s.mu.Unlock()
			}()
		}
	}
	used := s.used()
	s.mu.Unlock()
	switch {
	case exists:
		return api.Snapshot{}, fmt.Errorf("%w: snapshot %s is here already", errdefs.ErrAlreadyExists, snap.ID)
	case named != nil:
		return api.Snapshot{}, named
	}
	tmp := s.path(snapshotNewMark + uuid.NewString())
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot import", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	disk, err := os.OpenFile(filepath.Join(tmp, snapshotDisk), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot import", err)
	}
	defer disk.Close()
	if err := disk.Truncate(snap.DiskBytes); err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot import", err)
	}
	// What it takes, counted as it comes against the quota.
	var written int64
	room := func(n int64) error {
		if written += n; used+written > s.quota {
			return fmt.Errorf("%w: snapshot quota: snapshots take %d bytes of kilnd's %d (kilnd --snapshot-quota), and this one more than %d: remove snapshots (kiln snapshot rm) first",
				errdefs.ErrPermissionDenied, used, s.quota, written)
		}
		return nil
	}
	next := int64(0) // where the next data run may begin
	logs := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return api.Snapshot{}, bad("%v", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return api.Snapshot{}, bad("entry %q: want regular files only", api.Clip(hdr.Name))
		}
		switch {
		case strings.HasPrefix(hdr.Name, exportDisk):
			off, err := strconv.ParseInt(strings.TrimPrefix(hdr.Name, exportDisk), 16, 64)
			if err != nil || len(hdr.Name) != len(exportDisk)+16 || off < next || hdr.Size <= 0 || hdr.Size > exportRun || off+hdr.Size > snap.DiskBytes {
				return api.Snapshot{}, bad("entry %q: want disk/ and an offset of 16 hex digits, in order, its data within the disk's %d bytes", api.Clip(hdr.Name), snap.DiskBytes)
			}
			if err := room(hdr.Size); err != nil {
				return api.Snapshot{}, err
			}
			if _, err := io.Copy(io.NewOffsetWriter(disk, off), tr); err != nil {
				return api.Snapshot{}, importFailure(d, err)
			}
			next = off + hdr.Size
		case strings.HasPrefix(hdr.Name, exportLogs):
			proc, file, ok := strings.Cut(strings.TrimPrefix(hdr.Name, exportLogs), "/")
			if _, err := uuid.Parse(proc); err != nil || !ok || !logFileName(file) || logs[hdr.Name] {
				return api.Snapshot{}, bad("entry %q: want logs/PROCESS/output.log or output.log.N, once each", api.Clip(hdr.Name))
			}
			logs[hdr.Name] = true
			if err := room(hdr.Size); err != nil {
				return api.Snapshot{}, err
			}
			dir := filepath.Join(tmp, snapshotLogs, proc)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return api.Snapshot{}, d.hostFailure("snapshot import", err)
			}
			f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return api.Snapshot{}, d.hostFailure("snapshot import", err)
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return api.Snapshot{}, importFailure(d, err)
			}
		default:
			return api.Snapshot{}, bad("entry %q: want %s, then disk/… and logs/… entries", api.Clip(hdr.Name), exportRecord)
		}
	}
	if err := os.MkdirAll(filepath.Join(tmp, snapshotLogs), 0o700); err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot import", err)
	}
	snap.SizeBytes = allocatedTree(tmp)
	snap.Copy = "copy" // written, whatever it was where it was taken
	err = writeJSON(filepath.Join(tmp, snapshotFile), snap)
	if err == nil {
		err = syncTree(tmp)
	}
	if err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot import", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[snap.ID]; ok {
		return api.Snapshot{}, fmt.Errorf("%w: snapshot %s is here already", errdefs.ErrAlreadyExists, snap.ID)
	}
	if err := os.Rename(tmp, s.path(snap.ID)); err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot import", err)
	}
	done = true
	s.byID[snap.ID] = &snap
	d.log.Info("snapshot imported", "id", snap.ID, "bytes", snap.SizeBytes)
	return snap.Snapshot, nil
}

// importFailure is the error of an import whose body could not be read
// or written.
func importFailure(d *Daemon, err error) error {
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return fmt.Errorf("%w: snapshot import: %w", errdefs.ErrTooLarge, err)
	case errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("%w: snapshot import: the state directory's file system is full", errdefs.ErrNoSpace)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, tar.ErrHeader):
		return fmt.Errorf("%w: snapshot import: the tar ends inside an entry", errdefs.ErrInvalidArgument)
	}
	return d.hostFailure("snapshot import", err)
}

// logFileName says name is a captured log's file: output.log, or an
// archive of it.
func logFileName(name string) bool {
	if name == "output.log" {
		return true
	}
	n, ok := strings.CutPrefix(name, "output.log.")
	v, err := strconv.ParseUint(n, 10, 62)
	return ok && err == nil && v > 0 && strconv.FormatUint(v, 10) == n
}

// checkImported checks an imported snapshot's record.
func checkImported(s snapshotRecord) error {
	if b, err := hex.DecodeString(s.ID); err != nil || len(b) != 32 || strings.ToLower(s.ID) != s.ID {
		return fmt.Errorf("id %q: want 64 lower-case hex digits", api.Clip(s.ID))
	}
	if s.Name != "" && !isLabel(s.Name) {
		return fmt.Errorf("name %q: want a DNS label", api.Clip(s.Name))
	}
	if s.DiskBytes < api.MinDiskBytes || s.DiskBytes > api.MaxDiskBytes {
		return fmt.Errorf("disk_bytes %d: want %d to %d", s.DiskBytes, int64(api.MinDiskBytes), int64(api.MaxDiskBytes))
	}
	if s.Limits.DiskBytes != s.DiskBytes {
		return fmt.Errorf("limits.disk_bytes %d: want disk_bytes, %d", s.Limits.DiskBytes, s.DiskBytes)
	}
	if err := ValidateLimits(s.Limits, "limits."); err != nil {
		return err
	}
	if !slices.Contains(RuntimeNames, s.Runtime) {
		return fmt.Errorf("runtime %q: want %s", api.Clip(s.Runtime), strings.Join(RuntimeNames, " or "))
	}
	if s.DiskIDs < 1 || s.DiskIDs > 1<<32-1-sandbox.IDRange {
		return fmt.Errorf("disk_ids %d: want a host uid from 1 to %d", s.DiskIDs, 1<<32-1-sandbox.IDRange)
	}
	if err := validateLabels(s.Labels); err != nil {
		return err
	}
	if len(s.Processes) > 100000 {
		return fmt.Errorf("%d processes: want at most 100000", len(s.Processes))
	}
	for _, p := range s.Processes {
		if _, err := uuid.Parse(p.ID); err != nil {
			return fmt.Errorf("process id %q: want a UUID", api.Clip(p.ID))
		}
	}
	return nil
}
