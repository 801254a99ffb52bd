package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// exitError carries the exit code a command ends with (the process's).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// kiln's own exit codes, Docker's, told apart from the process's by the
// error that ended kiln, never by its text.
const (
	exitKiln          = 125 // kiln's own failure: usage, no kilnd, a refusal by kilnd
	exitNotExecutable = 126 // the command is there and cannot be run
	exitNotFound      = 127 // no such command
	exitInterrupted   = 130 // Ctrl-C (SIGINT) or SIGTERM ended kiln itself
)

// exitCodesHelp is the exit codes' part of kiln --help.
const exitCodesHelp = `
Exit codes: a command run in the foreground (run, exec, shell, wait, logs -f) gives its own
exit code, or 128+N when signal N killed it. kiln's own are:
  123  the command's output could not all be delivered (how much was lost is said)
  125  kiln failed: bad usage, kilnd not reachable, or kilnd refused the request
  126  the command cannot be run (not executable, a directory, not a program)
  127  the command was not found
  130  kiln was interrupted (Ctrl-C); the process runs on (run --rm removes it with its sandbox)`

// usageError is bad usage: unknown commands and flags, wrong arguments.
type usageError struct {
	err error
	cmd string // the command whose --help to read
}

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage makes a command's argument checks say their errors are usage, and
// a group of commands refuse a command it does not have (cobra would show
// its help and exit 0).
func usage(cmd *cobra.Command) {
	if !cmd.Runnable() && cmd.HasSubCommands() && cmd.HasParent() {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q", args[0], c.CommandPath()), c.CommandPath()}
			}
			return c.Help()
		}
	}
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return usageError{err, c.CommandPath()}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		usage(sub)
	}
}

// cli holds what every command shares.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	stateDir, addr string
	output         string
	json           bool
	removing       bool // kiln run --rm: the sandbox goes when kiln does
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
	root.PersistentFlags().BoolVar(&c.json, "json", false, "print JSON for scripts (errors too, on stderr); the same as -o json")
	root.PersistentFlags().StringVarP(&c.output, "output", "o", "", "output `format`: table (the default), wide (more columns, nothing truncated) or json")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		switch c.output {
		case "", "table", "wide":
		case "json":
			c.json = true
		default:
			return usageError{fmt.Errorf("--output %q: want table, wide or json", c.output), cmd.CommandPath()}
		}
		return nil
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageError{err, cmd.CommandPath()} })
	root.SetHelpTemplate(root.HelpTemplate() + "{{if not .HasParent}}" + exitCodesHelp + "\n{{end}}")
	addCommands(root, args, c.commands())
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	usage(root)
	// An unknown command is found before anything runs, as cobra finds it;
	// its error is JSON if the flags ask, though cobra parses none then.
	err := func() error {
		// (cobra adds its shell completion's hidden commands as it runs.)
		completing := len(args) > 0 && (args[0] == cobra.ShellCompRequestCmd || args[0] == cobra.ShellCompNoDescRequestCmd)
		if _, _, err := root.Find(args); err != nil && !completing {
			f := pflag.NewFlagSet("kiln", pflag.ContinueOnError)
			f.ParseErrorsAllowlist.UnknownFlags = true
			f.SetOutput(io.Discard)
			f.BoolVar(&c.json, "json", false, "")
			f.StringVarP(&c.output, "output", "o", "", "")
			f.Parse(args)
			c.json = c.json || c.output == "json"
			return usageError{err, "kiln"}
		}
		return root.ExecuteContext(ctx)
	}()
	code := exitCodeOf(ctx, err)
	// A process's own exit code, and Ctrl-C, need no more words.
	if code != 0 && !errors.As(err, new(exitError)) && code != exitInterrupted {
		c.sayError(err, code)
	}
	return code
}

// command makes kiln's top-level commands that names (theirs and their
// aliases) reach.
type command struct {
	names []string
	make  func() []*cobra.Command
}

