package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// foreground follows a command started in the foreground (held output,
// bytes), sending it kiln's stdin when asked to.
func (c *cli) foreground(ctx context.Context, p *client.Process, input bool) error {
	if input {
		go c.pumpInput(ctx, p, false)
	}
	return c.follow(ctx, p, true)
}

// copyOutput writes a process's output as it comes, stdout and terminal
// output to stdout and stderr to stderr, and says what was lost. A broken
// connection is resumed from the last byte written, nothing repeated, for
// as long as resume says; a held process's output waits for kiln meanwhile.
func (c *cli) copyOutput(ctx context.Context, p *client.Process) error {
	return c.copyUntil(ctx, p, nil)
}

// copyUntil is copyOutput that stops, if until is set, once until says so
// of where the streams stand.
func (c *cli) copyUntil(ctx context.Context, p *client.Process, until func(pos map[string]int64) bool) error {
	pos := map[string]int64{}
	if until != nil && until(pos) {
		return nil
	}
	r := resume
	said := ""
	r.OnResume = func(err error, wait time.Duration) {
		// The cause once, while it stays the same: the wait each time.
		if msg := err.Error(); msg != said {
			fmt.Fprintf(c.stderr, "kiln: %s\n", msg)
			said = msg
		}
		fmt.Fprintf(c.stderr, "kiln: resuming in %v\n", wait)
	}
	for ch, err := range p.Follow(ctx, r) {
		if err != nil {
			return err
		}
		if ch.Lost > 0 {
			fmt.Fprintf(c.stderr, "kiln: %d bytes of %s lost before offset %d\n", ch.Lost, ch.Stream, ch.Offset)
		} else {
			w := c.stdout
			if ch.Stream == "stderr" {
				w = c.stderr
			}
			if _, err := w.Write(ch.Bytes); err != nil {
				return err
			}
		}
		pos[ch.Stream] = ch.Offset + int64(len(ch.Bytes))
		if until != nil && until(pos) {
			return nil
		}
	}
	return nil
}

// resume is how kiln resumes a broken connection: the SDK's defaults,
// giving up after 25 s without a byte; a variable for the tests of giving
// up.
var resume = client.Resume{}

// exitIncomplete is kiln's exit code for a foreground command whose
// output could not all be delivered: never 0, never the command's own.
const exitIncomplete = 123

// foregroundExit is the exit status help of the commands that run a
// command in the foreground.
const foregroundExit = `
kiln exits with the command's exit code (128+N when a signal N killed it), or with 123 when
the command's output could not all be delivered to kiln (a line on stderr says how much was
lost; with --json, a summary with the counts goes to stderr). The command's output is held
for kiln as it is for a terminal: when kiln reads slowly, the command waits, and nothing is
dropped. A broken connection to kilnd is resumed from the last byte shown, nothing repeated;
kiln gives up, with 123, when it cannot reconnect for 25 seconds.`

// follow copies the output to its end and exits with the process's code.
// A foreground command's whose output was not all delivered exits with
// exitIncomplete instead.
func (c *cli) follow(ctx context.Context, p *client.Process, foreground bool) error {
	if err := c.copyOutput(ctx, p); err != nil {
		if foreground && errors.Is(err, client.ErrInterrupted) {
			// The command's outcome is unknown here, and its output
			// incomplete: kiln's own code, never one it could have had.
			fmt.Fprintf(c.stderr, "kiln: %v\nkiln: the output shown is incomplete\n", err)
			return exitError{exitIncomplete}
		}
		return err
	}
	r, err := p.Wait(ctx)
	if err != nil {
		return err
	}
	return c.outcome(r, foreground)
}

// outcome says what follow found: the line about output that is not
// complete, a foreground command's summary with --json, and the exit.
func (c *cli) outcome(r client.Result, foreground bool) error {
	if !r.OutputComplete {
		fmt.Fprintln(c.stderr, "kiln: the output shown is incomplete")
	}
	if foreground && c.json {
		enc := json.NewEncoder(c.stderr)
		enc.Encode(struct {
			api.Exit
			OutputComplete bool                          `json:"output_complete"`
			Streams        map[string]client.StreamCount `json:"streams"`
		}{r.Exit, r.OutputComplete, r.Streams})
	}
	c.sayOOM(r.Exit)
	if foreground && !r.OutputComplete {
		return exitError{exitIncomplete}
	}
	if code := exitCode(r.Exit); code != 0 {
		return exitError{code}
	}
	return nil
}

// sayOOM tells the user when the out-of-memory killer ended the process:
// its exit code (137) alone does not.
func (c *cli) sayOOM(e api.Exit) {
	if e.OOMKilled {
		fmt.Fprintln(c.stderr, "kiln: the process was killed out of memory: it reached the sandbox's memory limit")
	}
}

