package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// exitError carries the exit code a command ends with (the process's).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// cli holds what every command shares.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	stateDir, addr string
	json           bool
}

func (c *cli) client() (*client.Client, error) {
	return client.New(client.Options{StateDir: c.stateDir, Addr: c.addr})
}

// run is the whole command line; it returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "kiln",
		Short: "Run commands in sandboxes and watch their output from anywhere",
		Long: `kiln talks to kilnd: on its unix socket (STATE_DIR/kilnd.sock), or with --addr over TCP
with the token from STATE_DIR/token (or $KILN_TOKEN).

Output is kept whether or not anyone watches: attach later, from any number of terminals,
and get everything from the beginning, then the live tail. What could not be kept is said,
never hidden.`,
		Example: `  kiln run -- sh -c 'echo hello; exit 7'       # a sandbox, a process, its output and exit code
  SB=$(kiln sandbox create)
  P=$(kiln sandbox exec-stream $SB -- make -j2)
  kiln logs -f $SB $P                           # replay, then live, then the exit
  kiln shell $SB                                # an interactive terminal`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&c.stateDir, "state-dir", envOr(client.StateDirEnv, client.DefaultStateDir), "kilnd's state `directory` (env "+client.StateDirEnv+")")
	root.PersistentFlags().StringVar(&c.addr, "addr", os.Getenv(client.AddrEnv), "kilnd's `address`: host:port, tcp://host:port or http://host:port (TCP, with the token), or\nunix:///path (a socket); default the state directory's socket (env "+client.AddrEnv+")")
	root.PersistentFlags().BoolVar(&c.json, "json", false, "print JSON for scripts")
	root.AddCommand(c.sandboxCmd(), c.execCmd(), c.logsCmd(), c.attachCmd(), c.psCmd(), c.waitCmd(), c.killCmd(), c.shellCmd(), c.runCmd(), c.cpCmd(), c.portForwardCmd(), c.previewCmd(), c.watchCmd(), c.imageCmd(), c.statsCmd())
	err := root.ExecuteContext(ctx)
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	fmt.Fprintln(stderr, "kiln:", explain(err))
	if strings.Contains(err.Error(), "unknown command") || strings.Contains(err.Error(), "flag") || strings.Contains(err.Error(), "arg") {
		return 2
	}
	return 1
}

// explain adds what to do to the errors people meet first.
func explain(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED):
		return msg + "\n  is kilnd running? Start it with: sudo kilnd (or point --state-dir / --addr at it)"
	case errors.Is(err, syscall.EACCES):
		return msg + "\n  kilnd's socket is root's: run kiln with sudo, or use --addr with the token"
	}
	return msg
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// sizeFlag is a size flag's bytes when it was given (0: none), nil when not.
func sizeFlag(f *pflag.FlagSet, name string) (*int64, error) {
	if !f.Changed(name) {
		return nil, nil
	}
	v, _ := f.GetString(name)
	n := int64(0)
	if v != "0" {
		var err error
		if n, err = parseBytes(v); err != nil {
			return nil, err
		}
	}
	return &n, nil
}

// exitCode is the shell's convention: the code, or 128 + the signal.
func exitCode(e api.Exit) int {
	if e.ExitCode != nil {
		return *e.ExitCode
	}
	if sig := unix.SignalNum("SIG" + e.Signal); sig != 0 {
		return 128 + int(sig)
	}
	return 1
}

// networkFlags adds the flags of a sandbox's network to cmd; the function
// returns what they ask for (nil: loopback only).
func networkFlags(cmd *cobra.Command) func() *api.Network {
	var n api.Network
	f := cmd.Flags()
	f.StringVar(&n.Egress, "egress", "", "what the sandbox may reach beyond its loopback, a `mode`: none (the default: only --egress-allow)\nor allow (the internet; not the host, private ranges or --egress-deny)")
	f.StringArrayVar(&n.Allow, "egress-allow", nil, "an IPv4 `CIDR` the sandbox may reach, private ones too (repeatable); gives it a network")
	f.StringArrayVar(&n.Deny, "egress-deny", nil, "an IPv4 `CIDR` the sandbox may not reach, whatever else allows it (repeatable)")
	return func() *api.Network {
		if n.Egress == "" && len(n.Allow) == 0 && len(n.Deny) == 0 {
			return nil
		}
		return &n
	}
}

