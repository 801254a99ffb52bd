package files

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// member is an archive member and its content.
type member struct {
	h    tar.Header
	body string
}

// tarOf writes an archive of ms with archive/tar.
func tarOf(t *testing.T, ms ...member) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, m := range ms {
		h := m.h
		if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeCont {
			h.Size = int64(len(m.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, m.body); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// sparseTar is an archive of one real GNU sparse file (type 'S'), 8 KiB
// of which the 512 bytes at 4 KiB are data and the rest holes. Go's
// writer writes the header's type and no sparse map, so the map and the
// real size are written into the header after it, as GNU tar lays them
// out, and the checksum made again.
func sparseTar(t *testing.T, name string) []byte {
	t.Helper()
	b := tarOf(t, member{tar.Header{Name: name, Typeflag: tar.TypeGNUSparse, Mode: 0o644, Size: 512, Format: tar.FormatGNU}, strings.Repeat("d", 512)})
	blk := b[:512]
	octal := func(off, size int, v int64) { copy(blk[off:off+size], fmt.Sprintf("%0*o\x00", size-1, v)) }
	octal(386, 12, 4096) // sparse[0].offset
	octal(398, 12, 512)  // sparse[0].numbytes
	octal(483, 12, 8192) // realsize
	copy(blk[148:156], "        ")
	sum := 0
	for _, c := range blk {
		sum += int(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
	// Go's reader takes it for what it is.
	tr := tar.NewReader(bytes.NewReader(b))
	h, err := tr.Next()
	if err != nil || h.Typeflag != tar.TypeGNUSparse || h.Size != 8192 {
		t.Fatalf("the sparse archive reads as %+v, %v", h, err)
	}
	if data, err := io.ReadAll(tr); err != nil || len(bytes.Trim(data, "\x00")) != 512 {
		t.Fatalf("the sparse file's data: %d bytes, %v", len(bytes.Trim(data, "\x00")), err)
	}
	return b
}

// paxSparse is an archive of one file marked sparse by GNU's PAX
// records. archive/tar drops such records from what it writes, so a
// comment record of the same length is written and made one in the
// bytes.
func paxSparse(t *testing.T, name string) []byte {
	t.Helper()
	b := tarOf(t, member{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"comment": "1234567890"}}, "data"})
	i := bytes.Index(b, []byte("comment=1234567890\n"))
	if i < 0 {
		t.Fatal("no comment record")
	}
	copy(b[i:], "GNU.sparse.major=1\n")
	if h, err := tar.NewReader(bytes.NewReader(b)).Next(); err != nil || h.PAXRecords["GNU.sparse.major"] != "1" {
		t.Fatalf("the PAX sparse archive reads as %+v, %v", h, err)
	}
	return b
}

// cat joins archives into one: each one's end mark (two zero blocks, as
// archive/tar writes it) but the last's goes.
func cat(archives ...[]byte) []byte {
	var b []byte
	for i, a := range archives {
		if i < len(archives)-1 {
			a = a[:len(a)-1024]
		}
		b = append(b, a...)
	}
	return b
}

// extract PUTs archive into dir, returning the answer.
func (a *agent) extract(t *testing.T, dir string, archive []byte) (int, string) {
	t.Helper()
	return do(t, "PUT", a.url("direct", "/archive?path="+url.QueryEscape(dir)), bytes.NewReader(archive))
}

func isStage(name string) bool { return strings.HasPrefix(name, stagePrefix) }

// snapshot describes everything under dir: each entry's type, mode,
// size, content or link, for comparing before and after.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	s := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil // its time is the staging directory's too
		}
		d := fmt.Sprintf("%v %d", fi.Mode(), fi.ModTime().UnixNano())
		switch {
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			d += " " + string(b)
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			d += " -> " + l
		}
		s[rel] = d
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestExtract: an archive's files, directories and links are extracted
// with their modes (setuid dropped) and times, merged into a directory
// that exists (what else it holds kept, a file it holds replaced), and
// read back as they went in; nothing staged stays.
func TestExtract(t *testing.T) {
	a := newAgent(t)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "proj"), 0o755)
	os.WriteFile(filepath.Join(dir, "proj", "keep.txt"), []byte("kept"), 0o600)
	os.WriteFile(filepath.Join(dir, "proj", "main.go"), []byte("old"), 0o600)
	t1 := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	t2, t3 := t1.Add(time.Hour), t1.Add(2*time.Hour)
	in := tarOf(t,
		member{tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "a commit"}}, ""},
		member{tar.Header{Name: "proj/", Typeflag: tar.TypeDir, Mode: 0o750, ModTime: t1}, ""},
		member{tar.Header{Name: "proj/main.go", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: t2}, "package main\n"},
		member{tar.Header{Name: "proj/run.sh", Typeflag: tar.TypeReg, Mode: 0o4755, ModTime: t2}, "#!/bin/sh\n"},
		member{tar.Header{Name: "proj/sub/", Typeflag: tar.TypeDir, Mode: 0o700, ModTime: t3}, ""},
		member{tar.Header{Name: "proj/sub/deep.txt", Typeflag: tar.TypeReg, Mode: 0o640, ModTime: t3}, "deep"},
		member{tar.Header{Name: "proj/latest", Typeflag: tar.TypeSymlink, Linkname: "main.go"}, ""},
		member{tar.Header{Name: "proj/sub/up", Typeflag: tar.TypeSymlink, Linkname: "../run.sh"}, ""},
		member{tar.Header{Name: "proj/hard", Typeflag: tar.TypeLink, Linkname: "proj/main.go"}, ""},
		member{tar.Header{Name: "proj/kept-too", Typeflag: tar.TypeLink, Linkname: "proj/keep.txt"}, ""},
		member{tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: t1}, ""},
	)
	if code, b := a.extract(t, dir, in); code != 200 {
		t.Fatalf("extract: %d %s", code, b)
	}
	got := map[string]string{}
	for _, p := range []string{"proj", "proj/keep.txt", "proj/main.go", "proj/run.sh", "proj/sub", "proj/sub/deep.txt", "proj/latest", "proj/sub/up", "proj/hard", "tmp"} {
		full := filepath.Join(dir, p)
		fi, err := os.Lstat(full)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		d := owner(t, full)
		switch {
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(full)
			d += fmt.Sprintf(" %q", b)
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(full)
			d += " -> " + l
		}
		if fi.Mode()&os.ModeSymlink == 0 && p != "proj/keep.txt" {
			d += " " + fi.ModTime().UTC().Format(time.TimeOnly)
		}
		got[p] = d
	}
	want := map[string]string{
		"proj":              "0:0 0750 03:04:05",
		"proj/keep.txt":     `0:0 0600 "kept"`,
		"proj/main.go":      `0:0 0644 "package main\n" 04:04:05`,
		"proj/run.sh":       `0:0 0755 "#!/bin/sh\n" 04:04:05`,
		"proj/sub":          "0:0 0700 05:04:05",
		"proj/sub/deep.txt": `0:0 0640 "deep" 05:04:05`,
		"proj/latest":       "0:0 0777 -> main.go",
		"proj/sub/up":       "0:0 0777 -> ../run.sh",
		"proj/hard":         `0:0 0644 "package main\n" 04:04:05`,
		"tmp":               "0:0 1777 03:04:05",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("extracted (-want +got):\n%s", diff)
	}
	// Hard links: to a member, and to a file the directory had.
	for _, l := range [][2]string{{"main.go", "hard"}, {"keep.txt", "kept-too"}} {
		var a1, a2 syscall.Stat_t
		syscall.Stat(filepath.Join(dir, "proj", l[0]), &a1)
		syscall.Stat(filepath.Join(dir, "proj", l[1]), &a2)
		if a1.Ino != a2.Ino {
			t.Errorf("%s is not a hard link to %s", l[1], l[0])
		}
	}
	if diff := cmp.Diff([]string{"proj", "tmp"}, names(t, dir)); diff != "" {
		t.Errorf("left in the directory (-want +got):\n%s", diff)
	}
	// And back: what went in comes out, its modes and times with it.
	code, out := do(t, "GET", a.url("direct", "/archive?path="+url.QueryEscape(filepath.Join(dir, "proj", "sub"))), nil)
	if code != 200 {
		t.Fatalf("archive: %d %s", code, out)
	}
	tr := tar.NewReader(strings.NewReader(out))
	var back []string
	for {
		h, err := tr.Next()
		if err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
		body, _ := io.ReadAll(tr)
		back = append(back, fmt.Sprintf("%s %c %04o %s %q %s", h.Name, h.Typeflag, h.Mode, h.ModTime.UTC().Format(time.TimeOnly), body, h.Linkname))
	}
	wantBack := []string{
		"sub/ 5 0700 05:04:05 \"\" ",
		"sub/deep.txt 0 0640 05:04:05 \"deep\" ",
	}
	if diff := cmp.Diff(wantBack, back[:2]); diff != "" || len(back) != 3 || !strings.HasPrefix(back[2], "sub/up 2 0777 ") || !strings.HasSuffix(back[2], "../run.sh") {
		t.Errorf("read back (-want +got):\n%s\n%q", diff, back)
	}
}