func (c *cli) withClient(f func(cl *client.Client) error) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	return f(cl)
}

func (c *cli) execCmd() *cobra.Command {
	var sf startFlags
	cmd := &cobra.Command{
		Use:   "exec SANDBOX -- CMD [ARG...]",
		Short: "Run a command in a sandbox: its stdout to stdout, stderr to stderr, its exit code as kiln's",
		Long: `Runs a command in a sandbox in the foreground: its stdout to kiln's stdout, its stderr to
kiln's stderr. Its stdin is closed unless -i sends kiln's stdin to it (end of input closes it).
` + foregroundExit,
		Example: `  kiln exec $SB -- make test
  kiln exec $SB -- cat out.tar > out.tar
  seq 5 | kiln exec -i $SB -- wc -l`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				o, err := sf.options(args[1:])
				if err != nil {
					return err
				}
				p, err := cl.Handle(args[0]).Start(cmd.Context(), o)
				if err != nil {
					return err
				}
				return c.foreground(cmd.Context(), p, sf.stdin)
			})
		},
	}
	sf.add(cmd, false)
	return cmd
}

func (c *cli) logsCmd() *cobra.Command {
	var (
		follow, timestamps, stdout, stderr bool
		tail                               int
		since                              string
	)
	cmd := &cobra.Command{
		Use:   "logs SANDBOX PROCESS",
		Short: "Show a process's output: replay, then with -f the live tail; its captured log once it is gone",
		Long: `Shows what the sandbox still holds of the process's output from the beginning and, with -f,
follows it to the process's exit. Once the process is gone (or with --tail, --since,
--timestamps, which need the record of when each line was written) the captured log is read
instead, if the process was started with --capture, and each run's completeness is shown.`,
		Example: `  kiln logs -f $SB $P
  kiln logs --tail 20 --stderr $SB $P`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg, loggedProcessArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if stdout && stderr {
				return errors.New("--stdout and --stderr together: leave both out for both streams")
			}
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				sb := cl.Handle(args[0])
				if tail < 0 && since == "" && !timestamps && !stdout && !stderr {
					p, err := sb.Process(ctx, args[1], client.Bytes)
					if err == nil {
						if follow {
							return c.follow(ctx, p, false)
						}
						return c.retained(ctx, sb, p)
					}
					if !client.IsNotFound(err) {
						return err
					}
				}
				o := client.LogOptions{Follow: follow, Records: timestamps}
				switch {
				case tail == 0:
					o.Tail = client.NoLines
				case tail > 0:
					o.Tail = tail
				}
				if stdout {
					o.Stream = "stdout"
				} else if stderr {
					o.Stream = "stderr"
				}
				if since != "" {
					t, err := parseSince(since)
					if err != nil {
						return err
					}
					o.Since = t
				}
				body, err := sb.CapturedLog(ctx, args[1], o)
				if err != nil {
					if client.IsNotFound(err) {
						return fmt.Errorf("no output of %s: the process is gone and was not captured (start it with --capture to keep its output)", args[1])
					}
					return err
				}
				defer body.Close()
				if timestamps {
					err = c.printRecords(body)
				} else {
					_, err = io.Copy(c.stdout, body)
				}
				// What the log says of each run it holds, last: lossless,
				// or how it is not.
				for _, r := range body.Runs() {
					fmt.Fprintf(c.stderr, "kiln: captured run %s: %s%s\n", shortID(r.ID), r.State, droppedText(r))
				}
				if err != nil && ctx.Err() == nil {
					return err
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the process exits")
	cmd.Flags().IntVar(&tail, "tail", -1, "only the last `N` lines (from the captured log)")
	cmd.Flags().StringVar(&since, "since", "", "only output after `T` (RFC 3339, or a duration such as 10m; from the captured log)")
	cmd.Flags().BoolVarP(&timestamps, "timestamps", "t", false, "show when each line was written (from the captured log)")
	cmd.Flags().BoolVar(&stdout, "stdout", false, "stdout only (from the captured log)")
	cmd.Flags().BoolVar(&stderr, "stderr", false, "stderr only (from the captured log)")
	return cmd
}

// printRecords prints captured records, each line prefixed with the time
// its first record was written.
func (c *cli) printRecords(body io.Reader) error {
	dec := json.NewDecoder(body)
	midLine := map[string]bool{}
	for {
		var r api.LogRecord
		if err := dec.Decode(&r); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if r.Gap != 0 {
			fmt.Fprintf(c.stderr, "kiln: %s of the captured log lost to rotation while reading\n", gapBytes(r.Gap))
			continue
		}
		w := c.stdout
		if r.Stream == "stderr" {
			w = c.stderr
		}
		content := []byte(r.Text)
		if r.Base64 != "" {
			b, err := base64.StdEncoding.DecodeString(r.Base64)
			if err != nil {
				return err
			}
			content = b
		}
		if !midLine[r.Stream] {
			fmt.Fprint(w, r.Time.Format(time.RFC3339Nano), " ")
		}
		w.Write(content)
		if !r.Partial {
			w.Write([]byte{'\n'})
		}
		midLine[r.Stream] = r.Partial
	}
}

func gapBytes(n int64) string {
	if n < 0 {
		return "an unknown amount"
	}
	return fmt.Sprintf("%d bytes", n)
}

// retained prints what the sandbox holds of the output now, without
// following it.
func (c *cli) retained(ctx context.Context, sb *client.Sandbox, p *client.Process) error {
	st, err := p.Status(ctx)
	if err != nil {
		return err
	}
	if st.State == client.Exited {
		return c.copyOutput(ctx, p)
	}
	// Read until the positions reached at the request, then stop.
	target := map[string]int64{}
	if st.Process != nil {
		for name, s := range st.Process.Streams {
			target[name] = s.TotalBytes
		}
	}
	return c.copyUntil(ctx, p, func(pos map[string]int64) bool {
		for name, t := range target {
			if pos[name] < t {
				return false
			}
		}
		return true
	})
}

func parseSince(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 10m", s)
	}
	return time.Now().Add(-d), nil
}

func shortID(id string) string {
	if id == "" {
		return "(unknown)"
	}
	return id
}

func droppedText(r api.Run) string {
	var parts []string
	for s, n := range r.Dropped {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d bytes of %s dropped", n, s))
		}
	}
	if r.Missed {
		parts = append(parts, "part of it rotated away while reading")
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

func (c *cli) attachCmd() *cobra.Command {
	var withStdin bool
	cmd := &cobra.Command{
		Use:               "attach SANDBOX PROCESS",
		Short:             "Follow a process's output from the beginning; with --stdin, send this terminal's input to it",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg, processArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				p, err := cl.Handle(args[0]).Process(ctx, args[1], client.Bytes)
				if err != nil {
					return err
				}
				if withStdin {
					go c.pumpInput(ctx, p, false)
				}
				return c.follow(ctx, p, false)
			})
		},
	}
	cmd.Flags().BoolVarP(&withStdin, "stdin", "i", false, "send stdin to the process (end of input closes its stdin)")
	return cmd
}

