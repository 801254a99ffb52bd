package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// nodeCmd is kiln node: the nodes of kilnd's cluster (kilnd --cluster),
// listed as docker node ls and kubectl get nodes list them, inspected,
// drained and undrained (kubectl's cordon and uncordon).
func (c *cli) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List, inspect, drain and undrain the nodes of kilnd's cluster",
		Long: `The nodes of the cluster kilnd is in (kilnd --cluster NATS --node NAME): any node answers for
all of them, each as its last heartbeat told. A kilnd in no cluster has no nodes, and says so.`,
	}
	var (
		quiet  bool
		format string
	)
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List the cluster's nodes: their state, load, capacity and labels", Args: cobra.NoArgs,
		Long: `Lists the cluster's nodes by name, as their last heartbeats told: their state (ready; draining,
by kiln node drain; unreachable, when they missed their heartbeats; lost, past kilnd
--node-lost-after), their sandboxes running, their hosts' free memory and CPUs, their labels
(kilnd --node-label, which kiln run --constraint matches), and how long ago their last heartbeat
came. The node that answered is marked *.

--format prints each node by a Go template ({{.Name}}, {{.State}}, {{.Sandboxes}},
{{.FreeMemoryBytes}}, {{.CPUs}}, {{.Labels}}, {{index .Labels "KEY"}}, {{.SeenAt}}, {{json .}}),
or: table (the default), wide, json (one object a line) or yaml.`,
		Example: `  kiln node ls
  kiln node ls -q
  kiln node ls --format '{{.Name}} {{index .Labels "zone"}}'`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, tmpl, err := c.listFormat(cmd, format)
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.Nodes(cmd.Context())
				if err != nil {
					return err
				}
				return c.printNodes(list, format, tmpl, quiet, cmd.CommandPath())
			})
		},
	}
	ls.Flags().BoolVarP(&quiet, "quiet", "q", false, "print the nodes' names alone")
	ls.Flags().StringVar(&format, "format", "", "a Go `template` for each node, or table, wide, json or yaml")
	inspect := &cobra.Command{
		Use: "inspect NODE", Short: "Describe a node as JSON", Args: cobra.ExactArgs(1),
		ValidArgsFunction: c.complete(nodeArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				n, err := cl.Node(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return c.printJSON(n)
			})
		},
	}
	var moveStopped bool
	drain := &cobra.Command{
		Use:   "drain NODE...",
		Short: "Place no new sandbox on nodes; their sandboxes run on",
		Long: `Drains each node, as kubectl cordon does: no new sandbox is placed on it (a create that names it
with --node is refused), and the sandboxes it has run on and are served as before, from any node.
kiln node undrain undoes it. A node drained already is left as it is. Each node is printed once it
is draining.

With --move-stopped, the node also moves each of its stopped sandboxes to another ready node: a
snapshot of its files, imported there, makes a sandbox of the same name, labels and settings, and
the one on the drained node is deleted. Each move is printed (the sandbox, the node it went to and
its id there); one that failed says why and which snapshot holds its files, and kiln exits 1.`,
		Example: `  kiln node drain b
  kiln node ls                  # b: draining
  kiln node drain --move-stopped b`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeEach(nodeArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !moveStopped {
				return c.eachNode(cmd.Context(), args, (*client.Client).DrainNode)
			}
			return c.eachNode(cmd.Context(), args, func(cl *client.Client, ctx context.Context, name string) (api.Node, error) {
				n, err := cl.DrainNodeMoving(ctx, name)
				if err != nil || c.json {
					return n, err
				}
				var failed []error
				for _, m := range n.Moved {
					if m.Error != "" {
						failed = append(failed, fmt.Errorf("%s not moved: %s", cmp.Or(m.Name, api.ShortID(m.Sandbox)), m.Error))
						continue
					}
					fmt.Fprintf(c.stdout, "%s\tmoved to %s as %s\n", cmp.Or(m.Name, api.ShortID(m.Sandbox)), m.Node, api.ShortID(m.ID))
				}
				return n, errors.Join(failed...)
			})
		},
	}
	drain.Flags().BoolVar(&moveStopped, "move-stopped", false, "move the node's stopped sandboxes to other nodes, as snapshots of their files")
	undrain := &cobra.Command{
		Use:     "undrain NODE...",
		Aliases: []string{"uncordon"},
		Short:   "Place sandboxes on drained nodes again",
		Long: `Undrains each node, as kubectl uncordon does: new sandboxes may be placed on it again. Each node
is printed once it is ready again.`,
		Example:           `  kiln node undrain b`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeEach(nodeArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.eachNode(cmd.Context(), args, (*client.Client).UndrainNode)
		},
	}
	cmd.AddCommand(ls, inspect, drain, undrain)
	return cmd
}