// commands are kiln's top-level commands, each made only when wanted
// (TestCommandNames holds the names to what each makes).
func (c *cli) commands() []command {
	one := func(names string, make func() *cobra.Command) command {
		return command{strings.Fields(names), func() []*cobra.Command { return []*cobra.Command{make()} }}
	}
	return []command{
		{[]string{"stop", "start", "restart", "pause", "resume", "unpause"}, c.lifecycleCmds},
		one("prune", c.pruneCmd), one("top", c.topCmd), one("snapshot", c.snapshotCmd),
		one("rollback", c.rollbackCmd), one("fork", c.forkCmd), one("node", c.nodeCmd),
		one("sandbox", c.sandboxCmd), one("ls list", c.lsCmd), one("events", c.eventsCmd),
		one("exec", c.execCmd), one("logs", c.logsCmd), one("attach", c.attachCmd),
		one("ps", c.psCmd), one("wait", c.waitCmd), one("kill", c.killCmd), one("shell", c.shellCmd),
		one("run", c.runCmd), one("cp", c.cpCmd), one("port-forward", c.portForwardCmd),
		one("preview", c.previewCmd), one("watch", c.watchCmd), one("image", c.imageCmd),
		one("stats", c.statsCmd), one("mcp", c.mcpCmd), one("version", c.versionCmd),
	}
}

// addCommands adds to root the command args[0] names, alone, when it
// names one: a run of kiln uses one command, and making all of them with
// their flags took about an eighth of the CPU of kiln's start (profiled
// over kiln run --rm). Anything else (no command, a flag first, help,
// completion, a name kiln does not have) gets them all, for cobra to
// list, complete or suggest from.
func addCommands(root *cobra.Command, args []string, cmds []command) {
	if len(args) > 0 {
		for _, cmd := range cmds {
			if slices.Contains(cmd.names, args[0]) {
				root.AddCommand(cmd.make()...)
				return
			}
		}
	}
	for _, cmd := range cmds {
		root.AddCommand(cmd.make()...)
	}
}

// exitCodeOf is the exit code err ends kiln with, decided from the
// error's type and kilnd's code, never its text.
func exitCodeOf(ctx context.Context, err error) int {
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case ctx.Err() != nil:
		return exitInterrupted
	case client.IsCommandNotFound(err):
		return exitNotFound
	case client.IsNotExecutable(err):
		return exitNotExecutable
	}
	return exitKiln
}

// sayError writes err on stderr, as a line for people with what to do, or
// with --json as {"error": {"code", "message", "exit_code"}}: kilnd's code
// when kilnd refused, else usage, unavailable or internal.
func (c *cli) sayError(err error, code int) {
	var ue usageError
	isUsage := errors.As(err, &ue)
	if c.json {
		kind := "internal"
		var ce *client.Error
		switch {
		case errors.As(err, &ce):
			kind = ce.Code
		case isUsage:
			kind = "usage"
		case isUnreachable(err):
			kind = api.CodeUnavailable
		}
		enc := json.NewEncoder(c.stderr)
		enc.Encode(map[string]any{"error": map[string]any{"code": kind, "message": err.Error(), "exit_code": code}})
		return
	}
	// One prefix: kiln's. kilnd's own ("kilnd: "), which the SDK puts
	// on kilnd's answers, would only say again who is speaking.
	fmt.Fprintln(c.stderr, "kiln:", strings.ReplaceAll(explain(err), "kilnd: ", ""))
	if isUsage {
		fmt.Fprintf(c.stderr, "See '%s --help'.\n", ue.cmd)
	}
}

// isUnreachable reports kilnd not answering at all: nothing listens, or
// its socket is not there.
func isUnreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// explain adds what to do to the errors people meet first.
func explain(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, client.ErrNoToken):
		return msg + "\n  set $KILN_TOKEN to kilnd's token (kilnd logs its file at start: token=...), or --state-dir to a directory holding it"
	case isUnreachable(err) && errors.Is(err, syscall.EACCES):
		return msg + "\n  kilnd's socket is root's: run kiln with sudo, or use --addr with the token"
	case isUnreachable(err):
		return msg + "\n  is kilnd running? Start it with: sudo kilnd (or point --state-dir / --addr at it)"
	case client.IsUnauthenticated(err):
		return msg + "\n  the token comes from $KILN_TOKEN, else STATE_DIR/token"
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