// TestExtractRefusesWhole: a member that is not a regular file, a
// directory or a link fails the whole archive, 400 naming it and its
// type, and nothing of the archive is written, not even what came before
// it; so does a link leading out (403).
func TestExtractRefusesWhole(t *testing.T) {
	a := newAgent(t)
	good := []member{
		{tar.Header{Name: "a.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "first"},
		{tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, ""},
		{tar.Header{Name: "d/b.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "second"},
	}
	for _, tc := range []struct {
		name    string
		archive func(t *testing.T) []byte
		want    int
		says    string
	}{
		{"a GNU sparse file, then a FIFO", func(t *testing.T) []byte {
			fifo := tarOf(t, member{tar.Header{Name: "d/pipe", Typeflag: tar.TypeFifo, Mode: 0o644}, ""})
			return cat(tarOf(t, good...), sparseTar(t, "d/disk.img"), fifo)
		}, 400, `archive member "d/disk.img" is a sparse file (GNU's type 'S')`},
		{"a sparse file in PAX records", func(t *testing.T) []byte {
			return cat(tarOf(t, good...), paxSparse(t, "d/sparse"))
		}, 400, `archive member "d/sparse" is a sparse file (in GNU's PAX format)`},
		{"a contiguous file", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "d/cont", Typeflag: tar.TypeCont, Mode: 0o644}, "contiguous"})...)
		}, 400, `archive member "d/cont" is a contiguous file (type '7')`},
		{"a FIFO", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "d/pipe", Typeflag: tar.TypeFifo, Mode: 0o644}, ""})...)
		}, 400, `archive member "d/pipe" is a FIFO (type '6')`},
		{"a character device", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, ""})...)
		}, 400, `archive member "null" is a character device (type '3')`},
		{"a block device", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 8}, ""})...)
		}, 400, `archive member "sda" is a block device (type '4')`},
		{"a type unknown", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "label", Typeflag: 'V', Mode: 0o644}, ""})...)
		}, 400, `archive member "label" is of a type not extracted ('V')`},
		{"a symbolic link out", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "d/out", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}, ""})...)
		}, 403, `archive member "d/out": a link to "../../etc" leads out of`},
		{"an absolute symbolic link", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, ""})...)
		}, 403, `a link to "/etc" leads out of`},
		{"a hard link out", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "passwd", Typeflag: tar.TypeLink, Linkname: "../etc/passwd"}, ""})...)
		}, 403, `a hard link to "../etc/passwd" leads out of`},
		{"a hard link to nothing", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "d/b2", Typeflag: tar.TypeLink, Linkname: "missing"}, ""})...)
		}, 404, `archive member "d/b2"`},
		{"a name that climbs", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "d/../../x", Typeflag: tar.TypeReg, Mode: 0o644}, "x"})...)
		}, 403, `archive member "d/../../x": ".." is refused`},
		{"a file where the archive made a directory", func(t *testing.T) []byte {
			return tarOf(t, append(good, member{tar.Header{Name: "d/b.txt/c", Typeflag: tar.TypeReg, Mode: 0o644}, "c"})...)
		}, 412, `archive member "d/b.txt/c"`},
		{"a truncated archive", func(t *testing.T) []byte {
			b := tarOf(t, append(good, member{tar.Header{Name: "d/c.bin", Typeflag: tar.TypeReg, Mode: 0o644}, strings.Repeat("c", 4096)})...)
			return b[:len(b)-1024-2048]
		}, 400, `the archive broke off in member "d/c.bin"`},
		{"garbage", func(t *testing.T) []byte {
			return cat(tarOf(t, good...), bytes.Repeat([]byte("not a header "), 100))
		}, 400, "the archive could not be read after 3 members"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "a.txt"), []byte("there before"), 0o644)
			before := snapshot(t, dir)
			code, b := a.extract(t, dir, tc.archive(t))
			if code != tc.want || !strings.Contains(message(b), tc.says) {
				t.Errorf("%d %s, want %d saying %q", code, b, tc.want, tc.says)
			}
			if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
				t.Errorf("the directory changed (-before +after):\n%s", diff)
			}
		})
	}
}

