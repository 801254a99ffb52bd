package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// snapshotCmd is kiln snapshot: take one, and list, inspect and remove
// them.
func (c *cli) snapshotCmd() *cobra.Command {
	var name string
	var memory bool
	cmd := &cobra.Command{
		Use:   "snapshot [--name NAME] SANDBOX",
		Short: "Snapshot a sandbox's files; list, inspect and remove snapshots",
		Long: `Takes a snapshot of a sandbox's files, running or stopped, and prints its id: its disk (/workspace,
and with an image the root's writes) copied while its file system is frozen (its processes' writes
wait that moment; nothing else stops). Image layers are shared, not copied. Where kilnd's state
directory shares extents (XFS, btrfs) the copy is a reflink, made in milliseconds; elsewhere it is
a copy. A snapshot records the sandbox's processes and how far each one's output had come, and
keeps their captured logs. It outlives the sandbox; kiln run --from, kiln fork and kiln rollback
start from it. Snapshots count against kilnd's --snapshot-quota.`,
		Example: `  kiln snapshot web                      # prints the snapshot's id
  kiln snapshot --name before-upgrade web
  kiln run --rm --from before-upgrade -- ls /workspace
  kiln rollback web before-upgrade`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				snap, err := cl.Handle(args[0]).Snapshot(cmd.Context(), api.SnapshotRequest{Name: name, Memory: memory})
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(snap)
				}
				fmt.Fprintln(c.stdout, snap.ID)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a `name` for the snapshot, unique among snapshots: a-z, 0-9 and '-'")
	cmd.Flags().BoolVar(&memory, "memory", false, "save its processes too, memory and all (a running gvisor sandbox's: runsc checkpoint)")
	var quiet bool
	ls := &cobra.Command{
		Use:     "ls [SANDBOX]",
		Aliases: []string{"list"},
		Short:   "List snapshots, of one sandbox if named (a deleted one's by its id)",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				sb := ""
				if len(args) == 1 {
					sb = args[0]
				}
				list, err := cl.Snapshots(cmd.Context(), sb)
				if err != nil {
					return err
				}
				switch {
				case c.json:
					return c.printJSON(list)
				case quiet:
					for _, s := range list {
						fmt.Fprintln(c.stdout, api.ShortID(s.ID))
					}
					return nil
				}
				return c.snapshotTable(list)
			})
		},
	}
	ls.Flags().BoolVarP(&quiet, "quiet", "q", false, "print the snapshots' ids alone")
	inspect := &cobra.Command{
		Use: "inspect SNAPSHOT", Short: "Describe a snapshot as JSON: by id, a unique prefix of it, or name", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				snap, err := cl.Snapshot(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return c.printJSON(snap)
			})
		},
	}
	rm := &cobra.Command{
		Use: "rm SNAPSHOT...", Aliases: []string{"remove"}, Short: "Remove snapshots (the sandboxes made from them keep their files)", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				for _, ref := range args {
					if err := cl.RemoveSnapshot(cmd.Context(), ref); err != nil {
						return err
					}
					fmt.Fprintln(c.stdout, ref)
				}
				return nil
			})
		},
	}
	var output string
	export := &cobra.Command{
		Use:   "export [-o FILE] SNAPSHOT",
		Short: "Write a snapshot as a tar, for kiln snapshot import on another host",
		Long: `Writes a snapshot as a tar to stdout (or -o FILE, replaced whole once it is written): its record,
its disk's data (holes left out) and its processes' captured logs. kiln snapshot import on another
kilnd takes it back, with its id and name.`,
		Example: `  kiln snapshot export -o ws.tar before-upgrade
  kiln snapshot export before-upgrade | ssh other kiln snapshot import`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output == "" && isTerminal(c.stdout) {
				return usageError{errors.New("a tar is not for a terminal: redirect stdout, or give -o FILE"), cmd.CommandPath()}
			}
			return c.withClient(func(cl *client.Client) error {
				rc, err := cl.ExportSnapshot(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				defer rc.Close()
				if output == "" {
					_, err = io.Copy(c.stdout, rc)
					return err
				}
				return writeWhole(output, rc)
			})
		},
	}
	export.Flags().StringVarP(&output, "output", "o", "", "the `file` to write, instead of stdout")
	imp := &cobra.Command{
		Use:   "import [FILE]",
		Short: "Take a snapshot from a tar kiln snapshot export wrote (stdin without FILE); print its id",
		Long: `Takes a snapshot from the tar kiln snapshot export wrote, whole or not at all, with its id and name
(refused if either is taken here), and prints its id. A sandbox made from it needs its image here:
pull it first (kiln image pull).`,
		Example: `  kiln snapshot import ws.tar
  kiln run --rm --from before-upgrade -- ls /workspace`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := c.stdin
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			return c.withClient(func(cl *client.Client) error {
				snap, err := cl.ImportSnapshot(cmd.Context(), in)
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(snap)
				}
				fmt.Fprintln(c.stdout, snap.ID)
				return nil
			})
		},
	}
	cmd.AddCommand(ls, inspect, rm, export, imp)
	return cmd
}