// exitCode is the shell's convention, which the exit's code follows: the
// code, or 128 + the signal.
func exitCode(e client.Exit) int {
	if e.Known() && e.Code() >= 0 {
		return e.Code()
	}
	return 1
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// sizeOrNone is a limit in bytes as docker shows sizes, or "none".
func sizeOrNone(n int64) string {
	if n <= 0 {
		return "none"
	}
	return units.BytesSize(float64(n))
}

func numOrNone[T int64 | float64](n T) string {
	if n <= 0 {
		return "none"
	}
	return strconv.FormatFloat(float64(n), 'f', -1, 64)
}

// limitFlags adds the flags of a sandbox's limits to cmd; the function
// returns what they ask for. A limit not given is kilnd's default; 0 is
// none.
func limitFlags(cmd *cobra.Command) func(*pflag.FlagSet) (api.LimitsRequest, error) {
	cmd.Flags().String("memory", "", "memory limit (e.g. 512M; 0 for none; default kilnd's, 1GiB)")
	cmd.Flags().String("disk", "", "disk quota for /workspace and the image's writable layer (e.g. 2G; 0 for none; default kilnd's, 10GiB)")
	cmd.Flags().Int64("pids", 0, "process limit (0 for none; default kilnd's, 1024)")
	cmd.Flags().Float64("cpus", 0, "CPU limit in cores (0 for none; default kilnd's, 1)")
	return func(f *pflag.FlagSet) (l api.LimitsRequest, err error) {
		if l.MemoryBytes, err = sizeFlag(f, "memory"); err != nil {
			return l, err
		}
		if l.DiskBytes, err = sizeFlag(f, "disk"); err != nil {
			return l, err
		}
		if f.Changed("pids") {
			n, _ := f.GetInt64("pids")
			l.Pids = &n
		}
		if f.Changed("cpus") {
			n, _ := f.GetFloat64("cpus")
			l.CPUs = &n
		}
		return l, nil
	}
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

// onOOMFlag adds --on-oom, what happens past the memory limit, to cmd.
func onOOMFlag(cmd *cobra.Command, to *string) {
	cmd.Flags().StringVar(to, "on-oom", "", "past the memory limit: end_sandbox (the default: every process ends, the sandbox stops)\nor kill_process (the kernel kills the process using the most; namespaces only)")
}

// sandboxCmd is kiln sandbox and its subcommands. Long because cobra's
// commands are declarations: each subcommand with its flags, examples and
// help stays in one place, as kiln sandbox --help shows them together.
func (c *cli) sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sandbox", Short: "Create, list, inspect, stop, start, pause and remove sandboxes"}
	var o api.CreateSandbox
	var network func() *api.Network
	var limits func(*pflag.FlagSet) (api.LimitsRequest, error)
	var labels func() (map[string]string, error)
	var volumes func() ([]api.Mount, error)
	var placement func() error
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its id",
		Example: `  kiln sandbox create
  kiln sandbox create --name web                # then kiln exec web -- …, kiln shell web
  kiln sandbox create -l team=web -l env=dev    # kiln ls -f label=team=web finds it
  kiln sandbox create --memory 512M --pids 256 --cpus 1.5 --idle-timeout 10m
  kiln sandbox create --runtime gvisor
  kiln sandbox create --image busybox
  kiln sandbox create -v ./data:/data:ro -v /srv/out:/out   # below kilnd's --allow-mount
  kiln sandbox create --egress allow --egress-deny 203.0.113.0/24
  kiln sandbox create --egress-allow 192.0.2.10 --egress-allow 198.51.100.0/24
  kiln sandbox create --node b                  # in a cluster: on node b
  kiln sandbox create --constraint zone=a       # on the least loaded node labelled zone=a`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := placement(); err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			if o.Limits, err = limits(cmd.Flags()); err != nil {
				return err
			}
			if o.IdleTimeoutSeconds, o.TTLSeconds, err = lifetimes(cmd); err != nil {
				return err
			}
			o.Network = network()
			if o.Labels, err = labels(); err != nil {
				return err
			}
			if o.Mounts, err = volumes(); err != nil {
				return err
			}
			sb, err := cl.CreateSandbox(cmd.Context(), o)
			if err != nil {
				return err
			}
			info := sb.Described
			if c.json {
				return c.printJSON(info)
			}
			fmt.Fprintln(c.stdout, info.ID)
			return nil
		},
	}
	create.Flags().StringVar(&o.Snapshot, "from", "", "a `snapshot` the sandbox is made from (kiln snapshot): its files, and unless flags say otherwise its image, limits, network policy and labels")
	create.Flags().StringVar(&o.Name, "name", "", "a `name` that finds the sandbox wherever kiln takes one, until it is removed: a-z, 0-9 and '-'\n(a DNS label), also its hostname")
	create.Flags().StringVar(&o.Hostname, "hostname", "", "the sandbox's hostname (default its name, or kiln- and the end of its id)")
	create.Flags().StringVar(&o.Image, "image", "", "an `image` kilnd has (kiln image pull) as the root, its config the defaults of every process")
	create.Flags().StringVar(&o.Rootfs, "rootfs", "", "a root filesystem: a `directory` in kilnd's images directory, instead of the host's /usr and /etc")
	create.Flags().StringVar(&o.Runtime, "runtime", "", "the kind of sandbox: namespaces (the default) or gvisor (gVisor's kernel between the sandbox\nand the host's; kilnd --runtimes says which this host has)")
	limits = limitFlags(create)
	onOOMFlag(create, &o.OnOOM)
	lifetimeFlags(create)
	network = networkFlags(create)
	labels = labelFlag(create)
	volumes = volumeFlag(create)
	placement = placementFlags(create, &o)
	inspect := &cobra.Command{
		Use: "inspect SANDBOX", Short: "Describe a sandbox as JSON", Args: cobra.ExactArgs(1),
		ValidArgsFunction: c.complete(sandboxArg),
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
		ValidArgsFunction: c.completeEach(sandboxArg),
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
	// docker rm -f is a habit: a sandbox is removed running or not.
	rm.Flags().BoolP("force", "f", false, "accepted for Docker's habit: a running sandbox is removed anyway")
	var so startFlags
	es := &cobra.Command{
		Use:   "exec-stream SANDBOX -- CMD [ARG...]",
		Short: "Start a detached process and print its id; its output is kept whether or not anyone watches",
		Example: `  P=$(kiln sandbox exec-stream $SB -- sh -c 'for i in 1 2 3; do echo line-$i; sleep 1; done')
  kiln logs -f $SB $P`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			o, err := so.options(commandOf(args[1:]))
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
	cmd.AddCommand(create, c.lsCmd(), inspect, rm, es)
	cmd.AddCommand(c.lifecycleCmds()...)
	cmd.AddCommand(c.pruneCmd())
	return cmd
}

// startFlags are a process's options on the command line.
type startFlags struct {
	env        []string
	envFiles   []string
	cwd        string
	user       string
	stdin      bool
	capture    bool
	drain      time.Duration
	foreground bool // kiln reads its output to the end: held, bytes
	tty        bool // on a terminal (foreground only)
	detachKeys string
	overflow   string
}

// add adds the flags: of a detached process (kiln sandbox exec-stream) or
// of one run in the foreground (kiln exec, kiln run).
func (f *startFlags) add(cmd *cobra.Command, detached bool) {
	// Everything after the sandbox (and after run's first argument) is
	// the command's, its flags too, as docker exec and docker run have it:
	// kiln exec web ls -la.
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable: `NAME=VALUE`, or NAME to pass kiln's own (repeatable)")
	cmd.Flags().StringArrayVar(&f.envFiles, "env-file", nil, "read environment variables from a `file` of NAME=VALUE lines (# comments; repeatable)")
	cmd.Flags().StringVarP(&f.cwd, "workdir", "w", "", "working directory (default the image's, or /workspace)")
	cmd.Flags().StringVarP(&f.user, "user", "u", "", "run as a user of the sandbox's: `NAME`, UID, NAME:GROUP or UID:GID (default the image's, or root)")
	cmd.Flags().BoolVar(&f.capture, "capture", false, "keep the output durably in the sandbox's captured logs")
	cmd.Flags().DurationVar(&f.drain, "drain", 0, "how long the output is read after the command exits while something it left behind still writes\nto it, at most 1m (default kilnd's, 3s); past it the output is cut")
	f.foreground = !detached
	if detached {
		cmd.Flags().BoolVarP(&f.stdin, "stdin", "i", false, "open a stdin pipe (write with kiln attach --stdin)")
	} else {
		cmd.Flags().BoolVarP(&f.stdin, "interactive", "i", false, "send kiln's stdin to the command (end of input closes its stdin; without -i it is closed)")
		cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run on a terminal; with -i, interactively (kiln's stdin must be a terminal)")
		cmd.Flags().StringVar(&f.detachKeys, "detach-keys", defaultDetachKeys, "with -it, the `keys` that detach, leaving the command running: characters or ctrl-<key>, comma separated")
		addOverflow(cmd, &f.overflow)
	}
}

// commandOf is the command in args, the arguments after the sandbox: a
// "--" before it, which the flags' parser keeps once the sandbox has
// ended the flags, is not part of it.
func commandOf(args []string) []string {
	if len(args) > 0 && args[0] == "--" {
		return args[1:]
	}
	return args
}

// parse is options, and the detach keys, with their errors as usage.
func (f *startFlags) parse(cmd *cobra.Command, argv []string) (client.StartOptions, []byte, error) {
	o, err := f.options(argv)
	if err != nil {
		return o, nil, usageError{err, cmd.CommandPath()}
	}
	keys, err := parseDetachKeys(f.detachKeys)
	if err != nil {
		return o, nil, usageError{err, cmd.CommandPath()}
	}
	return o, keys, nil
}

// copyChunk is how much output kiln takes in one chunk: it copies the
// output on to its own at once, so it takes whole messages, one write
// each, in the handle's own buffer (Borrow).
const copyChunk = client.MaxChunkCeiling

// options are the process's start options; an empty argv runs the image's
// command.
func (f *startFlags) options(argv []string) (client.StartOptions, error) {
	o := client.StartOptions{Cwd: f.cwd, User: f.user, Stdin: f.stdin, Capture: f.capture, ChunkBytes: copyChunk, Borrow: true}
	if len(argv) > 0 {
		o.Command, o.Args = argv[0], argv[1:]
	}
	var err error
	if o.DrainMS, err = drainMS(f.drain); err != nil {
		return o, err
	}
	if f.foreground {
		o.Flow, o.Format = api.FlowBlock, client.Bytes
		if o.Overflow, err = parseOverflow(f.overflow); err != nil {
			return o, err
		}
	} else {
		// Detached: its output is kept whether or not anyone watches, and
		// the process never waits for a reader.
		o.Flow = api.FlowDrop
	}
	env, err := f.environment()
	if err != nil {
		return o, err
	}
	if len(env) > 0 {
		o.Env = env
	}
	return o, nil
}

// environment is what --env-file and --env set, in that order (so --env
// wins), as docker run reads them: NAME=VALUE sets NAME; NAME alone
// passes kiln's own NAME on, if kiln has one. In a file, a line that is
// empty or begins with # is skipped.
func (f *startFlags) environment() (map[string]string, error) {
	env := map[string]string{}
	set := func(kv, from string) error {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" || strings.ContainsAny(k, " \t") {
			return fmt.Errorf("%s %q: want NAME=VALUE, or NAME to pass kiln's own on", from, kv)
		}
		if !ok {
			if v, ok = os.LookupEnv(k); !ok {
				return nil
			}
		}
		env[k] = v
		return nil
	}
	for _, name := range f.envFiles {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("--env-file: %w", err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSuffix(line, "\r")
			if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimLeft(line, " \t"), "#") {
				continue
			}
			if err := set(line, fmt.Sprintf("--env-file %s, line %d:", name, i+1)); err != nil {
				return nil, err
			}
		}
	}
	for _, kv := range f.env {
		if err := set(kv, "--env"); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// drainMS is --drain in the API's milliseconds: 0 (kilnd's default) to
// api.MaxDrainMS; a duration shorter than a millisecond is one.
func drainMS(d time.Duration) (int64, error) {
	if d < 0 || d > api.MaxDrainMS*time.Millisecond {
		return 0, fmt.Errorf("--drain %v: want 0 (kilnd's default, %v) to %v", d, api.DefaultDrainMS*time.Millisecond, api.MaxDrainMS*time.Millisecond)
	}
	ms := d.Milliseconds()
	if d > 0 && ms == 0 {
		ms = 1
	}
	return ms, nil
}

// addOverflow adds --overflow to a command that reads a process's output.
func addOverflow(cmd *cobra.Command, v *string) {
	cmd.Flags().StringVar(v, "overflow", "fail", "what kiln does when output was lost before it read it, a `mode`: fail (exit 123, saying how\nmany bytes of which stream) or report (a line on stderr for each loss, and go on)")
}

// parseOverflow reads --overflow.
func parseOverflow(v string) (client.Overflow, error) {
	switch v {
	case "fail", "":
		return client.OverflowFail, nil
	case "report":
		return client.OverflowReport, nil
	}
	return 0, fmt.Errorf("--overflow %q: want fail or report", v)
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