// TestExtractConflicts: a member that would put a directory where a
// file is, or the reverse, fails the whole archive before anything is
// moved in.
func TestExtractConflicts(t *testing.T) {
	a := newAgent(t)
	for _, tc := range []struct {
		name string
		ms   []member
		says string
	}{
		{"a directory over a file", []member{
			{tar.Header{Name: "new.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "new"},
			{tar.Header{Name: "file/", Typeflag: tar.TypeDir, Mode: 0o755}, ""},
			{tar.Header{Name: "file/in", Typeflag: tar.TypeReg, Mode: 0o644}, "in"},
		}, `archive member "file" is a directory and`},
		{"a file over a directory", []member{
			{tar.Header{Name: "new.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "new"},
			{tar.Header{Name: "sub/dir", Typeflag: tar.TypeReg, Mode: 0o644}, "file"},
		}, `archive member "sub/dir" is not a directory and`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "file"), []byte("a file"), 0o644)
			os.MkdirAll(filepath.Join(dir, "sub", "dir", "in"), 0o755)
			before := snapshot(t, dir)
			code, b := a.extract(t, dir, tarOf(t, tc.ms...))
			if code != 412 || !strings.Contains(message(b), tc.says) {
				t.Errorf("%d %s, want 412 saying %q", code, b, tc.says)
			}
			if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
				t.Errorf("the directory changed (-before +after):\n%s", diff)
			}
		})
	}
}