// writeWhole writes what r gives to path, replacing it whole once all is
// written, or leaving it as it was.
func writeWhole(path string, r io.Reader) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".")
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// rollbackCmd is kiln rollback.
func (c *cli) rollbackCmd() *cobra.Command {
	var secs int
	cmd := &cobra.Command{
		Use:   "rollback [-t SECONDS] SANDBOX SNAPSHOT",
		Short: "Give a sandbox the files of one of its snapshots again",
		Long: `Rolls a sandbox back to one of its snapshots: a running sandbox is stopped (as kiln stop, with the
timeout), gets a copy of the snapshot's files, and runs again, its init command too; a stopped one
stays stopped. Its id, name, labels and captured logs stay. The processes it had when the snapshot
was taken are listed with it (kiln ps) as its history, forked_from saying where they ran and how
far their output had come. The snapshot stays, for another rollback.`,
		Example: `  kiln snapshot --name clean web
  kiln exec web -- rm -rf /workspace/src     # a bad step
  kiln rollback web clean`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := stopOptions(cmd, secs)
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				info, err := cl.Handle(args[0]).Rollback(cmd.Context(), args[1], o)
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(info)
				}
				fmt.Fprintln(c.stdout, args[0])
				return nil
			})
		},
	}
	cmd.Flags().IntVarP(&secs, "timeout", "t", defaultStopSeconds, fmt.Sprintf("`seconds` from SIGTERM until what still runs is killed, 0 to %d", maxStopSeconds))
	return cmd
}

// forkCmd is kiln fork.
func (c *cli) forkCmd() *cobra.Command {
	var count int
	var filesOnly bool
	var labels func() (map[string]string, error)
	cmd := &cobra.Command{
		Use:   "fork [--count N] [--label KEY=VALUE]... SANDBOX",
		Short: "Make sandboxes with a sandbox's files as they are now; print their ids",
		Long: fmt.Sprintf(`Makes N sandboxes (default 1, at most %d), each with the files the sandbox has now (a snapshot,
removed once they are made), its image, limits, runtime, network policy (a new address each), init
command and labels, and prints their ids, one a line. Each goes its own way from there. A running
gvisor sandbox's processes are saved too (runsc checkpoint) and go on in each fork where they were,
their output at the same offsets (--files-only: its files alone). A namespace sandbox's processes
are listed in each fork as its history (kiln ps), their captured output up to the fork readable
(kiln logs); they do not run there. All are made, or none.`, api.MaxForks),
		Example: `  kiln fork --count 5 agent-ws               # five tries from one state
  for sb in $(kiln fork --count 3 web); do kiln exec -d "$sb" -- make test; done`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.completeEach(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 || count > api.MaxForks {
				return usageError{fmt.Errorf("--count %d: want 1 to %d", count, api.MaxForks), cmd.CommandPath()}
			}
			l, err := labels()
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				made, err := cl.Handle(args[0]).Fork(cmd.Context(), api.ForkRequest{Count: count, Labels: l, FilesOnly: filesOnly})
				if err != nil {
					return err
				}
				if c.json {
					infos := make([]api.Sandbox, len(made))
					for i, sb := range made {
						infos[i] = sb.Described
					}
					return c.printJSON(infos)
				}
				var b strings.Builder
				for _, sb := range made {
					b.WriteString(sb.ID + "\n")
				}
				fmt.Fprint(c.stdout, b.String())
				return nil
			})
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, fmt.Sprintf("how many sandboxes to make, 1 to %d", api.MaxForks))
	cmd.Flags().BoolVar(&filesOnly, "files-only", false, "fork a running gvisor sandbox's files alone, not its processes")
	labels = labelFlag(cmd)
	return cmd
}

// snapshotTable prints snapshots as kiln snapshot ls's table. A NODE
// column is there when a snapshot listed has a node (kilnd is in a
// cluster), with the node's state when it is unreachable or lost, so
// that one kilnd's table is as it was.
func (c *cli) snapshotTable(list []api.Snapshot) error {
	w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	clustered := slices.ContainsFunc(list, func(s api.Snapshot) bool { return s.Node != "" })
	if clustered {
		fmt.Fprintln(w, "SNAPSHOT ID\tNAME\tNODE\tSANDBOX\tIMAGE\tPROCESSES\tSIZE\tCOPY\tCREATED")
	} else {
		fmt.Fprintln(w, "SNAPSHOT ID\tNAME\tSANDBOX\tIMAGE\tPROCESSES\tSIZE\tCOPY\tCREATED")
	}
	for _, s := range list {
		sb := api.ShortID(s.Sandbox)
		if s.SandboxName != "" {
			sb += " (" + s.SandboxName + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t", api.ShortID(s.ID), dash(s.Name))
		if clustered {
			node := dash(s.Node)
			if s.NodeState == api.NodeUnreachable || s.NodeState == api.NodeLost {
				node += " (" + s.NodeState + ")"
			}
			fmt.Fprintf(w, "%s\t", node)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", sb, dash(familiarName(s.Image)),
			len(s.Processes), units.HumanSize(float64(s.SizeBytes)), s.Copy, units.HumanDuration(time.Since(s.CreatedAt))+" ago")
	}
	return w.Flush()
}
