package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v4"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// lsCmd is kiln sandbox ls, also kiln ls: as docker ps lists containers,
// the running sandboxes unless -a, chosen by --filter, as a table, ids
// alone (-q), JSON or a Go template.
func (c *cli) lsCmd() *cobra.Command {
	var (
		all, quiet, noTrunc bool
		filters             []string
		format              string
	)
	cmd := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List sandboxes: the running ones, or with -a all of them", Args: cobra.NoArgs,
		Long: `Lists the running sandboxes, the paused ones among them, oldest first; with -a the stopped ones
too, and the deleted ones whose records and captured logs kilnd still keeps (kilnd --keep-deleted).
In a cluster (kilnd --cluster) it lists every node's, in a NODE column, those of a node that missed
its heartbeats as unknown and those of a lost one as node_lost.

--filter (-f) chooses, and may be repeated (each must match):
  label=KEY          sandboxes with the label KEY
  label=KEY=VALUE    sandboxes whose label KEY is VALUE
  name=NAME, status=running|paused|stopped|deleted|unknown|node_lost, image=IMAGE,
  runtime=namespaces|gvisor, node=NODE (in a cluster: those on that node)

Ids are shown as Docker shows them, their first 12 characters, which name the sandbox
anywhere kiln takes one; --no-trunc (and -o wide) shows them whole.

--format prints each sandbox by a Go template, as docker ps does ({{.ID}}, {{.Name}},
{{.State}}, {{.Image}}, {{.Runtime}}, {{.Node}}, {{.CreatedAt}}, {{.Labels}}, {{index .Labels "KEY"}},
{{json .}}, {{join .Args ","}}), or: table (the default), wide, json (one object a line)
or yaml.`,
		Example: `  kiln ls
  kiln ls -a
  kiln ls -q --filter label=team=web | xargs kiln sandbox rm
  kiln ls --format '{{.Name}} {{index .Labels "team"}}'`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := sandboxFilter(filters)
			if err != nil {
				return usageError{err, cmd.CommandPath()}
			}
			f.All = all
			// Without -a, those that run, paused or not, as docker ps
			// lists paused containers: all but the stopped ones.
			running := !all && f.State == ""
			format, tmpl, err := c.listFormat(cmd, format)
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.SandboxesWhere(cmd.Context(), f)
				if err != nil {
					return err
				}
				if running {
					list = slices.DeleteFunc(list, func(s api.Sandbox) bool { return s.State == api.SandboxStopped })
				}
				return c.printSandboxes(list, sandboxShape{format, tmpl, quiet, noTrunc, cmd.CommandPath()})
			})
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "the stopped sandboxes too, and the deleted ones kilnd keeps")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print the ids alone")
	cmd.Flags().BoolVar(&noTrunc, "no-trunc", false, "whole ids (in the table and with -q), not their first 12 characters")
	cmd.Flags().StringArrayVarP(&filters, "filter", "f", nil, "choose by `KEY=VALUE`: label=KEY[=VALUE], name=, status=, image=, runtime=, node= (repeatable)")
	cmd.Flags().StringVar(&format, "format", "", "a Go `template` for each sandbox, or table, wide, json or yaml")
	return cmd
}

// sandboxShape is how kiln ls prints: its format (or template), ids alone
// (quiet), ids whole, and the command's path for a usage error.
type sandboxShape struct {
	format       string
	tmpl         *template.Template
	quiet, whole bool
	cmd          string
}

