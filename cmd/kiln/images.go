package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// imageCmd is kiln image and its subcommands. Long because cobra's
// commands are declarations: each subcommand with its flags and help stays
// in one place, as kiln image --help shows them together.
func (c *cli) imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Pull, import, list, inspect and remove the OCI images sandboxes start from"}
	pull := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from its registry",
		Long: `Pulls an image, as docker pull does, and prints its ID. Registries on loopback addresses are
reached over HTTP, others over TLS (unless kilnd --insecure-registry names them), with the
credentials of the docker config file of the user kilnd runs as.`,
		Example: `  kiln image pull busybox
  kiln image pull 127.0.0.1:5000/team/app:v2
  kiln sandbox create --image busybox`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				v := c.progressView()
				img, err := cl.PullImage(cmd.Context(), args[0], v.update)
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(img)
				}
				fmt.Fprintln(c.stdout, img.ID)
				return nil
			})
		},
	}
	imp := &cobra.Command{
		Use:   "import [FILE|-]",
		Short: "Import the images of a tar, as docker save or an OCI image layout writes it",
		Long: `Imports images from a tar (a file, or - or nothing for stdin), for a host without a registry, and
prints each one's name (or ID, if it has none).`,
		Example: `  docker save busybox:latest | kiln image import
  kiln image import app.tar`,
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
				v := c.progressView()
				imgs, err := cl.ImportImage(cmd.Context(), in, v.update)
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(imgs)
				}
				for _, img := range imgs {
					names := img.Names
					if len(names) == 0 {
						names = []string{img.ID}
					}
					fmt.Fprintln(c.stdout, strings.Join(names, " "))
				}
				return nil
			})
		},
	}
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List images, one line per name", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.Images(cmd.Context())
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(list)
				}
				w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tID\tLAYERS\tSIZE\tADDED")
				for _, img := range list {
					names := img.Names
					if len(names) == 0 {
						names = []string{"<none>"}
					}
					for _, n := range names {
						if c.output != "wide" {
							n = familiarName(n)
						}
						fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", n, imageID(img.ID), len(img.Layers), units.HumanSize(float64(img.Size)), img.Added.Local().Format(time.DateTime))
					}
				}
				return w.Flush()
			})
		},
	}
	inspect := &cobra.Command{
		Use: "inspect IMAGE", Short: "Describe an image as JSON: by name, ID or an ID's unique prefix", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				img, err := cl.Image(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return c.printJSON(img)
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm IMAGE...",
		Short: "Remove images' names, and an image with its last one (refused while a sandbox runs from it)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				var removed []api.ImageRemoval
				if c.json {
					defer func() { c.printJSON(removed) }()
				}
				for _, name := range args {
					rm, err := cl.RemoveImage(cmd.Context(), name)
					if err != nil {
						return err
					}
					removed = append(removed, rm)
					if c.json {
						continue
					}
					for _, n := range rm.Untagged {
						fmt.Fprintln(c.stdout, "Untagged:", n)
					}
					if rm.Deleted {
						fmt.Fprintln(c.stdout, "Deleted:", rm.ID)
					}
				}
				return nil
			})
		},
	}
	cmd.AddCommand(pull, imp, ls, inspect, rm)
	return cmd
}

// imageID is an image ID's first 12 hex digits, as docker shows them.
func imageID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	return id[:min(12, len(id))]
}

// progressView shows a pull's or an import's progress on stderr: a bar
// per layer, redrawn, on a terminal; elsewhere a line per layer and
// status.
type progressView struct {
	w     io.Writer
	tty   bool
	order []string                     // layers, as they came
	rows  map[string]api.ImageProgress // the last of each
	drawn int                          // lines drawn on the terminal
}

func (c *cli) progressView() *progressView {
	f, ok := c.stderr.(*os.File)
	return &progressView{w: c.stderr, tty: ok && term.IsTerminal(int(f.Fd())), rows: map[string]api.ImageProgress{}}
}

func (v *progressView) update(p api.ImageProgress) {
	last, seen := v.rows[p.Layer]
	if !seen {
		v.order = append(v.order, p.Layer)
	}
	v.rows[p.Layer] = p
	if !v.tty {
		if !seen || last.Status != p.Status {
			fmt.Fprintf(v.w, "%s: %s\n", imageID(p.Layer), p.Status)
		}
		return
	}
	if v.drawn > 0 {
		fmt.Fprintf(v.w, "\x1b[%dA", v.drawn)
	}
	for _, l := range v.order {
		fmt.Fprintf(v.w, "\x1b[2K%s\n", progressLine(v.rows[l]))
	}
	v.drawn = len(v.order)
}

// progressLine is a layer's line on a terminal.
func progressLine(p api.ImageProgress) string {
	line := fmt.Sprintf("%s  %-11s", imageID(p.Layer), p.Status)
	if p.Status == api.ImageDone || p.Status == "exists" {
		return line
	}
	if p.Total > 0 {
		const width = 30
		n := int(min(p.Bytes, p.Total) * width / p.Total)
		line += fmt.Sprintf(" [%s%s] %s / %s", strings.Repeat("=", n), strings.Repeat(" ", width-n),
			units.HumanSize(float64(p.Bytes)), units.HumanSize(float64(p.Total)))
	} else if p.Bytes > 0 {
		line += " " + units.HumanSize(float64(p.Bytes))
	}
	return line
}

// familiarName is an image's name as Docker shows it: without Docker
// Hub's registry, and without "library/" for its official images
// ("index.docker.io/library/busybox:latest" is "busybox:latest"). kilnd
// takes either; -o wide shows the whole.
func familiarName(name string) string {
	for _, hub := range []string{"index.docker.io/", "docker.io/", "registry-1.docker.io/"} {
		if rest, ok := strings.CutPrefix(name, hub); ok {
			if short, ok := strings.CutPrefix(rest, "library/"); ok && !strings.Contains(short, "/") {
				return short
			}
			return rest
		}
	}
	return name
}
