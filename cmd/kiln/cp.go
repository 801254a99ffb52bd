package main

import (
	"archive/tar"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// location is one side of kiln cp: a sandbox's path, a local path, or "-".
type location struct {
	sandbox, path string
}

// parseLocation reads SANDBOX:PATH, or a local path (one starting with "/"
// or "." is always local, whatever colons it holds).
func parseLocation(s string) location {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") || s == "-" {
		return location{path: s}
	}
	if sb, p, ok := strings.Cut(s, ":"); ok && sb != "" && !strings.Contains(sb, "/") {
		return location{sandbox: sb, path: p}
	}
	return location{path: s}
}

func (c *cli) cpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SANDBOX:SRC DEST|- | SRC|- SANDBOX:DEST",
		Short: "Copy files and directories between a sandbox and this host",
		Long: `Copy files and directories between a sandbox and this host, as docker cp does.

A directory is copied with everything in it. Copied into an existing directory, SRC keeps its
name there; to a path that does not exist, it takes that name. "-" is a tar archive on standard
input (extracted into the sandbox's directory DEST) or output (of the sandbox's SRC).

In the sandbox, files are written by its root and belong to it; paths are the sandbox's own
(symbolic links resolve inside it). An archive's absolute names, "..", device nodes and links
that lead out of the destination are refused, on either side. On this host, what is copied
belongs to the user running kiln.`,
		Example: `  kiln cp ./project $SB:/workspace            # /workspace/project
  kiln cp $SB:/workspace/dist ./dist           # the sandbox's dist, here
  kiln cp $SB:/workspace/report.txt -          # a tar of it on standard output
  tar -C src -c . | kiln cp - $SB:/workspace    # a tar from standard input`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseLocation(args[0]), parseLocation(args[1])
			switch {
			case src.sandbox != "" && dst.sandbox != "":
				return errors.New("copying between two sandboxes is not supported: copy to this host first")
			case src.sandbox == "" && dst.sandbox == "":
				return errors.New("one of SRC and DEST must be SANDBOX:PATH")
			}
			return c.withClient(func(cl *client.Client) error {
				if src.sandbox != "" {
					return c.copyOut(cmd, cl.Handle(src.sandbox), src.path, dst.path)
				}
				return c.copyIn(cmd, cl.Handle(dst.sandbox), src.path, dst.path)
			})
		},
	}
}

// copyOut copies the sandbox's src to the local dst.
func (c *cli) copyOut(cmd *cobra.Command, sb *client.Sandbox, src, dst string) error {
	if !strings.HasPrefix(src, "/") {
		return fmt.Errorf("%q: a path in a sandbox is absolute", src)
	}
	rc, fi, err := sb.Archive(cmd.Context(), src)
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err := io.Copy(c.stdout, rc)
		return err
	}
	// Into an existing directory under src's name, or as dst itself.
	dir, rename := dst, ""
	st, err := os.Stat(dst)
	switch {
	case err == nil && st.IsDir():
	case err == nil && fi.Type == api.FileDir:
		return fmt.Errorf("cannot copy the directory %s to the file %s", src, dst)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	case strings.HasSuffix(dst, "/"):
		return fmt.Errorf("the directory %s does not exist", dst)
	default:
		dir, rename = filepath.Dir(dst), filepath.Base(dst)
	}
	n, err := extractLocal(dir, path.Base(src), rename, tar.NewReader(rc))
	if err != nil {
		return err
	}
	c.copied(n, dst)
	return nil
}

// copied says what a copy wrote, on stderr (stdout may be the tar): a
// line, or with --json {"bytes", "to"}.
func (c *cli) copied(n int64, dst string) {
	if c.json {
		json.NewEncoder(c.stderr).Encode(struct {
			Bytes int64  `json:"bytes"`
			To    string `json:"to"`
		}{n, dst})
		return
	}
	fmt.Fprintf(c.stderr, "copied %s to %s\n", bytesText(n), dst)
}

