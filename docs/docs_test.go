// The documentation's examples, held against the code: every shell block
// marked runnable in README.md and docs/*.md is run against a real kilnd,
// so that an example cannot go on saying what no longer works, and every
// link between the documents leads somewhere.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/roles"
)

func TestMain(m *testing.M) {
	// kilnd re-executes this binary as each sandbox's agent.
	roles.PlayIfReexecuted()
	daemontest.NoRaceExitSleep()
	os.Exit(m.Run())
}

// marker is the info string of a block that is run. GitHub highlights a
// block by the info string's first word, so it shows as any sh block.
const marker = "sh runnable"

// block is a fenced code block of a document.
type block struct {
	file string // relative to the repository's root
	line int    // of the opening fence
	info string // the info string
	text string
}

// documents are README.md and every document in docs/, relative to the
// repository's root.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no documents in docs/ (%v)", err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, "docs/"+d)
	}
	return files
}

// blocks reads the fenced code blocks of a document, indented ones (in a
// list item) too, their indentation taken off.
func blocks(t *testing.T, file string) []block {
	t.Helper()
	f, err := os.Open(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []block
	var cur *block
	var indent string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if rest, ok := strings.CutPrefix(trimmed, "```"); ok {
				cur = &block{file: file, line: n, info: strings.TrimSpace(rest)}
				indent = line[:len(line)-len(trimmed)]
			}
			continue
		}
		if trimmed == "```" {
			out = append(out, *cur)
			cur = nil
			continue
		}
		cur.text += strings.TrimPrefix(line, indent) + "\n"
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: a code block that never ends", file, cur.line)
	}
	return out
}

// runnable is every runnable block of the documents.
func runnable(t *testing.T) []block {
	t.Helper()
	var out []block
	for _, file := range documents(t) {
		for _, b := range blocks(t, file) {
			if b.info == marker {
				out = append(out, b)
			} else if strings.Contains(b.info, "runnable") {
				t.Errorf("%s:%d: info string %q: a runnable block's is %q", b.file, b.line, b.info, marker)
			}
		}
	}
	return out
}

// TestRunnableBlocks runs each runnable block with bash -euo pipefail, in a
// directory of its own, with kiln on PATH and $KILN_STATE_DIR naming a
// kilnd this test serves. A block makes the sandboxes it uses; whatever it
// leaves is deleted after it.
func TestRunnableBlocks(t *testing.T) {
	bs := runnable(t)
	if len(bs) < 8 {
		t.Fatalf("%d runnable blocks: the documents should have at least 8", len(bs))
	}
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "kiln"), "./cmd/kiln")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kiln: %v\n%s", err, out)
	}
	k := kilnd(t)
	env := environ(k, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, b := range bs {
		t.Run(fmt.Sprintf("%s:%d", strings.TrimPrefix(b.file, "docs/"), b.line), func(t *testing.T) {
			for _, tool := range []string{"curl", "jq", "python3"} {
				if uses(b.text, tool) {
					if _, err := exec.LookPath(tool); err != nil {
						t.Skipf("the block uses %s, which is not installed", tool)
					}
				}
			}
			defer func() {
				for _, s := range k.Daemon.List() {
					if err := k.Daemon.Delete(s.ID, true); err != nil {
						t.Errorf("deleting sandbox %s the block left: %v", s.ID, err)
					}
				}
			}()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.text)
			cmd.Dir = t.TempDir()
			cmd.Env = env
			cmd.Stdin = nil
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.WaitDelay = 5 * time.Second
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s:%d: %v\n--- block\n%s--- output\n%s", b.file, b.line, err, b.text, out.String())
			}
			t.Logf("output:\n%s", out.String())
		})
	}
}

// kilnd serves a state directory of the test's own, on its socket and, so
// that previews have a host and port to be named by, on TCP.
func kilnd(t *testing.T) *daemontest.Kilnd {
	t.Helper()
	return daemontest.StartT(t, "127.0.0.1:0")
}

