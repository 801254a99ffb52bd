package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// eventsCmd is kiln events: what happens to the sandboxes, as docker
// events shows what happens to containers.
func (c *cli) eventsCmd() *cobra.Command {
	var (
		after    int64
		filters  []string
		noFollow bool
	)
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Show what happens to the sandboxes: created, stopped (and why), started again, paused, resumed, deleted, as it happens",
		Long: `Shows the events kilnd holds (the last 16,384), then each as it happens, until interrupted;
--no-follow stops after those held. Each has a number (SEQ): kiln events --after SEQ takes up
after the last one read, missing none and repeating none. Events kilnd no longer holds are
told as a gap, with their count. With --json each is a JSON object, one a line.

--filter (-f) chooses: sandbox=SANDBOX (its id, name or prefix), type=sandbox.created|
sandbox.started|sandbox.stopped|sandbox.paused|sandbox.resumed|sandbox.deleted, and in a
cluster node=NODE (the events of sandboxes on that node).`,
		Example: `  kiln events
  kiln events --no-follow -f type=sandbox.stopped
  kiln events -f node=n2
  kiln events --after 120 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := client.EventOptions{After: after, NoFollow: noFollow}
			for _, kv := range filters {
				k, v, _ := strings.Cut(kv, "=")
				switch {
				case k == "sandbox" && v != "":
					o.Sandbox = v
				case k == "type" && v != "":
					o.Type = v
				case k == "node" && v != "":
					o.Node = v
				default:
					return usageError{fmt.Errorf("--filter %q: want sandbox=SANDBOX, type=TYPE or node=NODE", kv), cmd.CommandPath()}
				}
			}
			if after < 0 {
				return usageError{fmt.Errorf("--after %d: want the SEQ of an event, 0 or more", after), cmd.CommandPath()}
			}
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				if o.Sandbox != "" {
					info, err := cl.Handle(o.Sandbox).Info(ctx)
					if err != nil {
						return err
					}
					o.Sandbox = info.ID
				}
				enc := json.NewEncoder(c.stdout)
				for e, err := range cl.Events(ctx, o) {
					if err != nil {
						return err
					}
					if c.json {
						if err := enc.Encode(e); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintln(c.stdout, eventLine(e))
				}
				return nil
			})
		},
	}
	cmd.Flags().Int64Var(&after, "after", 0, "only the events after the one of this `SEQ`")
	cmd.Flags().StringArrayVarP(&filters, "filter", "f", nil, "choose by `KEY=VALUE`: sandbox=SANDBOX, type=TYPE, node=NODE (repeatable)")
	cmd.Flags().BoolVar(&noFollow, "no-follow", false, "stop after the events kilnd holds")
	return cmd
}

// eventLine is an event as kiln events prints it: when, its number, what,
// of which sandbox, on which node of a cluster, and why.
func eventLine(e api.Event) string {
	when := e.Time.Local().Format(time.RFC3339)
	switch {
	case e.Type == api.EventGap && e.Sandbox == "" && e.Node != "":
		return fmt.Sprintf("%s  %d  gap: %d events of node %s never reached the cluster", when, e.Seq, e.Lost, e.Node)
	case e.Type == api.EventGap && e.Sandbox == "":
		return fmt.Sprintf("%s  %d  gap: %d events before this one are no longer kept", when, e.Seq, e.Lost)
	}
	s := fmt.Sprintf("%s  %d  %s  %s", when, e.Seq, e.Type, api.ShortID(e.Sandbox))
	if e.Name != "" {
		s += " (" + e.Name + ")"
	}
	if e.Node != "" {
		s += " on " + e.Node
	}
	if p := e.Process; p != nil {
		s += "  " + api.ShortProcessID(p.ID) + " " + commandLine(p.Command, p.Args)
		if e.Type == api.EventProcessExited {
			s += ": " + strings.TrimPrefix(p.Exit.String(), "process ")
			for _, name := range slices.Sorted(maps.Keys(p.Streams)) {
				st := p.Streams[name]
				s += fmt.Sprintf(", %s %d bytes", name, st.TotalBytes)
				if st.CaptureDropped > 0 {
					s += fmt.Sprintf(" (%d not logged)", st.CaptureDropped)
				}
			}
		}
	}
	if e.Type == api.EventGap {
		s += fmt.Sprintf(": %d of its process events not kept", e.Lost)
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}
