package api_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
