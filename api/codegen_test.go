package api_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// oapiCodegen is the generator Go users reach for first; the version is
// pinned so that the test asks the same of the document every time.
const oapiCodegen = "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2"

// TestOpenAPIGeneratesGo runs oapi-codegen over the document, types and a
// client, and builds what it wrote: a document whose names collide (two
// components that generate one Go type) or that the generator cannot
// read fails here, before a user finds it. The generator comes from the
// Go module proxy, as `go run` fetches it.
func TestOpenAPIGeneratesGo(t *testing.T) {
	if testing.Short() {
		t.Skip("fetches and builds a code generator")
	}
	doc, err := filepath.Abs("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/kilnapi\n\ngo 1.24\n")
	write("config.yaml", "package: kilnapi\ngenerate:\n  models: true\n  client: true\noutput: kilnapi.go\n")
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), name, args...)
		cmd.Dir = dir
		// The generator is run outside this module, with its own
		// dependencies; the generated code in a module of its own.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	run("go", "run", oapiCodegen, "-config", "config.yaml", doc)
	run("go", "mod", "tidy")
	run("go", "vet", "./...")
}
