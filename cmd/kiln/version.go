package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/version"
)

func (c *cli) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show kiln's version, and kilnd's when it answers",
		Long: `Shows the build of kiln and of the kilnd it talks to: version, commit, Go toolchain and
platform. When kilnd does not answer, kiln's own is shown, the error is said, and kiln exits 125.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			own := version.Get()
			var server *api.Version
			err := c.withClient(func(cl *client.Client) error {
				v, err := cl.ServerVersion(cmd.Context())
				if err == nil {
					server = &v
				}
				return err
			})
			if c.json {
				if err := c.printJSON(struct {
					Client api.Version  `json:"client"`
					Server *api.Version `json:"server,omitempty"`
				}{own, server}); err != nil {
					return err
				}
				return err
			}
			c.printVersion("Client", own)
			if server != nil {
				c.printVersion("Server", *server)
			}
			return err
		},
	}
}

func (c *cli) printVersion(who string, v api.Version) {
	rev := v.Revision
	if rev == "" {
		rev = "(unknown)"
	} else if v.Modified {
		rev += " (modified)"
	}
	fmt.Fprintf(c.stdout, "%s:\n  Version:     %s\n  Commit:      %s\n  Go version:  %s\n  Platform:    %s\n", who, v.Version, rev, v.GoVersion, v.Platform)
}