func (c *cli) sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Short: "Create, list, inspect and remove sandboxes"}
	var o api.CreateSandbox
	var network func() *api.Network
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its id",
		Example: `  kiln sandbox create
  kiln sandbox create --memory 512M --pids 256 --cpus 1.5 --idle-timeout 10m
  kiln sandbox create --runtime gvisor
  kiln sandbox create --image busybox
  kiln sandbox create --egress allow --egress-deny 203.0.113.0/24
  kiln sandbox create --egress-allow 192.0.2.10 --egress-allow 198.51.100.0/24`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			// A limit not given is kilnd's default; 0 is none.
			f := cmd.Flags()
			if o.Limits.MemoryBytes, err = sizeFlag(f, "memory"); err != nil {
				return err
			}
			if o.Limits.DiskBytes, err = sizeFlag(f, "disk"); err != nil {
				return err
			}
			if f.Changed("pids") {
				n, _ := f.GetInt64("pids")
				o.Limits.Pids = &n
			}
			if f.Changed("cpus") {
				n, _ := f.GetFloat64("cpus")
				o.Limits.CPUs = &n
			}
			idle, _ := cmd.Flags().GetDuration("idle-timeout")
			o.IdleTimeoutSeconds = int64(idle / time.Second)
			o.Network = network()
			_, info, err := cl.CreateSandbox(cmd.Context(), o)
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(info)
			}
			fmt.Fprintln(c.stdout, info.ID)
			return nil
		},
	}
	create.Flags().StringVar(&o.Hostname, "hostname", "", "the sandbox's hostname")
	create.Flags().StringVar(&o.Image, "image", "", "an `image` kilnd has (kiln image pull) as the root, its config the defaults of every process")
	create.Flags().StringVar(&o.Rootfs, "rootfs", "", "a root filesystem: a `directory` in kilnd's images directory, instead of the host's /usr and /etc")
	create.Flags().StringVar(&o.Runtime, "runtime", "", "the kind of sandbox: namespaces (the default) or gvisor (gVisor's kernel between the sandbox\nand the host's; kilnd --runtimes says which this host has)")
	create.Flags().String("memory", "", "memory limit (e.g. 512M; 0 for none; default kilnd's, 1GiB)")
	create.Flags().String("disk", "", "disk quota for /workspace and the image's writable layer (e.g. 2G; 0 for none; default kilnd's, 10GiB)")
	create.Flags().Int64("pids", 0, "process limit (0 for none; default kilnd's, 1024)")
	create.Flags().Float64("cpus", 0, "CPU limit in cores (0 for none; default kilnd's, 1)")
	create.Flags().Duration("idle-timeout", 0, "delete the sandbox (keeping its logs) after this long unused")
	network = networkFlags(create)
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List sandboxes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			list, err := cl.Sandboxes(cmd.Context())
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(list)
			}
			w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tSTATE\tRUNTIME\tCREATED\tHOSTNAME")
			for _, s := range list {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.State, s.Runtime, s.CreatedAt.Local().Format(time.DateTime), s.Hostname)
			}
			return w.Flush()
		},
	}
	inspect := &cobra.Command{
		Use: "inspect SANDBOX", Short: "Describe a sandbox as JSON", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			info, err := cl.Handle(args[0]).Info(cmd.Context())
			if err != nil {
				return err
			}
			return c.printJSON(info)
		},
	}
	var removeLogs bool
	rm := &cobra.Command{
		Use: "rm SANDBOX...", Aliases: []string{"remove"}, Short: "Remove sandboxes: everything in them is killed, their captured logs kept", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			var errs []error
			for _, id := range args {
				if err := cl.Handle(id).Delete(cmd.Context(), removeLogs); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
				}
			}
			return errors.Join(errs...)
		},
	}
	rm.Flags().BoolVar(&removeLogs, "remove-logs", false, "remove the captured logs too")
	var so startFlags
	es := &cobra.Command{
		Use:   "exec-stream SANDBOX -- CMD [ARG...]",
		Short: "Start a detached process and print its id; its output is kept whether or not anyone watches",
		Example: `  P=$(kiln sandbox exec-stream $SB -- sh -c 'for i in 1 2 3; do echo line-$i; sleep 1; done')
  kiln logs -f $SB $P`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			o, err := so.options(args[1:])
			if err != nil {
				return err
			}
			p, err := cl.Handle(args[0]).Start(cmd.Context(), o)
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(api.Started{ID: p.ID})
			}
			fmt.Fprintln(c.stdout, p.ID)
			return nil
		},
	}
	so.add(es, true)
	cmd.AddCommand(create, ls, inspect, rm, es)
	return cmd
}

// startFlags are a process's options on the command line.
type startFlags struct {
	env        []string
	cwd        string
	user       string
	stdin      bool
	capture    bool
	foreground bool // kiln reads its output to the end: held, bytes
}

// add adds the flags: of a detached process (kiln sandbox exec-stream) or
// of one run in the foreground (kiln exec, kiln run).
func (f *startFlags) add(cmd *cobra.Command, detached bool) {
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable (`NAME=VALUE`, repeatable)")
	cmd.Flags().StringVarP(&f.cwd, "workdir", "w", "", "working directory (default the image's, or /workspace)")
	cmd.Flags().StringVarP(&f.user, "user", "u", "", "run as a user of the sandbox's: `NAME`, UID, NAME:GROUP or UID:GID (default the image's, or root)")
	cmd.Flags().BoolVar(&f.capture, "capture", false, "keep the output durably in the sandbox's captured logs")
	f.foreground = !detached
	if detached {
		cmd.Flags().BoolVarP(&f.stdin, "stdin", "i", false, "open a stdin pipe (write with kiln attach --stdin)")
	} else {
		cmd.Flags().BoolVarP(&f.stdin, "interactive", "i", false, "send kiln's stdin to the command (end of input closes its stdin; without -i it is closed)")
	}
}

// options are the process's start options; an empty argv runs the image's
// command.
func (f *startFlags) options(argv []string) (client.StartOptions, error) {
	o := client.StartOptions{Cwd: f.cwd, User: f.user, Stdin: f.stdin, Capture: f.capture}
	if len(argv) > 0 {
		o.Command, o.Args = argv[0], argv[1:]
	}
	if f.foreground {
		o.Flow, o.Format = api.FlowBlock, client.Bytes
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return o, fmt.Errorf("--env %q: want NAME=VALUE", kv)
		}
		if o.Env == nil {
			o.Env = map[string]string{}
		}
		o.Env[k] = v
	}
	return o, nil
}

// parseBytes reads a size as docker run --memory does: 1048576, 512m,
// 1.5G, 2GiB (binary multiples). Anything else, "2x" or "10abc", is
// refused, never read as far as it goes.
func parseBytes(s string) (int64, error) {
	n, err := units.RAMInBytes(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a byte count such as 1048576, 512M or 1.5G", s)
	}
	return n, nil
}
