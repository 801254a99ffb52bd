package api_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSDKsCallEveryOperation holds the three SDKs to the OpenAPI document
// through the table in docs/sdk-methods.md: every operation is a row (or
// several, one per method that calls it), every row's route is the
// document's, and every method a row names is in its SDK's source (Go's
// by its declarations; TypeScript's and Python's by their classes'
// methods, those of the classes they extend counted; Python's in both the
// synchronous class and its Async twin). A route added to kilnd and left
// out of an SDK fails here.
func TestSDKsCallEveryOperation(t *testing.T) {
	doc := loadOpenAPI(t)
	routes := map[string]string{} // operationId → "METHOD /path"
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			routes[op.OperationID] = method + " " + path
		}
	}
	rows := sdkTable(t)
	goM := goMethods(t, filepath.Join("..", "client"))
	tsM := classMethods(t, filepath.Join("..", "sdk", "typescript", "src"), ".ts", tsClass, tsMethod)
	pyM := classMethods(t, filepath.Join("..", "sdk", "python", "src", "sandkiln"), ".py", pyClass, pyMethod)

	seen := map[string]bool{}
	for _, r := range rows {
		op, _, _ := strings.Cut(r.op, " ")
		seen[op] = true
		route, ok := routes[op]
		if !ok {
			t.Errorf("%s: no operation %s in the document", r.op, op)
			continue
		}
		if route != r.route {
			t.Errorf("%s: the table says %s, the document %s", r.op, r.route, route)
		}
		if r.goName == "—" {
			if r.goName != r.ts || r.goName != r.py || r.by == "" {
				t.Errorf("%s: an operation no SDK calls has a dash in every SDK's column and says who calls it", r.op)
			}
			continue
		}
		if !goM[r.goName] {
			t.Errorf("%s: Go has no method %s", r.op, r.goName)
		}
		if !tsM.has(r.ts) {
			t.Errorf("%s: TypeScript has no method %s", r.op, r.ts)
		}
		typ, method, _ := strings.Cut(r.py, ".")
		for _, name := range []string{typ + "." + method, "Async" + typ + "." + method} {
			if !pyM.has(name) {
				t.Errorf("%s: Python has no method %s", r.op, name)
			}
		}
	}
	for op, route := range routes {
		if !seen[op] {
			t.Errorf("%s (%s) is in the document and not in docs/sdk-methods.md: give it a method in each SDK", op, route)
		}
	}
}

type sdkRow struct{ op, route, goName, ts, py, by string }

// sdkTable reads the rows of docs/sdk-methods.md's table.
func sdkTable(t *testing.T) []sdkRow {
	b, err := os.ReadFile(filepath.Join("..", "docs", "sdk-methods.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []sdkRow
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| Operation ") {
			continue
		}
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) != 8 {
			t.Fatalf("a row of %d cells, want 6: %s", len(cells)-2, line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, sdkRow{cells[1], cells[2], cells[3], cells[4], cells[5], cells[6]})
	}
	if len(rows) < 40 {
		t.Fatalf("only %d rows read from the table", len(rows))
	}
	return rows
}

// goMethods lists the exported methods of the package in dir, as
// "Type.Method".
func goMethods(t *testing.T, dir string) map[string]bool {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || !fn.Name.IsExported() {
				continue
			}
			typ := fn.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				out[id.Name+"."+fn.Name.Name] = true
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d methods found in %s", len(out), dir)
	}
	return out
}

// A class's header (its name, and the class it extends) and a method's
// declaration, in TypeScript and in Python, as each SDK writes them: a
// class at the start of a line, its members indented one level.
var (
	tsClass  = regexp.MustCompile(`^(?:export )?(?:abstract )?class (\w+)(?:<[^>]*>)?(?: extends (\w+))?`)
	tsMethod = regexp.MustCompile(`^  (?:static )?(?:async )?\*?\s*(?:get )?(\w+)\s*[(<]`)
	pyClass  = regexp.MustCompile(`^class (\w+)(?:\((\w+))?`)
	pyMethod = regexp.MustCompile(`^    (?:async )?def (\w+)\(`)
)

// classes are an SDK's classes: each one's methods and the class it
// extends.
type classes map[string]struct {
	base    string
	methods map[string]bool
}

// has reports whether "Class.method" is a method of the class or of one
// it extends.
func (c classes) has(name string) bool {
	typ, method, _ := strings.Cut(name, ".")
	for range 10 { // deep enough; a cycle ends here
		cl, ok := c[typ]
		if !ok {
			return false
		}
		if cl.methods[method] {
			return true
		}
		typ = cl.base
	}
	return false
}

// classMethods reads the classes of the source files in dir ending in ext.
func classMethods(t *testing.T, dir, ext string, class, method *regexp.Regexp) classes {
	files, err := filepath.Glob(filepath.Join(dir, "*"+ext))
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s files in %s: %v", ext, dir, err)
	}
	out := classes{}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		cur := ""
		for line := range strings.Lines(string(b)) {
			if m := class.FindStringSubmatch(line); m != nil {
				cur = m[1]
				out[cur] = struct {
					base    string
					methods map[string]bool
				}{m[2], map[string]bool{}}
				continue
			}
			if line[0] != ' ' && line[0] != '\n' && line[0] != '@' && line[0] != '#' {
				cur = "" // something else at the top level: the class ended
			}
			if m := method.FindStringSubmatch(line); m != nil && cur != "" {
				out[cur].methods[m[1]] = true
			}
		}
	}
	return out
}