// printSandboxes prints list as kiln ls was asked to: ids alone (quiet),
// by a template, as JSON (a list, or an object a line), YAML or a table,
// ids whole or short.
func (c *cli) printSandboxes(list []api.Sandbox, o sandboxShape) error {
	format, tmpl := o.format, o.tmpl
	shown := api.ShortID
	if o.whole {
		shown = func(id string) string { return id }
	}
	switch {
	case o.quiet:
		for _, s := range list {
			fmt.Fprintln(c.stdout, shown(s.ID))
		}
		return nil
	case tmpl != nil:
		for _, s := range list {
			if err := tmpl.Execute(c.stdout, s); err != nil {
				return usageError{fmt.Errorf("--format: %w", err), o.cmd}
			}
			fmt.Fprintln(c.stdout)
		}
		return nil
	case format == "json-list":
		return c.printJSON(list)
	case format == "json":
		enc := json.NewEncoder(c.stdout)
		for _, s := range list {
			if err := enc.Encode(s); err != nil {
				return err
			}
		}
		return nil
	case format == "yaml":
		return printYAML(c.stdout, list)
	}
	return c.sandboxTable(list, format == "wide", format == "wide" || o.whole)
}

// sandboxFilter reads --filter's KEY=VALUE pairs.
func sandboxFilter(filters []string) (client.SandboxFilter, error) {
	var f client.SandboxFilter
	for _, kv := range filters {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return f, fmt.Errorf("--filter %q: want KEY=VALUE, KEY one of label, name, status, image, runtime, node", kv)
		}
		one := func(to *string) error {
			if *to != "" && *to != v {
				return fmt.Errorf("--filter %s given twice (%q and %q): a sandbox has one", k, *to, v)
			}
			*to = v
			return nil
		}
		var err error
		switch k {
		case "label":
			f.Labels = append(f.Labels, v)
		case "name":
			err = one(&f.Name)
		case "status", "state":
			err = one(&f.State)
		case "image", "ancestor":
			err = one(&f.Image)
		case "runtime":
			err = one(&f.Runtime)
		case "node":
			err = one(&f.Node)
		default:
			err = fmt.Errorf("--filter %q: no filter %q; want label, name, status, image, runtime or node", kv, k)
		}
		if err != nil {
			return f, err
		}
	}
	return f, nil
}

// formatFuncs are the functions --format's templates have, as Docker's
// do.
var formatFuncs = template.FuncMap{
	"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	"join":  strings.Join,
	"lower": strings.ToLower,
	"upper": strings.ToUpper,
}

// sandboxTable prints sandboxes as kiln ls's table: with wide, more
// columns; with whole, ids whole. A NODE column is there when a sandbox
// listed has a node (kilnd is in a cluster), so that one kilnd's table is
// as it was.
func (c *cli) sandboxTable(list []api.Sandbox, wide, whole bool) error {
	w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	clustered := slices.ContainsFunc(list, func(s api.Sandbox) bool { return s.Node != "" })
	head := "ID\tNAME\tSTATE\tRUNTIME\tCREATED\tHOSTNAME"
	if clustered {
		head = "ID\tNAME\tSTATE\tNODE\tRUNTIME\tCREATED\tHOSTNAME"
	}
	if wide {
		head += "\tIMAGE\tMEMORY\tPIDS\tCPUS\tDISK\tLABELS"
	}
	fmt.Fprintln(w, head)
	for _, s := range list {
		id := s.ID
		if !whole {
			id = api.ShortID(id)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t", id, s.Name, s.State)
		if clustered {
			fmt.Fprintf(w, "%s\t", orDash(s.Node))
		}
		fmt.Fprintf(w, "%s\t%s\t%s", s.Runtime, s.CreatedAt.Local().Format(time.DateTime), s.Hostname)
		if wide {
			l := s.Limits
			var labels []string
			for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
				labels = append(labels, k+"="+s.Labels[k])
			}
			fmt.Fprintf(w, "\t%s\t%s\t%s\t%s\t%s\t%s", orDash(s.Image), sizeOrNone(l.MemoryBytes), numOrNone(l.Pids), numOrNone(l.CPUs), sizeOrNone(l.DiskBytes), orDash(strings.Join(labels, ",")))
		}
		fmt.Fprintln(w)
	}
	return w.Flush()
}

