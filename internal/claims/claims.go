// Package claims keeps what the kilnds of one host claim of what they share (egress ranges, windows of host uids): a directory of files, one per kilnd instance, each locked while its kilnd runs.
package claims

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is a directory of claims, locked: one kilnd at a time reads the
// others' claims, decides and writes its own. Close unlocks it.
type Dir struct {
	path string
	lock *os.File
}

// Open makes the directory if it is missing and takes its lock, waiting
// for a kilnd that holds it.
func Open(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(path, ".lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return nil, fmt.Errorf("claims: lock %s: %w", path, err)
	}
	return &Dir{path: path, lock: lock}, nil
}

// Close unlocks the directory.
func (d *Dir) Close() error { return d.lock.Close() }

// A Claim is one kilnd instance's file.
type Claim struct {
	// Name is the instance's; Data the file's content.
	Name string
	Data []byte
	path string
}

// Held says whether the kilnd that wrote the claim still runs: it holds a
// shared lock on the file (Write), so an exclusive one is refused.
func (c Claim) Held() bool {
	f, err := os.Open(c.path)
	if err != nil {
		return false
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
}

// List reads every claim in the directory.
func (d *Dir) List() ([]Claim, error) {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	var out []Claim
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(d.path, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone since, or not a file
		}
		out = append(out, Claim{Name: name, Data: b, path: path})
	}
	return out, nil
}

// Remove forgets a claim that no longer holds.
func (d *Dir) Remove(c Claim) { os.Remove(c.path) }

// Write records instance name's claim, v as JSON (a temporary file
// renamed over the last one), and returns the file open, with the shared
// lock that tells the other kilnds this one runs, until it is closed. The
// file stays, for the instance's next start.
func (d *Dir) Write(name string, v any) (*os.File, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(d.path, name+".json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("claims: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("claims: lock %s: %w", path, err)
	}
	return f, nil
}