// TestExtractCut: an archive whose connection is closed before the body
// ends is not extracted, even when what came is a whole archive up to a
// member's end (the archive's own end mark missing): the staging
// directory goes, and the directory is as it was.
func TestExtractCut(t *testing.T) {
	a := newAgent(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("there before"), 0o644)
	before := snapshot(t, dir)
	whole := tarOf(t,
		member{tar.Header{Name: "a.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "from the archive"},
		member{tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644}, strings.Repeat("b", 256<<10)},
	)
	for _, tc := range []struct {
		name string
		sent []byte
	}{
		{"within a member", whole[:len(whole)/2]},
		{"at a member's end", whole[:len(whole)-1024]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := watchDir(t, dir)
			c := rawPut(t, a.addr("direct"), "/archive?path="+url.QueryEscape(dir), len(whole)+4096, tc.sent)
			stage := ev.waitFor(t, unix.IN_CREATE, isStage)
			c.Close()
			ev.waitFor(t, unix.IN_DELETE, func(n string) bool { return n == stage })
			if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
				t.Errorf("the directory changed (-before +after):\n%s", diff)
			}
		})
	}
}

// TestExtractNoSpace: an archive past what the disk holds is answered
// 507, and nothing of it stays.
func TestExtractNoSpace(t *testing.T) {
	a := newAgent(t)
	dir := mountSmall(t, 1<<20)
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("there before"), 0o644)
	before := snapshot(t, dir)
	code, b := a.extract(t, dir, tarOf(t,
		member{tar.Header{Name: "a.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "from the archive"},
		member{tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644}, strings.Repeat("b", 4<<20)},
	))
	if code != 507 || !strings.Contains(message(b), `archive member "big": the sandbox's disk is full`) {
		t.Errorf("4 MiB on a 1 MiB disk: %d %s", code, b)
	}
	if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
		t.Errorf("the disk changed (-before +after):\n%s", diff)
	}
}
