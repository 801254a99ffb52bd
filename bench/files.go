package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandkiln/sandkiln/internal/daemon"
)

// The files section: one big file and a tree of small ones, into a
// sandbox and out of it through kilnd, beside the same copy on the host.
const (
	filesBig       = 1 << 30
	filesSmall     = 10000
	filesSmallSize = 1 << 10
	targetFiles    = 0.5 // of the host's copy
)

type filesResult struct {
	big, small int64 // bytes of the big file; number of small files
	reps       []filesRep
	skipped    string
}

// filesRep is one repetition: each copy's seconds.
type filesRep struct {
	hostBig, upBig, downBig    float64 // cp of the file on the host; PUT; GET
	hostTree, upTree, downTree float64 // tar | tar on the host; tar into PUT archive; GET archive into tar
}

// measureFiles copies the big file and the tree into a sandbox and back,
// reps times, interleaved with the host's copies of the same.
// Long because a benchmark reads best as its steps in the order they run.
func measureFiles(ctx context.Context, cfg config) (*filesResult, error) {
	scale := max(1, cfg.kilndScale)
	res := &filesResult{big: filesBig / int64(scale), small: int64(filesSmall / scale)}
	if os.Geteuid() != 0 {
		res.skipped = "kilnd needs root"
		return res, nil
	}
	work, err := os.MkdirTemp("", "sandkiln-bench-files-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	state := filepath.Join(work, "state")
	k, c, err := startKilnd(state)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	defer c.http.CloseIdleConnections()
	var sb daemon.Info
	if err := c.call(ctx, "POST", "/sandboxes", map[string]any{}, &sb); err != nil {
		return nil, err
	}
	big := filepath.Join(work, "big")
	if err := writeRandomish(big, res.big); err != nil {
		return nil, err
	}
	tree := filepath.Join(work, "tree")
	for i := range res.small {
		dir := filepath.Join(tree, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), []byte(strings.Repeat("x", filesSmallSize)), 0o644); err != nil {
			return nil, err
		}
	}
	files := "/sandboxes/" + sb.ID + "/files/workspace/"
	for rep := range cfg.reps {
		var r filesRep
		out := filepath.Join(work, "out")
		os.RemoveAll(out)
		if r.hostBig, err = timed(func() error { return exec.CommandContext(ctx, "cp", big, out).Run() }); err != nil {
			return nil, fmt.Errorf("cp: %w", err)
		}
		os.Remove(out)
		if r.upBig, err = timed(func() error {
			f, err := os.Open(big)
			if err != nil {
				return err
			}
			defer f.Close()
			return c.stream(ctx, "PUT", files+"big"+strconv.Itoa(rep), f, nil)
		}); err != nil {
			return nil, fmt.Errorf("upload: %w", err)
		}
		if r.downBig, err = timed(func() error {
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			defer f.Close()
			return c.stream(ctx, "GET", files+"big"+strconv.Itoa(rep), nil, f)
		}); err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		if fi, err := os.Stat(out); err != nil || fi.Size() != res.big {
			return nil, fmt.Errorf("download: %v bytes of %d (%w)", fi.Size(), res.big, err)
		}
		os.Remove(out)
		// A new file each rep, the last one removed: freeing a gigabyte
		// on the sandbox's disk is not the next upload's cost.
		if err := c.stream(ctx, "DELETE", files+"big"+strconv.Itoa(rep), nil, nil); err != nil {
			return nil, err
		}
		os.MkdirAll(out, 0o755)
		if r.hostTree, err = timed(func() error {
			return exec.CommandContext(ctx, "sh", "-c", "tar -C "+work+" -c tree | tar -C "+out+" -x").Run()
		}); err != nil {
			return nil, fmt.Errorf("tar | tar: %w", err)
		}
		os.RemoveAll(out)
		os.MkdirAll(out, 0o755)
		if r.upTree, err = timed(func() error {
			tar := exec.CommandContext(ctx, "tar", "-C", work, "-c", "tree")
			stdout, err := tar.StdoutPipe()
			if err != nil {
				return err
			}
			if err := tar.Start(); err != nil {
				return err
			}
			err = c.stream(ctx, "PUT", "/sandboxes/"+sb.ID+"/archive?path=/workspace", stdout, nil)
			if werr := tar.Wait(); err == nil {
				err = werr
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("upload a tree: %w", err)
		}
		if r.downTree, err = timed(func() error {
			tar := exec.CommandContext(ctx, "tar", "-C", out, "-x")
			stdin, err := tar.StdinPipe()
			if err != nil {
				return err
			}
			if err := tar.Start(); err != nil {
				return err
			}
			err = c.stream(ctx, "GET", "/sandboxes/"+sb.ID+"/archive?path=/workspace/tree", nil, stdin)
			stdin.Close()
			if werr := tar.Wait(); err == nil {
				err = werr
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("download a tree: %w", err)
		}
		if n, _ := filepath.Glob(filepath.Join(out, "tree", "*", "f*")); int64(len(n)) != res.small {
			return nil, fmt.Errorf("download a tree: %d files of %d", len(n), res.small)
		}
		os.RemoveAll(out)
		res.reps = append(res.reps, r)
		fmt.Fprintf(cfg.progress, "files: rep %d/%d: %s file: cp %.3f s, up %.3f s, down %.3f s; %d files: tar|tar %.3f s, up %.3f s, down %.3f s\n",
			rep+1, cfg.reps, bytesText(res.big), r.hostBig, r.upBig, r.downBig, res.small, r.hostTree, r.upTree, r.downTree)
	}
	return res, c.call(ctx, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", nil, nil)
}

// writeRandomish writes n bytes that no layer below compresses or skips.
func writeRandomish(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i*7 + i>>8)
	}
	for left := n; left > 0; left -= int64(len(block)) {
		block[0]++
		if _, err := f.Write(block[:min(int64(len(block)), left)]); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// timed times f, after writing back what earlier copies left dirty: the
// host's page cache flushing a gigabyte is not the next copy's cost.
func timed(f func() error) (float64, error) {
	syscall.Sync()
	start := time.Now()
	err := f()
	return time.Since(start).Seconds(), err
}

// stream sends body (if any) to kilnd and copies the answer to out (if
// any), failing on an error status.
func (c client) stream(ctx context.Context, method, path string, body io.Reader, out io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://kilnd"+path, body)
	if err != nil {
		return err
	}
	// A file's length, as curl -T sends it (else the body is chunked).
	if f, ok := body.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			req.ContentLength = fi.Size()
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out == nil {
		out = io.Discard
	}
	// As a client that reads in large writes does (io.Copy into a file
	// goes 32 KiB at a time).
	_, err = io.CopyBuffer(struct{ io.Writer }{out}, resp.Body, make([]byte, 1<<20))
	return err
}

func writeFiles(b *strings.Builder, f *filesResult) {
	b.WriteString("## Files in and out of a sandbox\n\n")
	if f.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", f.skipped)
		return
	}
	fmt.Fprintf(b, "Through kilnd's unix socket to a sandbox's `/workspace` (on its disk): one file of %s, written\n"+
		"with `PUT …/files/workspace/big` and read back with `GET`, beside `cp` of the same file on the host;\n"+
		"and %d files of %s in %d directories, as a tar from `tar -c` into `PUT …/archive` and from\n"+
		"`GET …/archive` into `tar -x`, beside `tar -c | tar -x` on the host. Seconds, then what was moved per\n"+
		"second over the host's copy (higher is better).\n\n",
		bytesText(f.big), f.small, bytesText(filesSmallSize), (f.small+99)/100)
	b.WriteString("| rep | cp | upload | download | tar \\| tar | tree upload | tree download |\n|---|---:|---:|---:|---:|---:|---:|\n")
	var hb, ub, db, ht, ut, dt []float64
	for i, r := range f.reps {
		fmt.Fprintf(b, "| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", i+1, r.hostBig, r.upBig, r.downBig, r.hostTree, r.upTree, r.downTree)
		hb, ub, db = append(hb, r.hostBig), append(ub, r.upBig), append(db, r.downBig)
		ht, ut, dt = append(ht, r.hostTree), append(ut, r.upTree), append(dt, r.downTree)
	}
	b.WriteString("\n| ratio (host's time / ours) | of medians | target | result |\n|---|---:|---|---|\n")
	for _, row := range []struct {
		name       string
		host, ours []float64
	}{
		{"upload, one file", hb, ub}, {"download, one file", hb, db},
		{"upload, a tree", ht, ut}, {"download, a tree", ht, dt},
	} {
		ratio := median(row.host) / median(row.ours)
		fmt.Fprintf(b, "| %s | %.3f | ≥ %.2f | %s |\n", row.name, ratio, targetFiles, verdict(ratio >= targetFiles))
	}
	b.WriteString("\n")
}
