package api_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// redocly is the linter tools/openapi pins; `npm ci` there installs it.
var redocly = filepath.Join("..", "tools", "openapi", "node_modules", ".bin", "redocly")

// TestOpenAPILint runs `redocly lint` over the document, with the rules
// tools/openapi/redocly.yaml keeps: no error and no warning. Without the
// linter installed it skips, but not in CI (CI set), whose .ci/run
// installs it.
func TestOpenAPILint(t *testing.T) {
	if _, err := os.Stat(redocly); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redocly is not installed (%v): .ci/run installs it with npm ci in tools/openapi", err)
		}
		t.Skip("redocly is not installed: `npm ci` in tools/openapi installs it")
	}
	cmd := exec.CommandContext(t.Context(), redocly, "lint", "--config", filepath.Join("..", "tools", "openapi", "redocly.yaml"), "--format=json", "openapi.yaml")
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var report struct {
		Totals struct {
			Errors, Warnings int
		}
		Problems []struct {
			RuleID   string
			Severity string
			Message  string
			Location []struct{ Pointer string }
		}
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("redocly lint: %v, and its report is not JSON (%v):\n%s%s", err, jerr, out, stderr.String())
	}
	for _, p := range report.Problems {
		at := ""
		if len(p.Location) > 0 {
			at = p.Location[0].Pointer
		}
		t.Errorf("%s %s at %s: %s", p.Severity, p.RuleID, at, p.Message)
	}
	if report.Totals.Errors+report.Totals.Warnings > 0 || err != nil {
		t.Fatalf("redocly lint: %d errors, %d warnings (%v)", report.Totals.Errors, report.Totals.Warnings, err)
	}
}

// asyncapiTools is where tools/asyncapi's `npm ci` installs the AsyncAPI
// parser that validate.mjs runs.
var asyncapiTools = filepath.Join("..", "tools", "asyncapi")

// TestAsyncAPIValid runs @asyncapi/parser, the reference parser, over
// the AsyncAPI document (tools/asyncapi/validate.mjs): no diagnostic of
// error severity, and the channels and operations it reads are the ones
// this package's reading finds. Without Node or the parser it skips, but
// not in CI (CI set), whose .ci/run installs both.
func TestAsyncAPIValid(t *testing.T) {
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(asyncapiTools, "node_modules", "@asyncapi", "parser", "package.json"))
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node or @asyncapi/parser is not installed (%v): .ci/run installs them (scripts/test-deps.sh, npm ci in tools/asyncapi)", err)
		}
		t.Skipf("node or @asyncapi/parser is not installed (%v): `npm ci` in tools/asyncapi installs the parser", err)
	}
	doc, err := filepath.Abs("asyncapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, "validate.mjs", doc)
	cmd.Dir = asyncapiTools
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var report struct {
		Diagnostics []struct {
			Code, Message, Path string
			Severity            int
		}
		Channels   map[string]string
		Operations map[string]string
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("validate.mjs: %v, and its report is not JSON (%v):\n%s%s", err, jerr, out, stderr.String())
	}
	for _, d := range report.Diagnostics {
		// 0 is an error; warnings fail too, as the OpenAPI linter's do.
		// Information (2: a later AsyncAPI version exists) and hints do not.
		if d.Severity <= 1 {
			t.Errorf("severity %d, %s at %s: %s", d.Severity, d.Code, d.Path, d.Message)
		}
	}
	if err != nil {
		t.Fatalf("validate.mjs: %v\n%s", err, stderr.String())
	}
	a := loadAsyncAPI(t)
	channels := map[string]string{}
	for id, c := range a.channels {
		channels[id] = c.address
	}
	if diff := cmp.Diff(channels, report.Channels); diff != "" {
		t.Errorf("channels, as read here (-) and by the parser (+):\n%s", diff)
	}
	operations := map[string]string{}
	for id, o := range a.operations {
		operations[id] = o.action
	}
	if diff := cmp.Diff(operations, report.Operations); diff != "" {
		t.Errorf("operations, as read here (-) and by the parser (+):\n%s", diff)
	}
}