// copyIn copies the local src (or a tar on stdin, for "-") to the
// sandbox's dst.
func (c *cli) copyIn(cmd *cobra.Command, sb *client.Sandbox, src, dst string) error {
	ctx := cmd.Context()
	if !strings.HasPrefix(dst, "/") {
		return fmt.Errorf("%q: a path in a sandbox is absolute", dst)
	}
	if src == "-" {
		return sb.Extract(ctx, dst, c.stdin)
	}
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	dir, name := dst, filepath.Base(src)
	fi, err := sb.Stat(ctx, dst)
	switch {
	case err == nil && fi.Type == api.FileDir:
	case err == nil && st.IsDir():
		return fmt.Errorf("cannot copy the directory %s to the file %s", src, dst)
	case err != nil && !client.IsNotFound(err):
		return err
	case strings.HasSuffix(dst, "/"):
		return fmt.Errorf("the directory %s does not exist in the sandbox", dst)
	default:
		dir, name = path.Dir(dst), path.Base(dst)
	}
	pr, pw := io.Pipe()
	written := make(chan int64, 1)
	go func() {
		n, err := writeLocalTar(pw, src, name)
		pw.CloseWithError(err)
		written <- n
	}()
	err = sb.Extract(ctx, dir, pr)
	pr.CloseWithError(errors.New("the copy ended"))
	n := <-written
	if err != nil {
		return err
	}
	c.copied(n, sb.ID+":"+dst)
	return nil
}

// writeLocalTar writes a tar of the local src, its top entry named name,
// and returns the bytes of file content written.
func writeLocalTar(w io.Writer, src, name string) (int64, error) {
	tw := tar.NewWriter(w)
	var total int64
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil // no content to move
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		h.Name = path.Join(name, filepath.ToSlash(rel))
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			n, err := io.CopyBuffer(tw, struct{ io.Reader }{io.LimitReader(f, h.Size)}, copyBuf())
			total += n
			if err == nil && n < h.Size {
				err = fmt.Errorf("%s shrank while it was copied", p)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return total, err
	}
	return total, tw.Close()
}

// extractLocal extracts tr into the local directory dir, the archive's
// top entry top renamed to rename when set, and returns the bytes of file
// content written. The archive comes from a sandbox: every entry must be
// top or below it, and nothing in it may lead out of what it makes
// (dir/top, or dir/rename). Directories get their modes once their
// contents are in.
func extractLocal(dir, top, rename string, tr *tar.Reader) (int64, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	x := &localExtract{root: root, dir: dir, top: top, made: cmp.Or(rename, top)}
	defer x.setDirModes()
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return x.total, nil
		}
		if err != nil {
			return x.total, fmt.Errorf("the sandbox's archive: %w", err)
		}
		if err := x.entry(h, tr); err != nil {
			return x.total, err
		}
	}
}

// localExtract is one extraction into a local directory (extractLocal):
// the root it may not leave, what it makes there (made, the archive's top
// renamed), the bytes of file content written so far, and the
// directories made, whose modes are set once their contents are in.
type localExtract struct {
	root           *os.Root
	dir, top, made string
	total          int64
	dirs           []dirMode
}

// dirMode is a directory extracted and the mode it is to have.
type dirMode struct {
	name string
	mode fs.FileMode
}

// setDirModes gives the directories made their modes, the deepest first:
// a directory's own mode may close it to the setting of those below it.
func (x *localExtract) setDirModes() {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		x.root.Chmod(x.dirs[i].name, x.dirs[i].mode)
	}
}

