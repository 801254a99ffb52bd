package main

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// pruneCmd is kiln prune, as docker container prune: every stopped
// sandbox (of those --filter chooses) deleted, after a question unless
// -f.
func (c *cli) pruneCmd() *cobra.Command {
	var force, logs bool
	var filters []string
	cmd := &cobra.Command{
		Use:   "prune [-f] [--filter KEY=VALUE]... [--logs]",
		Short: "Delete every stopped sandbox (those --filter chooses)",
		Long: `Deletes every stopped sandbox, as docker container prune removes stopped containers: kiln asks
first, unless -f. Running sandboxes are left alone. --filter chooses among the stopped ones as kiln ls
does (label=KEY[=VALUE], name=, image=, runtime=). Their captured logs stay for kilnd's
--keep-deleted, as after kiln sandbox rm, unless --logs. Each sandbox deleted is printed by its id.`,
		Example: `  kiln prune
  kiln prune -f --filter label=ci=true --logs`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := sandboxFilter(filters)
			if err != nil {
				return usageError{err, cmd.CommandPath()}
			}
			if f.State != "" {
				return usageError{errors.New("--filter status: kiln prune deletes the stopped sandboxes only"), cmd.CommandPath()}
			}
			f.State = api.SandboxStopped
			if !force && !c.confirm("WARNING! This deletes every stopped sandbox"+filtered(filters)+". Are you sure you want to continue? [y/N] ") {
				return nil
			}
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.SandboxesWhere(cmd.Context(), f)
				if err != nil {
					return err
				}
				var errs []error
				deleted := []string{}
				for _, s := range list {
					if err := cl.Handle(s.ID).Delete(cmd.Context(), logs); err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", api.ShortID(s.ID), err))
						continue
					}
					deleted = append(deleted, s.ID)
				}
				if c.json {
					if err := c.printJSON(deleted); err != nil {
						return err
					}
				} else {
					for _, id := range deleted {
						fmt.Fprintln(c.stdout, id)
					}
					fmt.Fprintf(c.stderr, "%d stopped sandboxes deleted\n", len(deleted))
				}
				return errors.Join(errs...)
			})
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "do not ask first")
	cmd.Flags().BoolVar(&logs, "logs", false, "delete their captured logs too")
	cmd.Flags().StringArrayVar(&filters, "filter", nil, "choose among the stopped sandboxes by `KEY=VALUE`: label=, name=, image=, runtime=, node= (repeatable)")
	return cmd
}

// filtered says which sandboxes filters choose, for the question.
func filtered(filters []string) string {
	if len(filters) == 0 {
		return ""
	}
	return " with " + strings.Join(filters, " and ")
}

// confirm asks question and says whether the answer is yes; no answer
// (the end of stdin) is no.
func (c *cli) confirm(question string) bool {
	fmt.Fprint(c.stderr, question)
	line, _ := bufio.NewReader(c.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	fmt.Fprintln(c.stderr, "nothing deleted")
	return false
}
