package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// How long kiln stats waits between the two reads a CPU % needs: when it
// prints once, and between redraws on a terminal.
const (
	statsSample  = time.Second
	statsRefresh = 2 * time.Second
)

// statsRow is one sandbox's line of kiln stats, and its JSON.
type statsRow struct {
	// Sandbox is its id, Name its name if it has one.
	Sandbox string `json:"sandbox"`
	Name    string `json:"name,omitempty"`
	// CPUPercent is the CPU time used between two reads over the time
	// between them: 100 is one core busy.
	CPUPercent float64 `json:"cpu_percent"`
	api.SandboxStats
}

func (c *cli) statsCmd() *cobra.Command {
	var noStream bool
	cmd := &cobra.Command{
		Use:   "stats [SANDBOX...]",
		Short: "Show sandboxes' CPU, memory and process figures, live",
		Long: `Show the CPU, memory and tasks of the sandboxes named, or of every running sandbox,
as their cgroups count them. CPU % is the CPU time used between two reads over the time
between them (100% is one core busy). On a terminal the table is redrawn every 2 seconds
until interrupted; elsewhere, or with --no-stream or --json, it is printed once, after
two reads a second apart. A figure the host does not keep for a sandbox is shown as "-"
(on a host with cgroup v1 controllers, memory and pids of a sandbox without their limit;
disk, of a sandbox without a disk of its own, which its agent reads).`,
		Example: `  kiln stats                     # every running sandbox, redrawn until Ctrl-C
  kiln stats $SB --no-stream     # one sandbox, printed once
  kiln stats --json              # for scripts: cpu_percent beside the API's figures`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				if noStream || c.json || !isTerminal(c.stdout) {
					rows, err := statsOnce(cmd.Context(), cl, args, statsSample)
					if err != nil {
						return err
					}
					if c.json {
						return c.printJSON(rows)
					}
					return printStats(c.stdout, rows)
				}
				return c.streamStats(cmd.Context(), cl, args)
			})
		},
	}
	cmd.Flags().BoolVar(&noStream, "no-stream", false, "print once and exit (the default when stdout is not a terminal)")
	return cmd
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// statsOnce reads the sandboxes' figures twice, wait apart, for their
// CPU %.
func statsOnce(ctx context.Context, cl *client.Client, ids []string, wait time.Duration) ([]statsRow, error) {
	before, err := readStats(ctx, cl, ids)
	if err != nil {
		return nil, err
	}
	if err := sleepCtx(ctx, wait); err != nil {
		return nil, err
	}
	after, err := readStats(ctx, cl, ids)
	if err != nil {
		return nil, err
	}
	return statsRows(before, after), nil
}

// streamStats redraws the table every statsRefresh until ctx ends (an
// interrupt), which is not an error.
func (c *cli) streamStats(ctx context.Context, cl *client.Client, ids []string) error {
	before, err := readStats(ctx, cl, ids)
	for err == nil {
		if err = sleepCtx(ctx, statsRefresh); err != nil {
			break
		}
		var after []statsRow
		if after, err = readStats(ctx, cl, ids); err != nil {
			break
		}
		fmt.Fprint(c.stdout, "\x1b[H\x1b[2J") // home, clear the screen
		err = printStats(c.stdout, statsRows(before, after))
		before = after
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// readStats reads the figures of the sandboxes named, each of which must
// be running, or of every running one, leaving out those that stop
// between the list and the read.
func readStats(ctx context.Context, cl *client.Client, ids []string) ([]statsRow, error) {
	named := len(ids) > 0
	list, err := cl.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, s := range list {
		names[s.ID] = s.Name
		if !named && s.State == api.SandboxRunning {
			ids = append(ids, s.ID)
		}
	}
	var rows []statsRow
	var errs []error
	for _, ref := range ids {
		id := ref
		if _, known := names[ref]; !known && named {
			// A name or a prefix: the row shows the sandbox's id.
			if info, err := cl.Handle(ref).Info(ctx); err == nil {
				id = info.ID
			}
		}
		st, err := cl.Handle(id).Stats(ctx)
		switch {
		case err == nil:
			rows = append(rows, statsRow{Sandbox: id, Name: names[id], SandboxStats: st})
		case named:
			errs = append(errs, fmt.Errorf("%s: %w", ref, err))
		case !client.IsFailedPrecondition(err) && !client.IsNotFound(err):
			return nil, err
		}
	}
	return rows, errors.Join(errs...)
}

// statsRows are the later reads with the CPU % since the earlier read of
// the same sandbox (0 for a sandbox new since).
func statsRows(before, after []statsRow) []statsRow {
	prev := map[string]api.SandboxStats{}
	for _, r := range before {
		prev[r.Sandbox] = r.SandboxStats
	}
	for i, r := range after {
		p, ok := prev[r.Sandbox]
		if dt := r.ReadAt.Sub(p.ReadAt).Seconds(); ok && dt > 0 {
			after[i].CPUPercent = (r.CPUSeconds - p.CPUSeconds) / dt * 100
		}
	}
	return after
}

func printStats(w io.Writer, rows []statsRow) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tNAME\tCPU %\tMEM USAGE / LIMIT\tMEM %\tPIDS\tOOM\tDISK USAGE / SIZE")
	for _, r := range rows {
		mem, memPct := "-", "-"
		if r.MemoryBytes != nil {
			limit := "-"
			if r.MemoryLimitBytes != nil {
				limit = units.BytesSize(float64(*r.MemoryLimitBytes))
				memPct = fmt.Sprintf("%.2f%%", float64(*r.MemoryBytes)/float64(*r.MemoryLimitBytes)*100)
			}
			mem = units.BytesSize(float64(*r.MemoryBytes)) + " / " + limit
		}
		disk := "-"
		if c := r.Counts; c != nil && c.DiskUsedBytes != nil && c.DiskSizeBytes != nil {
			disk = units.BytesSize(float64(*c.DiskUsedBytes)) + " / " + units.BytesSize(float64(*c.DiskSizeBytes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f%%\t%s\t%s\t%s\t%s\t%s\n", api.ShortID(r.Sandbox), orDash(r.Name), r.CPUPercent, mem, memPct, count(r.Pids), count(r.OOMKills), disk)
	}
	return tw.Flush()
}

// count is a figure, or "-" when the host does not keep it.
func count(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}
