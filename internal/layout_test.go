// The house's rules, held against the code: every package under internal/
// says what role it plays, and the host's side and the guest's side of a
// sandbox never import each other.
package layout_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/sandkiln/sandkiln/"

// pkg is a package's doc comment and what its non-test files import.
type pkg struct {
	name, doc string
	imports   []string
}

// packages reads every package of the module under dir ("" is the
// module's root), by its import path.
func packages(t *testing.T, root string) map[string]*pkg {
	t.Helper()
	pkgs := map[string]*pkg{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		p := pkgs[module+filepath.ToSlash(rel)]
		if p == nil {
			p = &pkg{name: f.Name.Name}
			pkgs[module+filepath.ToSlash(rel)] = p
		}
		if f.Doc != nil {
			p.doc += f.Doc.Text()
		}
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if !slices.Contains(p.imports, path) {
				p.imports = append(p.imports, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// under reports whether the import path is the package dir of the module
// or one below it.
func under(path, dir string) bool {
	dir = module + dir
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// TestEveryPackageSaysItsRole: a newcomer finds what a room is for at its
// door: every package under internal/ has a doc comment that begins as Go
// documents a package ("Package name ...", or "Command name ..." for a
// program).
func TestEveryPackageSaysItsRole(t *testing.T) {
	for path, p := range packages(t, "..") {
		if !under(path, "internal") {
			continue
		}
		want := "Package " + p.name + " "
		if p.name == "main" {
			want = "Command " + path[strings.LastIndex(path, "/")+1:] + " "
		}
		if !strings.HasPrefix(p.doc, want) {
			t.Errorf("%s: no doc comment saying its role (want one beginning %q)", path, want)
		}
	}
}

// TestHostAndGuestApart: what runs inside a sandbox (internal/guest and
// below) imports nothing of kilnd's side (internal/daemon,
// internal/sandbox), and kilnd's side nothing of the guest's: they meet
// only in internal/handoff, and the binary's roles in internal/roles.
func TestHostAndGuestApart(t *testing.T) {
	pkgs := packages(t, "..")
	if _, ok := pkgs[module+"internal/guest"]; !ok {
		t.Fatal("no internal/guest: the test reads the wrong tree")
	}
	host := []string{"internal/daemon", "internal/sandbox"}
	for path, p := range pkgs {
		for _, im := range p.imports {
			switch {
			case under(path, "internal/guest") && slices.ContainsFunc(host, func(h string) bool { return under(im, h) }):
				t.Errorf("%s, inside a sandbox, imports %s, kilnd's side", path, im)
			case slices.ContainsFunc(host, func(h string) bool { return under(path, h) }) && under(im, "internal/guest"):
				t.Errorf("%s, kilnd's side, imports %s, the guest's", path, im)
			case under(path, "internal/handoff") && strings.HasPrefix(im, module) && !under(im, "api"):
				t.Errorf("%s, the contract between the two, imports %s", path, im)
			}
		}
	}
}

func TestMain(m *testing.M) {
	// The tree is read from here: the module's root is one up.
	if _, err := os.Stat("../go.mod"); err != nil {
		panic("layout_test: not run from internal/")
	}
	os.Exit(m.Run())
}