// listFormat reads a list's --format as kiln ls does: a template, or
// table (the default, or -o's), wide, json (-o json or --json: one list)
// or yaml.
func (c *cli) listFormat(cmd *cobra.Command, format string) (string, *template.Template, error) {
	switch {
	case format == "" && c.json:
		format = "json-list"
	case format == "":
		format = cmp.Or(c.output, "table")
	}
	switch format {
	case "table", "wide", "json", "json-list", "yaml":
		return format, nil, nil
	}
	tmpl, err := template.New("format").Funcs(formatFuncs).Parse(format)
	if err != nil {
		return "", nil, usageError{fmt.Errorf("--format: %w", err), cmd.CommandPath()}
	}
	return format, tmpl, nil
}

// printNodes prints list as kiln node ls was asked to: names alone
// (quiet), by a template, as JSON (a list, or an object a line), YAML or
// a table.
func (c *cli) printNodes(list []api.Node, format string, tmpl *template.Template, quiet bool, cmdPath string) error {
	switch {
	case quiet:
		for _, n := range list {
			fmt.Fprintln(c.stdout, n.Name)
		}
		return nil
	case tmpl != nil:
		for _, n := range list {
			if err := tmpl.Execute(c.stdout, n); err != nil {
				return usageError{fmt.Errorf("--format: %w", err), cmdPath}
			}
			fmt.Fprintln(c.stdout)
		}
		return nil
	case format == "json-list":
		return c.printJSON(list)
	case format == "json":
		enc := json.NewEncoder(c.stdout)
		for _, n := range list {
			if err := enc.Encode(n); err != nil {
				return err
			}
		}
		return nil
	case format == "yaml":
		return printYAML(c.stdout, list)
	}
	return c.nodeTable(list, format == "wide", time.Now())
}

// nodeTable prints nodes as kiln node ls's table, as their heartbeats
// told at now; with wide, more columns.
func (c *cli) nodeTable(list []api.Node, wide bool, now time.Time) error {
	w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	head := "NAME\tSTATE\tSANDBOXES\tFREE MEMORY\tCPUS\tLABELS\tLAST HEARTBEAT"
	if wide {
		head += "\tMEMORY\tVERSION\tSTARTED\tAPI"
	}
	fmt.Fprintln(w, head)
	for _, n := range list {
		name := n.Name
		if n.Self {
			name += " *" // as docker node ls marks the node it asked
		}
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
			labels = append(labels, k+"="+n.Labels[k])
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%s\t%s", name, n.State, n.Sandboxes, units.BytesSize(float64(n.FreeMemoryBytes)), n.CPUs,
			orDash(strings.Join(labels, ",")), ago(n.SeenAt, now))
		if wide {
			fmt.Fprintf(w, "\t%s\t%s\t%s\t%s", units.BytesSize(float64(n.MemoryBytes)), orDash(n.Version), n.StartedAt.Local().Format(time.DateTime), orDash(n.APIURL))
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}

// ago is how long before now t was, as docker says it ("3 seconds ago");
// "-" for a time never set.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return units.HumanDuration(max(now.Sub(t), 0)) + " ago"
}

// eachNode makes change to each node names, one after the other, and
// prints each name once it is made; with --json, the nodes as they are
// then, an array. The errors, each with its node, are returned together
// once every node has been tried.
func (c *cli) eachNode(ctx context.Context, names []string, change func(*client.Client, context.Context, string) (api.Node, error)) error {
	return c.withClient(func(cl *client.Client) error {
		var errs []error
		done := []api.Node{}
		for _, name := range names {
			n, err := change(cl, ctx, name)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			if c.json {
				done = append(done, n)
				continue
			}
			fmt.Fprintln(c.stdout, name)
		}
		if c.json {
			if err := c.printJSON(done); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

// placementFlags adds --node and --constraint, where in kilnd's cluster a
// sandbox goes, to a command that creates one; what it returns checks
// them, before kilnd is asked.
func placementFlags(cmd *cobra.Command, o *api.CreateSandbox) func() error {
	cmd.Flags().StringVar(&o.Node, "node", "", "in a cluster (kilnd --cluster), the `node` to create the sandbox on (kiln node ls lists them)")
	cmd.Flags().StringArrayVar(&o.Constraints, "constraint", nil, "in a cluster, a `KEY=VALUE` label (kilnd --node-label) the sandbox's node must have\n(repeatable); without --node, the least loaded node that has them all")
	return func() error {
		for _, kv := range o.Constraints {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				return usageError{fmt.Errorf("--constraint %q: want KEY=VALUE, a label of the node's (kilnd --node-label)", kv), cmd.CommandPath()}
			}
		}
		return nil
	}
}