// pumpInput sends c.stdin to the process in writes of at most 64 KiB; at
// end of input it closes the process's stdin (not a terminal's: there
// end-of-input is Ctrl-D, sent as input).
func (c *cli) pumpInput(ctx context.Context, p *client.Process, terminal bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.stdin.Read(buf)
		if n > 0 {
			if werr := p.Write(ctx, buf[:n]); werr != nil {
				fmt.Fprintln(c.stderr, "\r\nkiln: input:", werr)
				return
			}
		}
		if err != nil {
			if !terminal {
				p.CloseStdin(ctx)
			}
			return
		}
	}
}

func (c *cli) psCmd() *cobra.Command {
	return &cobra.Command{
		Use: "ps SANDBOX", Short: "List a sandbox's processes", Args: cobra.ExactArgs(1),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.Handle(args[0]).Processes(cmd.Context())
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(list)
				}
				w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "ID\tSTATE\tEXIT\tSTARTED\tCOMMAND")
				for _, p := range list {
					exit := ""
					if p.State == api.StateExited {
						exit = strings.TrimPrefix(p.Exit.String(), "process ")
					}
					cmdline := strings.Join(append([]string{p.Command}, p.Args...), " ")
					if len(cmdline) > 60 {
						cmdline = cmdline[:57] + "..."
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.ID, p.State, exit, p.StartedAt.Local().Format(time.TimeOnly), cmdline)
				}
				return w.Flush()
			})
		},
	}
}

func (c *cli) waitCmd() *cobra.Command {
	return &cobra.Command{
		Use: "wait SANDBOX PROCESS", Short: "Wait for a process's exit and exit with its code", Args: cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg, processArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				p, err := cl.Handle(args[0]).Process(cmd.Context(), args[1], client.Bytes)
				if err != nil {
					return err
				}
				r, err := p.Wait(cmd.Context())
				if err != nil {
					return err
				}
				if c.json {
					c.printJSON(r.Exit)
				}
				c.sayOOM(r.Exit)
				if code := exitCode(r.Exit); code != 0 {
					return exitError{code}
				}
				return nil
			})
		},
	}
}