// entry extracts the archive's entry h, whose content tr reads.
func (x *localExtract) entry(h *tar.Header, tr *tar.Reader) error {
	name, err := x.place(h.Name)
	if err != nil {
		return err
	}
	mode := fs.FileMode(h.Mode) & 0o777
	switch h.Typeflag {
	case tar.TypeDir:
		if err := x.root.MkdirAll(name, 0o700); err != nil {
			return err
		}
		x.dirs = append(x.dirs, dirMode{name, mode | 0o700})
	case tar.TypeReg:
		return x.file(name, mode, h, tr)
	case tar.TypeSymlink:
		// Within what the copy makes: never the top itself, never
		// out of it.
		target := path.Join(path.Dir(name), h.Linkname)
		if name == x.made || strings.HasPrefix(h.Linkname, "/") || !strings.HasPrefix(target+"/", x.made+"/") {
			return fmt.Errorf("the sandbox's archive: the link %s to %s leads out of %s", h.Name, h.Linkname, filepath.Join(x.dir, x.made))
		}
		x.root.Remove(name)
		return x.root.Symlink(h.Linkname, name)
	default:
		// Devices, FIFOs and hard links are not made on this host.
	}
	return nil
}

// place is where the entry the archive names entry goes, relative to the
// directory: the top, or below it, renamed to made. Any other entry the
// archive has no business holding.
func (x *localExtract) place(entry string) (string, error) {
	name := path.Clean(entry)
	rest, under := strings.CutPrefix(name, x.top+"/")
	switch {
	case strings.HasPrefix(entry, "/") || name == ".." || strings.HasPrefix(name, "../"):
		return "", fmt.Errorf("the sandbox's archive: %q leads out of %s", entry, filepath.Join(x.dir, x.made))
	case name == x.top:
		return x.made, nil
	case under:
		return path.Join(x.made, rest), nil
	default:
		return "", fmt.Errorf("the sandbox's archive: %q is not in %s", entry, x.top)
	}
}

// file writes a regular file's content from tr at name, a new file with
// mode: whatever was there, a link included, is replaced, never written
// through.
func (x *localExtract) file(name string, mode fs.FileMode, h *tar.Header, tr *tar.Reader) error {
	if err := x.root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	x.root.Remove(name)
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, tr, copyBuf())
	x.total += n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	x.root.Chtimes(name, h.AccessTime, h.ModTime)
	return nil
}

// bytesText is n bytes as people read them: 512 B, 2.0 KiB, 1.5 GiB.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

func (c *cli) watchCmd() *cobra.Command {
	var id string
	var after uint64
	cmd := &cobra.Command{
		Use:   "watch SANDBOX DIR",
		Short: "Print the file events under a sandbox's directory as they happen",
		Long: `Print what happens under a sandbox's directory, and everything below it, as it happens: each
event's number, what it is (create, write, remove, rename) and its path. The first line names the
watch; --id and --after resume it from the last number seen, within 30 seconds of its last
watcher, and events it no longer holds are said as a gap with their count.`,
		Example: `  kiln watch $SB /workspace
  kiln watch $SB /workspace --id ID --after 42`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				w, err := cl.Handle(args[0]).WatchFiles(cmd.Context(), args[1], client.WatchOptions{ID: id, After: after})
				if err != nil {
					return err
				}
				defer w.Close()
				if !c.json {
					fmt.Fprintf(c.stderr, "watch %s of %s (events so far: %d)\n", w.ID, w.Dir, w.Seq)
				}
				for {
					e, err := w.Next()
					if err != nil {
						if cmd.Context().Err() != nil {
							return nil
						}
						return err
					}
					switch {
					case c.json:
						c.printJSON(e)
					case e.Type == "gap":
						fmt.Fprintf(c.stdout, "%d\tgap\t%d events lost\n", e.Seq, e.Lost)
					case e.Op == api.FileRenamed:
						fmt.Fprintf(c.stdout, "%d\t%s\t%s -> %s\n", e.Seq, e.Op, e.From, e.Path)
					default:
						fmt.Fprintf(c.stdout, "%d\t%s\t%s\n", e.Seq, e.Op, e.Path)
					}
				}
			})
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "resume the watch `ID`")
	cmd.Flags().Uint64Var(&after, "after", 0, "with --id, the last event `number` seen")
	return cmd
}

// copyBuf is a buffer for copying a file's content: large, as the
// kernel's pipes and sockets move bytes fastest in large writes (the
// writer's and reader's own ReadFrom and WriteTo are hidden, which would
// copy 32 KiB at a time).
func copyBuf() []byte { return make([]byte, 1<<20) }