// printYAML prints v as YAML with the names its JSON has: through JSON,
// so that the two never disagree.
func printYAML(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // sizes stay integers, not 1.073741824e+09
	var plain any
	if err := dec.Decode(&plain); err != nil {
		return err
	}
	out, err := yaml.Marshal(numbers(plain))
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// labelFlag adds --label (-l) to cmd, repeatable, and returns what reads
// it: the labels of the sandbox it creates.
func labelFlag(cmd *cobra.Command) func() (map[string]string, error) {
	var given []string
	cmd.Flags().StringArrayVarP(&given, "label", "l", nil, "a `KEY=VALUE` label of the sandbox's, that kiln ls --filter label=… chooses by (repeatable)")
	return func() (map[string]string, error) {
		if len(given) == 0 {
			return nil, nil
		}
		labels := map[string]string{}
		for _, kv := range given {
			k, v, _ := strings.Cut(kv, "=")
			if k == "" {
				return nil, usageError{fmt.Errorf("--label %q: want KEY=VALUE (or KEY, for an empty value)", kv), cmd.CommandPath()}
			}
			labels[k] = v
		}
		return labels, nil
	}
}

// numbers turns the JSON numbers in v into int64 or float64, as YAML
// writes them.
func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	}
	return v
}

// lifetimeFlags adds --idle-timeout and --ttl to a command that creates a
// sandbox; lifetimes reads them, in seconds.
func lifetimeFlags(cmd *cobra.Command) {
	cmd.Flags().Duration("idle-timeout", 0, "delete the sandbox (keeping its logs) after this long idle: no request, no watcher, no process running")
	cmd.Flags().Duration("ttl", 0, "delete the sandbox (keeping its logs) this long after its creation, whatever it is doing")
}

func lifetimes(cmd *cobra.Command) (idle, ttl int64, err error) {
	for _, f := range []struct {
		name string
		to   *int64
	}{{"idle-timeout", &idle}, {"ttl", &ttl}} {
		d, _ := cmd.Flags().GetDuration(f.name)
		if d < 0 || d > api.MaxIdleTimeoutSeconds*time.Second || d > 0 && d < time.Second {
			return 0, 0, usageError{fmt.Errorf("--%s %v: want 1s to a year (8760h), or 0 for none", f.name, d), cmd.CommandPath()}
		}
		*f.to = int64(d / time.Second)
	}
	return idle, ttl, nil
}

// volumeFlag adds --volume (-v) to cmd, repeatable, and returns what reads
// it: the mounts of the sandbox it creates, as docker run -v gives them.
func volumeFlag(cmd *cobra.Command) func() ([]api.Mount, error) {
	var given []string
	cmd.Flags().StringArrayVarP(&given, "volume", "v", nil, "bind a host directory into the sandbox, `SRC:DST`, SRC:DST:ro (read-only) or SRC:DST:rw; a relative\nSRC is in kiln's working directory; kilnd allows those below its --allow-mount alone (repeatable)")
	return func() ([]api.Mount, error) {
		var mounts []api.Mount
		for _, v := range given {
			m, err := parseVolume(v)
			if err != nil {
				return nil, usageError{err, cmd.CommandPath()}
			}
			mounts = append(mounts, m)
		}
		return mounts, nil
	}
}

// parseVolume reads one -v: SOURCE:TARGET, then :ro or :rw (the default).
// A relative SOURCE is made absolute against kiln's working directory, as
// Docker does; everything else is kilnd's to check.
func parseVolume(v string) (api.Mount, error) {
	parts := strings.Split(v, ":")
	var m api.Mount
	switch {
	case len(parts) == 3 && (parts[2] == "ro" || parts[2] == "rw"):
		m.ReadOnly = parts[2] == "ro"
	case len(parts) != 2:
		return m, fmt.Errorf("-v %q: want SOURCE:TARGET, SOURCE:TARGET:ro or SOURCE:TARGET:rw", v)
	}
	m.Source, m.Target = parts[0], parts[1]
	if m.Source == "" || m.Target == "" {
		return m, fmt.Errorf("-v %q: want SOURCE:TARGET, both given", v)
	}
	if !filepath.IsAbs(m.Source) {
		abs, err := filepath.Abs(m.Source)
		if err != nil {
			return m, fmt.Errorf("-v %q: %w", v, err)
		}
		m.Source = abs
	}
	return m, nil
}
