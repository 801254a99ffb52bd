package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/client"
)

// forwardSpec is one [LOCAL:]PORT of kiln port-forward.
type forwardSpec struct{ local, remote int }

func parseForward(s string) (forwardSpec, error) {
	local, remote, ok := strings.Cut(s, ":")
	if !ok {
		local, remote = s, s
	}
	l, lerr := strconv.Atoi(local)
	r, rerr := strconv.Atoi(remote)
	if lerr != nil || rerr != nil || l < 0 || l > 65535 || r < 1 || r > 65535 {
		return forwardSpec{}, fmt.Errorf("port %q: want PORT or LOCAL:PORT, ports 1 to 65535 (LOCAL 0 for any free one)", s)
	}
	return forwardSpec{l, r}, nil
}

func (c *cli) portForwardCmd() *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward SANDBOX [LOCAL:]PORT...",
		Short: "Forward local ports to ports inside a sandbox",
		Long: `Forward local TCP ports to ports inside a sandbox, as kubectl port-forward does: each
connection to a local port is one stream through kilnd to 127.0.0.1:PORT in the sandbox.
It runs until interrupted.`,
		Example: `  kiln port-forward $SB 8000            # localhost:8000 is the sandbox's port 8000
  kiln port-forward $SB 9000:8000 5432   # localhost:9000 to 8000, and 5432 to 5432
  kiln port-forward $SB 0:8000           # any free local port (printed)`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			var specs []forwardSpec
			for _, a := range args[1:] {
				s, err := parseForward(a)
				if err != nil {
					return err
				}
				specs = append(specs, s)
			}
			return c.withClient(func(cl *client.Client) error {
				sb := cl.Handle(args[0])
				if _, err := sb.Info(cmd.Context()); err != nil {
					return err
				}
				ctx := cmd.Context()
				var wg sync.WaitGroup
				var mu sync.Mutex
				var listeners []net.Listener
				defer func() {
					for _, l := range listeners {
						l.Close()
					}
					wg.Wait()
				}()
				for _, s := range specs {
					l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(s.local)))
					if err != nil {
						return err
					}
					listeners = append(listeners, l)
					if c.json {
						json.NewEncoder(c.stdout).Encode(struct {
							Local  string `json:"local"`
							Remote int    `json:"remote"`
						}{l.Addr().String(), s.remote})
					} else {
						fmt.Fprintf(c.stdout, "Forwarding from %s -> %d\n", l.Addr(), s.remote)
					}
					wg.Go(func() { c.accept(ctx, sb, l, s.remote, &mu) })
				}
				<-ctx.Done()
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local `address` to listen on")
	return cmd
}

// accept forwards each connection l accepts to port in the sandbox.
// Failures are said on stderr one at a time (mu).
func (c *cli) accept(ctx context.Context, sb *client.Sandbox, l net.Listener, port int, mu *sync.Mutex) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer conn.Close()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			remote, err := sb.DialPort(dctx, port)
			cancel()
			if err != nil {
				mu.Lock()
				fmt.Fprintf(c.stderr, "kiln: port %d: %v\n", port, err)
				mu.Unlock()
				return
			}
			defer remote.Close()
			done := make(chan struct{})
			go func() {
				io.Copy(remote, conn)
				remote.Close() // the local side closed: so does the stream
				close(done)
			}()
			io.Copy(conn, remote)
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			select {
			case <-done:
			case <-ctx.Done():
			}
		})
	}
}

func (c *cli) previewCmd() *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "preview SANDBOX PORT",
		Short: "Print a URL that reaches a port inside a sandbox without kilnd's token",
		Long: `Print a preview URL: a host of the preview's own (ID.localhost with kilnd's port, or
ID.DOMAIN with kilnd --preview-domain), and so an origin no other page of kilnd's shares, with a
token of its own in the path, which reaches the server on PORT inside the sandbox, for --ttl (at
most 7 days), until revoked. Anyone with the URL reaches that port, and nothing else of kilnd's.
Links the app makes relative to its pages work under it; absolute paths ("/static/app.js") leave it.`,
		Example: `  kiln preview $SB 8000 --ttl 30m
  kiln preview ls $SB
  kiln preview rm $SB ID`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("port %q: want a number", args[1])
			}
			return c.withClient(func(cl *client.Client) error {
				p, err := cl.Handle(args[0]).Preview(cmd.Context(), port, ttl)
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(p)
				}
				fmt.Fprintln(c.stdout, p.URL)
				fmt.Fprintf(c.stderr, "preview %s of port %d, until %s\n", p.ID, p.Port, p.ExpiresAt.Local().Format(time.DateTime))
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the URL works")
	ls := &cobra.Command{
		Use: "ls SANDBOX", Short: "List a sandbox's previews that have not expired", Args: cobra.ExactArgs(1),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.Handle(args[0]).Previews(cmd.Context())
				if err != nil || c.json {
					if err == nil {
						err = c.printJSON(list)
					}
					return err
				}
				fmt.Fprintln(c.stdout, "ID\tPORT\tEXPIRES")
				for _, p := range list {
					fmt.Fprintf(c.stdout, "%s\t%d\t%s\n", p.ID, p.Port, p.ExpiresAt.Local().Format(time.DateTime))
				}
				return nil
			})
		},
	}
	rm := &cobra.Command{
		Use: "rm SANDBOX ID", Short: "Revoke a preview at once", Args: cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg, previewArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				if err := cl.Handle(args[0]).RevokePreview(cmd.Context(), args[1]); err != nil {
					return err
				}
				return nil
			})
		},
	}
	cmd.AddCommand(ls, rm)
	return cmd
}