// environ is this process's environment with $KILN_STATE_DIR naming k's
// state directory and nothing else of kiln's (kiln, the SDKs and curl
// find kilnd by its socket there), with set over the rest.
func environ(k *daemontest.Kilnd, set ...string) []string {
	env := append([]string{"KILN_STATE_DIR=" + k.State}, set...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "KILN_") && !slices.ContainsFunc(set, func(s string) bool { return strings.HasPrefix(s, name+"=") }) {
			env = append(env, kv)
		}
	}
	return env
}

// TestGoExample builds the README's Go example as a program of this module
// and runs it against a kilnd, as a user of the SDK would.
func TestGoExample(t *testing.T) {
	var example []string
	for _, b := range blocks(t, "README.md") {
		if b.info == "go" {
			example = append(example, b.text)
		}
	}
	if len(example) != 1 {
		t.Fatalf("the README has %d Go examples, want one", len(example))
	}
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// The program stands in a directory of the module that is not there,
	// by an overlay, so that it imports the SDK as it is in this tree.
	dir := t.TempDir()
	src, overlay, bin := filepath.Join(dir, "main.go"), filepath.Join(dir, "overlay.json"), filepath.Join(dir, "example")
	pkg := filepath.Join(root, "docs", "readme-example")
	if err := os.WriteFile(src, []byte(example[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	o, _ := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(pkg, "main.go"): src}})
	if err := os.WriteFile(overlay, o, 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-overlay", overlay, "-o", bin, "./docs/readme-example")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the README's Go example: %v\n%s", err, out)
	}
	k := kilnd(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, bin)
	run.Env = environ(k)
	out, err := run.CombinedOutput()
	if want := "line-1\nline-2\nline-3\nprocess exited with code 0\n"; err != nil || string(out) != want {
		t.Errorf("the README's Go example: %v, output %q, want %q", err, out, want)
	}
	if left := k.Daemon.List(); len(left) != 0 {
		t.Errorf("the README's Go example left %d sandboxes", len(left))
	}
}

// uses reports whether a shell block runs the command name.
func uses(text, name string) bool {
	return regexp.MustCompile(`(^|[\s|;&(])` + regexp.QuoteMeta(name) + `\s`).MatchString(text)
}

// TestLinks: every link from a document to a file of the repository names
// one that is there, and an anchor names one of the document's headings,
// as GitHub makes them.
func TestLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	files := append(documents(t), "CONTRIBUTING.md")
	for _, file := range files {
		text, err := os.ReadFile(filepath.Join("..", file))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(withoutCode(string(text)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			doc := file
			if path != "" {
				doc = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
				if _, err := os.Stat(filepath.Join("..", doc)); err != nil {
					t.Errorf("%s: link %s: no %s", file, target, doc)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(doc, ".md") {
				t.Errorf("%s: link %s: an anchor in a file that is not markdown", file, target)
				continue
			}
			if !slices.Contains(anchors(t, doc), anchor) {
				t.Errorf("%s: link %s: %s has no heading %q", file, target, doc, anchor)
			}
		}
	}
}

// withoutBlocks is a document without its code blocks, where a line that
// begins with # is no heading.
func withoutBlocks(text string) string {
	return regexp.MustCompile("(?ms)^ *```.*?^ *```").ReplaceAllString(text, "")
}

// withoutCode is a document without its code blocks and code spans, where
// brackets are not links.
func withoutCode(text string) string {
	return regexp.MustCompile("`[^`\n]*`").ReplaceAllString(withoutBlocks(text), "")
}

// anchors are the ids GitHub gives a document's headings: lower case,
// spaces as hyphens, punctuation but hyphens and underscores left out.
func anchors(t *testing.T, file string) []string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(withoutBlocks(string(text)), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		var id strings.Builder
		for _, r := range strings.TrimSpace(strings.TrimLeft(line, "#")) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				id.WriteRune(unicode.ToLower(r))
			case r == ' ':
				id.WriteRune('-')
			}
		}
		out = append(out, id.String())
	}
	return out
}
