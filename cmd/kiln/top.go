package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/client"
)

// topCmd is kiln top, as docker top: the processes running in a sandbox.
func (c *cli) topCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "top SANDBOX",
		Short: "List the processes running in a sandbox, as docker top does",
		Long: `Lists every process running in the sandbox now, whoever started it (kiln exec, a process those
started, the init command), read from the sandbox's /proc: its pid and parent's as the sandbox sees
them, its user, its state (R running, S sleeping, D waiting on a disk, Z a zombie, T stopped), the
CPU time it has used, its resident memory and its command line. PID 1 is the sandbox's agent.
kiln ps lists the processes the API started, with their exits; kiln top all that run.`,
		Example:           "  kiln top web\n  kiln --json top web",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.Handle(args[0]).Top(cmd.Context())
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(list)
				}
				w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "PID\tPPID\tUID\tSTATE\tTIME\tRSS\tCOMMAND")
				for _, p := range list {
					cpu := time.Duration(p.CPUSeconds * float64(time.Second)).Truncate(10 * time.Millisecond)
					fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%s\t%s\t%s\n", p.PID, p.PPID, p.UID, p.State, cpu, units.BytesSize(float64(p.RSSBytes)), p.Command)
				}
				return w.Flush()
			})
		},
	}
}
