package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/client"
)

// completeTimeout bounds what completing an argument waits for kilnd: a
// shell whose kilnd is gone or stuck must not hang on a TAB.
const completeTimeout = 2 * time.Second

// argKind completes one kind of argument: what begins with toComplete
// of what kilnd has, args being the arguments before it.
type argKind func(ctx context.Context, cl *client.Client, args []string, toComplete string) []cobra.Completion

// complete is the ValidArgsFunction of a command whose argument at index
// i is of kinds[i]; those after them complete nothing (not host files,
// since no argument of these commands is one).
func (c *cli) complete(kinds ...argKind) cobra.CompletionFunc {
	return c.completeBy(func(i int) argKind {
		if i < len(kinds) {
			return kinds[i]
		}
		return nil
	})
}

// completeEach is the ValidArgsFunction of a command whose every
// argument is of kind.
func (c *cli) completeEach(kind argKind) cobra.CompletionFunc {
	return c.completeBy(func(int) argKind { return kind })
}

// completeBy completes the argument at index i as kindAt(i) says.
// Whatever goes wrong (kilnd not reachable, an unknown sandbox) completes
// nothing, and says nothing: the shell is not the place for kiln's errors.
func (c *cli) completeBy(kindAt func(i int) argKind) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		kind := kindAt(len(args))
		if kind == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		cl, err := client.New(client.Options{StateDir: c.stateDir, Addr: c.addr, Timeout: completeTimeout})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), completeTimeout)
		defer cancel()
		return kind(ctx, cl, args, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// sandboxArg completes a sandbox: the ids and names of those kilnd lists
// (not those given already, for commands that take several), each with
// the other and its state as its description.
func sandboxArg(ctx context.Context, cl *client.Client, args []string, toComplete string) []cobra.Completion {
	list, err := cl.Sandboxes(ctx)
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	add := func(choice, desc string) {
		if strings.HasPrefix(choice, toComplete) && !slices.Contains(args, choice) {
			out = append(out, cobra.CompletionWithDesc(choice, desc))
		}
	}
	for _, s := range list {
		if s.Name == "" {
			add(s.ID, s.State)
			continue
		}
		add(s.Name, s.ID+", "+s.State)
		add(s.ID, s.Name+", "+s.State)
	}
	return out
}

// processArg completes a process of the sandbox args[0]: its ids, with
// their state and command as their descriptions.
func processArg(ctx context.Context, cl *client.Client, args []string, toComplete string) []cobra.Completion {
	list, err := cl.Handle(args[0]).Processes(ctx)
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, p := range list {
		if strings.HasPrefix(p.ID, toComplete) {
			out = append(out, cobra.CompletionWithDesc(p.ID, p.State+": "+strings.Join(append([]string{p.Command}, p.Args...), " ")))
		}
	}
	return out
}

// loggedProcessArg completes a process kiln logs can show: those of
// processArg, and those with a captured log, which outlive the sandbox.
func loggedProcessArg(ctx context.Context, cl *client.Client, args []string, toComplete string) []cobra.Completion {
	out := processArg(ctx, cl, args, toComplete)
	logs, err := cl.Handle(args[0]).CapturedLogs(ctx)
	if err != nil {
		return out
	}
	for _, l := range logs {
		// A completion is its choice, a tab and its description.
		known := slices.ContainsFunc(out, func(c cobra.Completion) bool { return strings.HasPrefix(c, l.Process+"\t") })
		if strings.HasPrefix(l.Process, toComplete) && !known {
			out = append(out, cobra.CompletionWithDesc(l.Process, "captured"))
		}
	}
	return out
}

// nodeArg completes a node of kilnd's cluster: the names of those it
// lists (not those given already), each with its state as its
// description.
func nodeArg(ctx context.Context, cl *client.Client, args []string, toComplete string) []cobra.Completion {
	list, err := cl.Nodes(ctx)
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, n := range list {
		if strings.HasPrefix(n.Name, toComplete) && !slices.Contains(args, n.Name) {
			out = append(out, cobra.CompletionWithDesc(n.Name, n.State))
		}
	}
	return out
}

// previewArg completes a preview of the sandbox args[0]: the ids of
// those not expired, with their ports as their descriptions.
func previewArg(ctx context.Context, cl *client.Client, args []string, toComplete string) []cobra.Completion {
	list, err := cl.Handle(args[0]).Previews(ctx)
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, p := range list {
		if strings.HasPrefix(p.ID, toComplete) {
			out = append(out, cobra.CompletionWithDesc(p.ID, "port "+strconv.Itoa(p.Port)))
		}
	}
	return out
}
