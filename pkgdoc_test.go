package sandkiln_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// Every package says what it is for in exactly one package comment, so the
// reader of any folder starts from its purpose.
func TestEveryPackageHasOneDocComment(t *testing.T) {
	dirs := map[string]bool{}
	filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata" || d.Name() == "tools") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if len(dirs) == 0 {
		t.Fatal("found no packages")
	}
	for dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		var name string
		var docs []string
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			name = f.Name.Name
			if f.Doc == nil {
				continue
			}
			docs = append(docs, file)
			want := "Package " + name + " "
			if name == "main" {
				want = "Command "
			}
			if text := f.Doc.Text(); !strings.HasPrefix(text, want) {
				t.Errorf("%s: package comment should start %q: %q", file, want, text)
			}
		}
		if len(docs) != 1 {
			t.Errorf("%s: package %s has %d package comments %v, want one", dir, name, len(docs), docs)
		}
	}
}
