package main

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"
)

// TestCommandNames holds each entry of commands to the names and aliases
// of the commands it makes: a name missing there would make kiln build
// every command for it, one listed wrongly would make kiln answer
// "unknown command" for a command it has.
func TestCommandNames(t *testing.T) {
	c := &cli{}
	seen := map[string]bool{}
	for _, cmd := range c.commands() {
		var got []string
		for _, made := range cmd.make() {
			got = append(got, made.Name())
			got = append(got, made.Aliases...)
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(cmd.names))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("commands: the entry for %v (-listed +made):\n%s", cmd.names, diff)
		}
		for _, n := range cmd.names {
			if seen[n] {
				t.Errorf("commands: %q is listed twice", n)
			}
			seen[n] = true
		}
	}
}

// TestAddCommands: a run naming a command gets that command alone, and
// anything else every command.
func TestAddCommands(t *testing.T) {
	c := &cli{}
	all := 0
	for _, cmd := range c.commands() {
		all += len(cmd.make())
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"run", "--rm", "--", "true"}, 1},
		{[]string{"unpause", "web"}, 5}, // an alias: the lifecycle commands are made together
		{nil, all},
		{[]string{"--json", "run"}, all},
		{[]string{"help", "run"}, all},
		{[]string{"rnu"}, all},
	} {
		root := &cobra.Command{Use: "kiln"}
		addCommands(root, tc.args, c.commands())
		if got := len(root.Commands()); got != tc.want {
			t.Errorf("%q: %d commands made, want %d", tc.args, got, tc.want)
		}
	}
}

// BenchmarkStart is kiln's own start up to its first request, which fails
// at once (no kilnd there): the command named first, so made alone, or a
// flag first, so every command made.
func BenchmarkStart(b *testing.B) {
	addr := "unix://" + filepath.Join(b.TempDir(), "none.sock")
	for name, args := range map[string][]string{
		"command-first": {"run", "--addr", addr, "--rm", "--", "true"},
		"flag-first":    {"--addr", addr, "run", "--rm", "--", "true"},
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if code := run(context.Background(), args, strings.NewReader(""), io.Discard, io.Discard); code != exitKiln {
					b.Fatalf("exit %d, want %d (kilnd unreachable)", code, exitKiln)
				}
			}
		})
	}
}
