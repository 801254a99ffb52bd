package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestCommandLineReadsBackInBash: ps shows each process on one line, and
// bash reads that line back into the very words the process was given.
func TestCommandLineReadsBackInBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash")
	}
	for _, argv := range [][]string{
		{"sh", "-c", "echo one\necho two"},
		{"printf", "%s\t%s\r\n", "it's", `back\slash`, `"quoted"`},
		{"echo", "", " ", "$HOME", "`date`", "a;b|c&d", "*", "~"},
		{"cat", "caf\u00e9", "\x1b[31mred", "bad\xffutf8", "del\x7f", "\u200bzero-width"},
	} {
		line := commandLine(argv[0], argv[1:])
		if strings.ContainsAny(line, "\n\r\x1b") {
			t.Errorf("%q: not one plain line: %q", argv, line)
		}
		out, err := exec.Command(bash, "-c", "for w in "+line+"; do printf '%s\\0' \"$w\"; done").Output()
		if err != nil {
			t.Fatalf("%q as %s: %v", argv, line, err)
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if !slices.Equal(got, argv) {
			t.Errorf("%q shown as %s, read back as %q", argv, line, got)
		}
	}
}