func (c *cli) killCmd() *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use: "kill SANDBOX PROCESS", Short: "Signal a process's group (SIGKILL unless -s)", Args: cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg, processArg),
		Example:           `  kiln kill -s TERM $SB $P`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				p, err := cl.Handle(args[0]).Process(cmd.Context(), args[1], client.Bytes)
				if err != nil {
					return err
				}
				return p.Signal(cmd.Context(), sig)
			})
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "KILL", "the `SIGNAL` (name or number)")
	return cmd
}

func (c *cli) shellCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:               "shell SANDBOX [-- CMD [ARG...]]",
		Short:             "An interactive terminal in a sandbox (sh, or CMD), its exit code as kiln's",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := []string{"sh", "-l"}
			if len(args) > 1 {
				argv = args[1:]
			}
			return c.withClient(func(cl *client.Client) error {
				return c.terminal(cmd.Context(), cl.Handle(args[0]), argv, "")
			})
		},
	}
	return cmd
}

// terminal runs argv on a terminal in sb: this terminal in raw mode, its
// size followed, input sent as typed.
func (c *cli) terminal(ctx context.Context, sb *client.Sandbox, argv []string, user string) error {
	size := api.TTY{Cols: 80, Rows: 24}
	in, isFile := c.stdin.(*os.File)
	isTerm := isFile && term.IsTerminal(int(in.Fd()))
	if isTerm {
		if w, h, err := term.GetSize(int(in.Fd())); err == nil {
			size = api.TTY{Cols: uint16(w), Rows: uint16(h)}
		}
	}
	var command string
	if len(argv) > 0 {
		command, argv = argv[0], argv[1:]
	}
	p, err := sb.Start(ctx, client.StartOptions{Command: command, Args: argv, User: user, Terminal: &size, Stdin: true,
		Env: map[string]string{"TERM": envOr("TERM", "xterm-256color")}, Format: client.Bytes, Flow: api.FlowBlock})
	if err != nil {
		return err
	}
	if isTerm {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return err
		}
		defer term.Restore(int(in.Fd()), old)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, unix.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(int(in.Fd())); err == nil {
					p.Resize(ctx, api.TTY{Cols: uint16(w), Rows: uint16(h)})
				}
			}
		}()
	}
	go c.pumpInput(ctx, p, true)
	return c.follow(ctx, p, true)
}

func (c *cli) runCmd() *cobra.Command {
	var (
		sf      startFlags
		rm      bool
		tty     bool
		opts    api.CreateSandbox
		network func() *api.Network
	)
	cmd := &cobra.Command{
		Use:   "run [--rm] [-i] [-t] [--image IMAGE] -- [CMD [ARG...]]",
		Short: "Create a sandbox, run a command in it attached, exit with its code",
		Long: `Creates a sandbox and runs a command in it in the foreground, as kiln exec does: its stdout to
kiln's stdout, its stderr to kiln's stderr, its stdin closed unless -i sends kiln's stdin to it.
With -t it runs on a terminal instead, interactively.
` + foregroundExit,
		Example: `  kiln run --rm -- sh -c 'echo hello; exit 7'; echo $?   # hello, then 7
  kiln run -t -- python3                                  # interactive
  kiln run --rm --egress allow -- curl -sI https://example.com
  kiln run --rm --image busybox                           # the image's own command`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && opts.Image == "" {
				return errors.New("kiln run: a command to run (after --), unless --image gives one")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				opts.Network = network()
				sb, _, err := cl.CreateSandbox(ctx, opts)
				if err != nil {
					return err
				}
				if rm {
					defer sb.Delete(context.WithoutCancel(ctx), false)
				} else {
					fmt.Fprintln(c.stderr, "kiln: sandbox", sb.ID)
				}
				if tty {
					return c.terminal(ctx, sb, args, sf.user)
				}
				o, err := sf.options(args)
				if err != nil {
					return err
				}
				p, err := sb.Start(ctx, o)
				if err != nil {
					return err
				}
				return c.foreground(ctx, p, sf.stdin)
			})
		},
	}
	sf.add(cmd, false)
	cmd.Flags().BoolVar(&rm, "rm", false, "remove the sandbox afterwards (its captured logs kept)")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run on a terminal, interactively")
	cmd.Flags().StringVar(&opts.Image, "image", "", "an `image` kilnd has (kiln image pull) as the root, its config the command's defaults")
	cmd.Flags().StringVar(&opts.Rootfs, "rootfs", "", "a root filesystem: a `directory` in kilnd's images directory, instead of the host's /usr and /etc")
	cmd.Flags().StringVar(&opts.Runtime, "runtime", "", "the kind of sandbox: namespaces (the default) or gvisor")
	network = networkFlags(cmd)
	return cmd
}
