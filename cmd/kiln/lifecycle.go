package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// The stop timeout's bounds, kilnd's: its default, and its most.
const (
	defaultStopSeconds = 10
	maxStopSeconds     = 600
)

// lifecycleCmds are kiln stop, start, restart, pause and resume, made anew for each
// place they are found: at the top, as docker stop is, and under kiln
// sandbox, as docker container stop is.
func (c *cli) lifecycleCmds() []*cobra.Command {
	var stopSecs, restartSecs int
	stop := &cobra.Command{
		Use:   "stop [-t SECONDS] SANDBOX...",
		Short: "Stop sandboxes: their processes end, their files and captured logs stay, for kiln start",
		Long: `Stops each sandbox, as docker stop does: every process in it gets SIGTERM, and what still runs
after the timeout is killed. Its files (/workspace, and with an image the root's writes), its record
and its captured logs stay: kiln start runs it again. A sandbox stopped already is left as it is.
Each sandbox is printed as it was named once it is stopped.`,
		Example: `  kiln stop web
  kiln stop -t 30 web db        # 30 seconds after SIGTERM for each
  kiln stop -t 0 web            # killed at once`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := stopOptions(cmd, stopSecs)
			if err != nil {
				return err
			}
			return c.eachSandbox(cmd.Context(), args, func(ctx context.Context, sb *client.Sandbox) (api.Sandbox, error) {
				return sb.Stop(ctx, o)
			})
		},
	}
	stop.Flags().IntVarP(&stopSecs, "timeout", "t", defaultStopSeconds, fmt.Sprintf("`seconds` from SIGTERM until what still runs is killed, 0 to %d", maxStopSeconds))
	start := &cobra.Command{
		Use:   "start SANDBOX...",
		Short: "Start stopped sandboxes again: their init command runs again, on their files",
		Long: `Starts each stopped sandbox again, as docker start does, whether kiln stop stopped it or it stopped
by itself (its init command ended, it ran out of memory, the host restarted): the same sandbox (id,
name, labels, hostname, limits, network policy, image) on its files as they were, its init command,
if it has one, run again. A sandbox that runs already is left as it is. A sandbox past its ttl, which
counts from its creation, is not started. Each sandbox is printed as it was named once it runs.`,
		Example: `  kiln start web
  kiln ls -q -f status=stopped | xargs kiln start`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.eachSandbox(cmd.Context(), args, func(ctx context.Context, sb *client.Sandbox) (api.Sandbox, error) {
				return sb.StartAgain(ctx)
			})
		},
	}
	restart := &cobra.Command{
		Use:   "restart [-t SECONDS] SANDBOX...",
		Short: "Stop sandboxes if they run, and start them again",
		Long: `Restarts each sandbox, as docker restart does: kiln stop (with the timeout) if it runs, then
kiln start. Each sandbox is printed as it was named once it runs again.`,
		Example: `  kiln restart web
  kiln restart -t 2 web`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := stopOptions(cmd, restartSecs)
			if err != nil {
				return err
			}
			return c.eachSandbox(cmd.Context(), args, func(ctx context.Context, sb *client.Sandbox) (api.Sandbox, error) {
				return sb.Restart(ctx, o)
			})
		},
	}
	restart.Flags().IntVarP(&restartSecs, "timeout", "t", defaultStopSeconds, fmt.Sprintf("`seconds` from SIGTERM until what still runs is killed, 0 to %d", maxStopSeconds))
	pause := &cobra.Command{
		Use:   "pause SANDBOX...",
		Short: "Pause sandboxes: their processes stop where they are, their memory kept, until kiln resume",
		Long: `Pauses each sandbox, as docker pause does: every process in it stops where it is, keeps its
memory and uses no CPU until kiln resume, which lets it run on from there. Meanwhile kiln ls shows
it paused, and what needs it to run (kiln exec, a process started, stdin, its files and ports) is
refused; its processes' output stays readable, and kiln attach and kiln logs -f stay attached,
reading on after the resume with nothing lost. Its idle timeout does not count while it is paused;
its ttl does. A sandbox paused already is left as it is. Each sandbox is printed as it was named
once it is paused.`,
		Example: `  kiln pause web
  kiln resume web`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.eachSandbox(cmd.Context(), args, func(ctx context.Context, sb *client.Sandbox) (api.Sandbox, error) {
				return sb.Pause(ctx)
			})
		},
	}
	resume := &cobra.Command{
		Use:     "resume SANDBOX...",
		Aliases: []string{"unpause"},
		Short:   "Resume paused sandboxes: their processes run on from where they were",
		Long: `Resumes each paused sandbox, as docker unpause does: its processes run on from where kiln pause
stopped them. A sandbox that is not paused is left as it is. Each sandbox is printed as it was named
once it runs again.`,
		Example: `  kiln resume web
  kiln ls -q -f status=paused | xargs kiln resume`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.eachSandbox(cmd.Context(), args, func(ctx context.Context, sb *client.Sandbox) (api.Sandbox, error) {
				return sb.Resume(ctx)
			})
		},
	}
	return []*cobra.Command{stop, start, restart, pause, resume}
}

// stopOptions are the stop's options from -t: a usage error out of its
// range, before kilnd is asked anything.
func stopOptions(cmd *cobra.Command, secs int) (client.StopOptions, error) {
	if secs < 0 || secs > maxStopSeconds {
		return client.StopOptions{}, usageError{fmt.Errorf("--timeout %d: want seconds from 0 to %d", secs, maxStopSeconds), cmd.CommandPath()}
	}
	t := time.Duration(secs) * time.Second
	return client.StopOptions{Timeout: &t}, nil
}

// eachSandbox makes change to each sandbox refs name, one after the other
// as docker does, and prints each ref it was made to, as it was given;
// with --json, their descriptions, an array. The errors, each with its
// ref, are returned together once every sandbox has been tried.
func (c *cli) eachSandbox(ctx context.Context, refs []string, change func(context.Context, *client.Sandbox) (api.Sandbox, error)) error {
	return c.withClient(func(cl *client.Client) error {
		var errs []error
		done := []api.Sandbox{}
		for _, ref := range refs {
			info, err := change(ctx, cl.Handle(ref))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", ref, err))
				continue
			}
			if c.json {
				done = append(done, info)
				continue
			}
			fmt.Fprintln(c.stdout, ref)
		}
		if c.json {
			if err := c.printJSON(done); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}
