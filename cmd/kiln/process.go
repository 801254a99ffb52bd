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
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// foreground follows a command started in the foreground (held output,
// bytes), sending it kiln's stdin when asked to.
func (c *cli) foreground(ctx context.Context, p *client.Process, input bool) error {
	return c.session(ctx, p, sessionOptions{input: input, foreground: true})
}

// sessionOptions say how kiln is attached to a process.
type sessionOptions struct {
	input      bool   // send kiln's stdin to the process
	terminal   bool   // the process is on a terminal: end of input is not sent as a close
	detachKeys []byte // typed in the input, they detach (none: never)
	foreground bool   // kiln's exit is the process's, or 123 when output was lost
}

// session follows p's output to its end while sending it kiln's input,
// until the detach keys are typed: then kiln leaves the process running
// and exits 0.
func (c *cli) session(parent context.Context, p *client.Process, o sessionOptions) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	detached := make(chan struct{})
	if o.input {
		go c.pumpInput(ctx, p, o.terminal, &detacher{seq: o.detachKeys}, func() {
			close(detached)
			cancel()
		})
	}
	err := c.follow(ctx, p, o.foreground)
	select {
	case <-detached:
		fmt.Fprintf(c.stderr, "\r\nkiln: detached; the process runs on (kiln attach -i %s %s)\r\n", p.Sandbox().ID, p.ID)
		return nil
	default:
	}
	if parent.Err() != nil && !c.removing {
		// Ctrl-C ends kiln, not the process: say where it is.
		fmt.Fprintf(c.stderr, "\r\nkiln: interrupted; the process runs on: kiln attach %s %s, or kiln kill %[1]s %[2]s\r\n", p.Sandbox().ID, p.ID)
	}
	return err
}

// copyOutput writes a process's output as it comes, stdout and terminal
// output to stdout and stderr to stderr, and says what was lost; or, with
// asJSON, each chunk and gap as a JSON line on stdout. A broken connection
// is resumed from the last byte written, nothing repeated, for as long as
// resume says; a held process's output waits for kiln meanwhile.
func (c *cli) copyOutput(ctx context.Context, p *client.Process, asJSON bool) error {
	return c.copyUntil(ctx, p, asJSON, nil)
}

// copyUntil is copyOutput that stops, if until is set, once until says so
// of where the streams stand.
func (c *cli) copyUntil(ctx context.Context, p *client.Process, asJSON bool, until func(pos map[string]int64) bool) error {
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
			return c.lost(err)
		}
		if asJSON {
			if err := c.printChunk(ch); err != nil {
				return err
			}
		} else if ch.Lost > 0 {
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

// lost turns output lost before kiln read it (--overflow fail) into
// kiln's exit code for output not all delivered, saying how much of which
// stream; other errors are returned as they are.
func (c *cli) lost(err error) error {
	var ce *client.CapacityError
	if !errors.As(err, &ce) {
		return err
	}
	msg := fmt.Sprintf("%d bytes of %s were lost before kiln read them (kilnd could not keep them while kiln was behind); --overflow report shows the rest and goes on", ce.Lost, ce.Stream)
	if c.json {
		json.NewEncoder(c.stderr).Encode(map[string]any{"error": map[string]any{
			"code": "output_capacity", "message": msg, "exit_code": exitIncomplete, "stream": ce.Stream, "lost_bytes": ce.Lost}})
	} else {
		fmt.Fprintln(c.stderr, "kiln:", msg)
	}
	return exitError{exitIncomplete}
}

// printChunk writes a chunk as a JSON line: its stream and offset, and its
// bytes as text when they are UTF-8, else base64; or the bytes it lost.
func (c *cli) printChunk(ch client.Chunk) error {
	out := struct {
		Stream string `json:"stream"`
		Offset int64  `json:"offset"`
		Text   string `json:"text,omitempty"`
		Base64 string `json:"base64,omitempty"`
		Lost   int64  `json:"lost,omitempty"`
	}{Stream: ch.Stream, Offset: ch.Offset, Lost: ch.Lost}
	switch {
	case ch.Lost > 0:
	case utf8.Valid(ch.Bytes):
		out.Text = string(ch.Bytes)
	default:
		out.Base64 = base64.StdEncoding.EncodeToString(ch.Bytes)
	}
	return json.NewEncoder(c.stdout).Encode(out)
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
kiln gives up, with 123, when it cannot reconnect for 25 seconds, and, unless --overflow
report, when output was lost all the same (the command runs on). What the command leaves
behind may write after it exits, for --drain; output cut there is not complete either.`

// follow copies the output to its end and exits with the process's code.
// A foreground command's whose output was not all delivered exits with
// exitIncomplete instead.
func (c *cli) follow(ctx context.Context, p *client.Process, foreground bool) error {
	// A foreground command's output is its own, bytes; --json is the
	// summary on stderr.
	if err := c.copyOutput(ctx, p, c.json && !foreground); err != nil {
		if foreground && c.endedOutOfMemory(ctx, p, err) {
			return exitError{exitOOM}
		}
		if foreground && errors.Is(err, client.ErrInterrupted) {
			// The command's outcome is unknown here, and its output
			// incomplete: kiln's own code, never one it could have had.
			fmt.Fprintf(c.stderr, "kiln: %v\nkiln: the output shown is incomplete\n", err)
			return exitError{exitIncomplete}
		}
		if foreground && !c.removing && errors.As(err, new(exitError)) {
			fmt.Fprintf(c.stderr, "kiln: the process runs on: kiln attach %s %s, or kiln kill %[1]s %[2]s\n", p.Sandbox().ID, p.ID)
		}
		return err
	}
	r, err := p.Wait(ctx)
	if err != nil {
		if foreground && c.endedOutOfMemory(ctx, p, err) {
			return exitError{exitOOM}
		}
		return err
	}
	return c.outcome(r, foreground, p.Sandbox().Described.OnOOM)
}

// exitOOM is a foreground command's exit code when its sandbox ended out
// of memory, every process in it killed: 128+SIGKILL, as a process the
// out-of-memory killer ends has, and as docker run exits when its
// container is.
const exitOOM = 137

// endedOutOfMemory reports, and says, whether err is p's sandbox having
// stopped because it ran out of memory (on_oom end_sandbox).
func (c *cli) endedOutOfMemory(ctx context.Context, p *client.Process, err error) bool {
	if !client.IsFailedPrecondition(err) {
		return false
	}
	info, ierr := p.Sandbox().Info(ctx)
	if ierr != nil || info.State != api.SandboxStopped || !strings.HasPrefix(info.Reason, "out of memory") {
		return false
	}
	fmt.Fprintf(c.stderr, "kiln: the sandbox ran out of memory: it was ended with every process in it\n%s\n", killProcessHint)
	return true
}

// killProcessHint says what a sandbox that is not to end out of memory
// is created with.
const killProcessHint = "kiln: (a sandbox created with --on-oom kill_process loses only the process using the most)"

// outcome says what follow found: the line about output that is not
// complete, a foreground command's summary with --json, and the exit;
// onOOM is the sandbox's (api.OnOOM*).
func (c *cli) outcome(r client.Result, foreground bool, onOOM string) error {
	if r.Exit.OutputCut() {
		fmt.Fprintln(c.stderr, "kiln: the output was cut: something the process left behind still held it open when the drain time after its exit ran out (--drain)")
	}
	if !r.OutputComplete {
		fmt.Fprintln(c.stderr, "kiln: the output shown is incomplete")
	}
	if foreground && c.json {
		enc := json.NewEncoder(c.stderr)
		enc.Encode(struct {
			api.Exit
			OutputComplete bool                          `json:"output_complete"`
			Streams        map[string]client.StreamCount `json:"streams"`
		}{r.Exit.API(), r.OutputComplete, r.Streams})
	}
	c.sayOOM(r.Exit, onOOM)
	if foreground && !r.OutputComplete {
		return exitError{exitIncomplete}
	}
	if code := exitCode(r.Exit); code != 0 {
		return exitError{code}
	}
	return nil
}

// sayOOM tells the user when the out-of-memory killer ended the process:
// its exit code (137) alone does not. In a sandbox that ends out of
// memory (onOOM), the sandbox is being ended with it.
func (c *cli) sayOOM(e client.Exit, onOOM string) {
	switch {
	case !e.OOMKilled():
	case onOOM == api.OnOOMEndSandbox:
		fmt.Fprintf(c.stderr, "kiln: the sandbox ran out of memory: the process was killed, and the sandbox is ended with every process in it\n%s\n", killProcessHint)
	default:
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
With -t it runs on a terminal, its output and errors both on kiln's stdout; -it makes it
interactive, this terminal in raw mode, and the detach keys (ctrl-p,ctrl-q) leave it running.
` + foregroundExit,
		Example: `  kiln exec $SB -- make test
  kiln exec $SB -- cat out.tar > out.tar
  seq 5 | kiln exec -i $SB -- wc -l
  kiln exec -it $SB -- python3`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, keys, err := sf.parse(cmd, commandOf(args[1:]))
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				sb := cl.Handle(args[0])
				if sf.tty {
					return c.terminal(cmd.Context(), sb, o, keys)
				}
				p, err := sb.Start(cmd.Context(), o)
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

// firstProcess is the process kiln logs SANDBOX shows, as docker logs
// shows a container's: the first started in it (its init command, or the
// command kiln run -d started), running or captured.
func firstProcess(ctx context.Context, sb *client.Sandbox) (string, error) {
	var first string
	procs, err := sb.Processes(ctx)
	if err == nil {
		var at time.Time
		for _, p := range procs {
			if first == "" || p.StartedAt.Before(at) {
				first, at = p.ID, p.StartedAt
			}
		}
	} else if !client.IsNotFound(err) && !client.IsFailedPrecondition(err) {
		return "", err
	}
	if first == "" {
		logs, err := sb.CapturedLogs(ctx)
		if err != nil {
			return "", err
		}
		// Each run's id is a time-ordered UUID: the log whose first run
		// is the oldest is the first process's.
		var oldest string
		for _, l := range logs {
			if len(l.Runs) > 0 && (first == "" || l.Runs[0].ID < oldest) {
				first, oldest = l.Process, l.Runs[0].ID
			}
		}
	}
	if first == "" {
		return "", fmt.Errorf("sandbox %s has no process, running or captured: start one (kiln exec, kiln sandbox exec-stream)", sb.ID)
	}
	return first, nil
}

// logsCmd is kiln logs. Long because it is one command's declaration:
// its flags, their help and examples, and the choice between the live
// process and its captured log, which the help explains in the same order.
func (c *cli) logsCmd() *cobra.Command {
	var (
		follow, timestamps, stdout, stderr bool
		tail, since, until, overflow       string
	)
	cmd := &cobra.Command{
		Use:   "logs SANDBOX [PROCESS]",
		Short: "Show a process's output: replay, then with -f the live tail; its captured log once it is gone",
		Long: `Shows what the sandbox still holds of the process's output from the beginning and, with -f,
follows it to the process's exit (kiln then exits with its code). Once the process is gone (or
with --tail, --since, --until, --timestamps, --stdout or --stderr, which need the record of
when each line was written) the captured log is read instead, if the process was started
with --capture, and each run's completeness is shown.

Output the sandbox no longer holds (a process not captured that wrote more than kilnd keeps
while no one read it, or more than kiln could keep up with) is lost: by default kiln then
stops, saying how many bytes of which stream, and exits 123; with --overflow report it says so
on a line of its own and goes on.

With --json each line of output is a JSON object: from the sandbox, {stream, offset, text or
base64} and gaps {stream, offset, lost}; from the captured log, its records {time, stream,
text or base64, partial} and gaps {gap}.`,
		Example: `  kiln logs -f $SB $P
  kiln logs -f web                       # its first process: its init, or kiln run -d's command
  kiln logs -n 20 --stderr $SB $P
  kiln logs --since 10m --until 5m -t $SB $P`,
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: c.complete(sandboxArg, loggedProcessArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if stdout && stderr {
				return usageError{errors.New("--stdout and --stderr together: leave both out for both streams"), cmd.CommandPath()}
			}
			o := client.LogOptions{Follow: follow, Records: timestamps || c.json}
			switch n, err := strconv.Atoi(tail); {
			case tail == "all":
			case err != nil || n < 0:
				return usageError{fmt.Errorf("--tail %q: want a number of lines, or all", tail), cmd.CommandPath()}
			case n == 0:
				o.Tail = client.NoLines
			default:
				o.Tail = n
			}
			if stdout {
				o.Stream = "stdout"
			} else if stderr {
				o.Stream = "stderr"
			}
			for _, t := range []struct {
				flag, value string
				to          *time.Time
			}{{"--since", since, &o.Since}, {"--until", until, &o.Until}} {
				if t.value == "" {
					continue
				}
				v, err := parseTime(t.flag, t.value)
				if err != nil {
					return usageError{err, cmd.CommandPath()}
				}
				*t.to = v
			}
			ov, err := parseOverflow(overflow)
			if err != nil {
				return usageError{err, cmd.CommandPath()}
			}
			fromLog := tail != "all" || since != "" || until != "" || timestamps || stdout || stderr
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				sb := cl.Handle(args[0])
				if len(args) == 1 {
					pid, err := firstProcess(ctx, sb)
					if err != nil {
						return err
					}
					args = append(args, pid)
				}
				if !fromLog {
					p, err := sb.Process(ctx, args[1], client.ProcessOptions{Format: client.Bytes, Overflow: ov, ChunkBytes: copyChunk, Borrow: true})
					if err == nil {
						if follow {
							return c.follow(ctx, p, false)
						}
						return c.retained(ctx, p)
					}
					if !client.IsNotFound(err) {
						return err
					}
					// Gone from the sandbox: its log, if it was captured;
					// following it ends as the log does.
				}
				body, err := sb.CapturedLog(ctx, args[1], o)
				if err != nil {
					if client.IsNotFound(err) {
						return c.noLog(ctx, sb, args[1], err)
					}
					return err
				}
				defer body.Close()
				if o.Records {
					err = c.printRecords(body)
				} else {
					_, err = io.Copy(c.stdout, body)
				}
				// What the log says of each run it holds that is not
				// whole, last: how it is not. A lossless run needs no
				// word, as docker logs says none.
				for _, r := range body.Runs() {
					if r.State != api.RunLossless {
						fmt.Fprintf(c.stderr, "kiln: captured run %s: %s%s\n", shortID(r.ID), r.State, droppedText(r))
					}
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the process exits")
	cmd.Flags().StringVarP(&tail, "tail", "n", "all", "only the last `N` lines, or all (from the captured log)")
	cmd.Flags().StringVar(&since, "since", "", "only output after `T` (RFC 3339, or a duration such as 10m: that long ago; from the captured log)")
	cmd.Flags().StringVar(&until, "until", "", "only output before `T` (RFC 3339, or a duration such as 10m: that long ago; from the captured log)")
	cmd.Flags().BoolVarP(&timestamps, "timestamps", "t", false, "show when each line was written (from the captured log)")
	cmd.Flags().BoolVar(&stdout, "stdout", false, "stdout only (from the captured log)")
	cmd.Flags().BoolVar(&stderr, "stderr", false, "stderr only (from the captured log)")
	addOverflow(cmd, &overflow)
	return cmd
}

// noLog says why a process has no captured log: the sandbox is not there,
// the process runs or ran without --capture, or no process had that id.
func (c *cli) noLog(ctx context.Context, sb *client.Sandbox, pid string, logErr error) error {
	if _, err := sb.Info(ctx); err != nil {
		return err
	}
	p, err := sb.Process(ctx, pid, client.ProcessOptions{Format: client.Bytes})
	switch {
	case err == nil:
		st, _ := p.Status(ctx)
		how := "runs"
		if st.State == client.Exited {
			how = "ran"
		}
		return fmt.Errorf("process %s %s without --capture, so it has no captured log for --tail, --since, --until, --timestamps, --stdout or --stderr; without them, kiln logs shows what the sandbox holds of its output", pid, how)
	case client.IsNotFound(err):
		return fmt.Errorf("no process %s in sandbox %s: none running or recently ended has that id, and none left a captured log (start processes with --capture to keep their output): %w", pid, sb.ID, logErr)
	}
	return err
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
		if c.json {
			if err := json.NewEncoder(c.stdout).Encode(r); err != nil {
				return err
			}
			continue
		}
		if r.Gap != 0 {
			fmt.Fprintf(c.stderr, "kiln: %s of the captured log lost to rotation while reading\n", gapBytes(r.Gap))
			continue
		}
		if r.LostBytes != 0 {
			fmt.Fprintf(c.stderr, "kiln: %d bytes of %s lost by the capture here\n", r.LostBytes, r.Stream)
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
func (c *cli) retained(ctx context.Context, p *client.Process) error {
	st, err := p.Status(ctx)
	if err != nil {
		return err
	}
	if st.State == client.Exited {
		return c.copyOutput(ctx, p, c.json)
	}
	// Read until the positions reached at the request, then stop.
	target := map[string]int64{}
	if st.Process != nil {
		for name, s := range st.Process.Streams {
			target[name] = s.TotalBytes
		}
	}
	return c.copyUntil(ctx, p, c.json, func(pos map[string]int64) bool {
		for name, t := range target {
			if pos[name] < t {
				return false
			}
		}
		return true
	})
}

// parseTime reads a flag's time: RFC 3339, or a duration that long ago.
func parseTime(flag, s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time or a duration such as 10m", flag, s)
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
	var (
		withStdin      bool
		keys, overflow string
	)
	cmd := &cobra.Command{
		Use:   "attach SANDBOX PROCESS",
		Short: "Follow a process's output from the beginning; with --stdin, send this terminal's input to it",
		Long: `Follows a process's output from the beginning, then live, to its exit; kiln exits with the
process's code. With --stdin, kiln's input goes to the process: to a process on a terminal,
this terminal is switched to raw mode (every key is sent, Ctrl-C too) and its size followed.
The detach keys (ctrl-p,ctrl-q unless --detach-keys) leave the process running and end kiln
with 0. Without --stdin, or to a process not on a terminal, Ctrl-C ends kiln (130) and leaves
the process running too.

A process started with flow block (as kiln run, kiln exec and the SDKs start theirs) waits for
kiln attach when kiln reads slowly, as for its terminal: nothing is lost while kiln reads.
Output lost before kiln read it (more than kilnd keeps, written while kiln was behind or before
it came) ends kiln with 123, saying how many bytes of which stream; with --overflow report, a
line on stderr says so and kiln goes on.`,
		Example: `  kiln attach $SB $P
  kiln attach -i $SB $P                      # type into it; ctrl-p ctrl-q to leave it running`,
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg, processArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := parseDetachKeys(keys)
			if err != nil {
				return usageError{err, cmd.CommandPath()}
			}
			ov, err := parseOverflow(overflow)
			if err != nil {
				return usageError{err, cmd.CommandPath()}
			}
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				// kiln attach is the process's foreground reader: a flow
				// block process waits for it, as for its terminal.
				p, err := cl.Handle(args[0]).Process(ctx, args[1], client.ProcessOptions{Format: client.Bytes, Overflow: ov, Hold: true, ChunkBytes: copyChunk, Borrow: true})
				if err != nil {
					return err
				}
				if withStdin && p.Terminal() {
					restore, err := c.rawTerminal(ctx, p)
					if err != nil {
						return err
					}
					defer restore()
				}
				return c.session(ctx, p, sessionOptions{input: withStdin, terminal: p.Terminal(), detachKeys: seq})
			})
		},
	}
	cmd.Flags().BoolVarP(&withStdin, "stdin", "i", false, "send stdin to the process (end of input closes its stdin)")
	cmd.Flags().StringVar(&keys, "detach-keys", defaultDetachKeys, "the `keys` that detach, leaving the process running: characters or ctrl-<key>, comma separated")
	addOverflow(cmd, &overflow)
	return cmd
}

// rawTerminal switches kiln's terminal, when its stdin is one, to raw mode
// and sends its size to p now and at each change; restore undoes it.
func (c *cli) rawTerminal(ctx context.Context, p *client.Process) (restore func(), err error) {
	in, ok := c.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(in.Fd())) {
		return func() {}, nil
	}
	fd := int(in.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, err
	}
	resize := func() {
		if w, h, err := term.GetSize(fd); err == nil {
			p.Resize(ctx, api.TTY{Cols: uint16(w), Rows: uint16(h)})
		}
	}
	resize()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, unix.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-winch:
				resize()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(done)
		term.Restore(fd, old)
	}, nil
}

// stdinIsTerminal reports whether kiln's input is a terminal.
func (c *cli) stdinIsTerminal() bool {
	in, ok := c.stdin.(*os.File)
	return ok && term.IsTerminal(int(in.Fd()))
}

// errNotTTY is Docker's refusal of -it without a terminal to read.
var errNotTTY = errors.New("the input device is not a TTY: -t with -i needs a terminal as kiln's stdin (leave out -t to pipe input)")

// pumpInput sends c.stdin to the process in writes of at most 64 KiB; at
// end of input it closes the process's stdin (not a terminal's: there
// end-of-input is Ctrl-D, sent as input). When the input types keys's
// sequence it stops, sending none of it, and calls detach.
func (c *cli) pumpInput(ctx context.Context, p *client.Process, terminal bool, keys *detacher, detach func()) {
	buf := make([]byte, 32<<10)
	send := func(b []byte) bool {
		if len(b) == 0 {
			return true
		}
		if err := p.Write(ctx, b); err != nil {
			if ctx.Err() == nil {
				fmt.Fprintln(c.stderr, "\r\nkiln: input:", err)
			}
			return false
		}
		return true
	}
	for {
		n, err := c.stdin.Read(buf)
		if n > 0 {
			out, done := keys.feed(buf[:n])
			if !send(out) {
				return
			}
			if done {
				detach()
				return
			}
		}
		if err != nil {
			if !send(keys.heldBytes()) {
				return
			}
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
				sb := cl.Handle(args[0])
				list, err := sb.Processes(cmd.Context())
				if err != nil {
					return err
				}
				if c.json {
					return c.printJSON(list)
				}
				// A paused sandbox's processes run no more until it is
				// resumed: shown paused, as docker ps shows its container.
				paused := false
				if slices.ContainsFunc(list, func(p api.Process) bool { return p.State == api.StateRunning }) {
					info, err := sb.Info(cmd.Context())
					paused = err == nil && info.State == api.SandboxPaused
				}
				w := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
				fmt.Fprintln(w, "ID\tSTATE\tEXIT\tSTARTED\tCOMMAND")
				for _, p := range list {
					exit := ""
					if p.State == api.StateExited {
						exit = strings.TrimPrefix(p.Exit.String(), "process ")
					}
					cmdline := commandLine(p.Command, p.Args)
					if c.output != "wide" && utf8.RuneCountInString(cmdline) > 60 {
						cmdline = string([]rune(cmdline)[:57]) + "..."
					}
					id := p.ID
					if c.output != "wide" {
						id = api.ShortProcessID(id)
					}
					state := p.State
					if paused && state == api.StateRunning {
						state = api.SandboxPaused
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", id, state, exit, p.StartedAt.Local().Format(time.TimeOnly), cmdline)
				}
				return w.Flush()
			})
		},
	}
}

// commandLine is a command as a shell would read it back: words with
// spaces, quotes or other special characters quoted, and newlines, tabs
// and other control characters escaped, so that one process is one line.
func commandLine(command string, args []string) string {
	words := make([]string, 0, 1+len(args))
	for _, w := range append([]string{command}, args...) {
		words = append(words, shellWord(w))
	}
	return strings.Join(words, " ")
}

func shellWord(w string) string {
	if w == "" {
		return "''"
	}
	plain, printable := true, true
	for _, r := range w {
		switch {
		case r < ' ' || r == 0x7f || !unicode.IsPrint(r) && r != ' ':
			printable = false
		case !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r)):
			plain = false
		}
	}
	switch {
	case !printable || !utf8.ValidString(w):
		return "$" + ansiC(w)
	case plain:
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}

// ansiC quotes w as bash's $'...': control characters and bytes that are
// not UTF-8 escaped.
func ansiC(w string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(w); {
		r, size := utf8.DecodeRuneInString(w[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, w[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\'' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < ' ' || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
		i += size
	}
	b.WriteByte('\'')
	return b.String()
}

func (c *cli) waitCmd() *cobra.Command {
	return &cobra.Command{
		Use: "wait SANDBOX PROCESS", Short: "Wait for a process's exit and exit with its code", Args: cobra.ExactArgs(2),
		ValidArgsFunction: c.complete(sandboxArg, processArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				p, err := cl.Handle(args[0]).Process(cmd.Context(), args[1], client.ProcessOptions{Format: client.Bytes})
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
				c.sayOOM(r.Exit, p.Sandbox().Described.OnOOM)
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
				p, err := cl.Handle(args[0]).Process(cmd.Context(), args[1], client.ProcessOptions{Format: client.Bytes})
				if err != nil {
					return err
				}
				err = p.Signal(cmd.Context(), sig)
				if client.IsFailedPrecondition(err) {
					// Already exited: what kill is for is done.
					if st, serr := p.Status(cmd.Context()); serr == nil && st.State == client.Exited {
						fmt.Fprintf(c.stderr, "kiln: process %s has already exited (%s); nothing to signal\n", p.ID, strings.TrimPrefix(st.Exit.String(), "process "))
						return nil
					}
				}
				return err
			})
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "KILL", "the `SIGNAL` (name or number)")
	return cmd
}

func (c *cli) shellCmd() *cobra.Command {
	var keys, overflow string
	cmd := &cobra.Command{
		Use:   "shell SANDBOX [-- CMD [ARG...]]",
		Short: "An interactive terminal in a sandbox (bash, else sh, or CMD), its exit code as kiln's",
		Long: `Runs a login shell (bash where the sandbox has /bin/bash, else sh), or CMD, on a terminal in the
sandbox, as docker exec -it does: this terminal in raw mode, its size followed. The detach keys (ctrl-p,ctrl-q unless --detach-keys) leave the shell
running: kiln attach -i SANDBOX PROCESS comes back to it.`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.complete(sandboxArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := commandOf(args[1:])
			seq, err := parseDetachKeys(keys)
			if err != nil {
				return usageError{err, cmd.CommandPath()}
			}
			ov, err := parseOverflow(overflow)
			if err != nil {
				return usageError{err, cmd.CommandPath()}
			}
			return c.withClient(func(cl *client.Client) error {
				sb := cl.Handle(args[0])
				if len(argv) == 0 {
					argv = []string{"sh", "-l"}
					if _, err := sb.Stat(cmd.Context(), "/bin/bash"); err == nil {
						argv = []string{"/bin/bash", "-l"}
					}
				}
				o := client.StartOptions{Command: argv[0], Args: argv[1:], Stdin: true, Overflow: ov, ChunkBytes: copyChunk, Borrow: true}
				return c.terminal(cmd.Context(), sb, o, seq)
			})
		},
	}
	cmd.Flags().SetInterspersed(false) // kiln shell web bash -l: the command's flags are its own
	cmd.Flags().StringVar(&keys, "detach-keys", defaultDetachKeys, "the `keys` that detach, leaving the shell running: characters or ctrl-<key>, comma separated")
	addOverflow(cmd, &overflow)
	return cmd
}

// terminal runs o's command on a terminal in sb: with o.Stdin, this terminal in raw mode, its size followed,
// input sent as typed until the detach keys.
func (c *cli) terminal(ctx context.Context, sb *client.Sandbox, o client.StartOptions, detachKeys []byte) error {
	if o.Stdin && !c.stdinIsTerminal() {
		return errNotTTY
	}
	size := api.TTY{Cols: 80, Rows: 24}
	if in, ok := c.stdin.(*os.File); ok {
		if w, h, err := term.GetSize(int(in.Fd())); err == nil {
			size = api.TTY{Cols: uint16(w), Rows: uint16(h)}
		}
	}
	if o.Env == nil {
		o.Env = map[string]string{}
	}
	if _, ok := o.Env["TERM"]; !ok {
		o.Env["TERM"] = envOr("TERM", "xterm-256color")
	}
	o.Terminal, o.Format, o.Flow = &size, client.Bytes, api.FlowBlock
	p, err := sb.Start(ctx, o)
	if err != nil {
		return err
	}
	if o.Stdin {
		restore, err := c.rawTerminal(ctx, p)
		if err != nil {
			return err
		}
		defer restore()
	}
	return c.session(ctx, p, sessionOptions{input: o.Stdin, terminal: true, detachKeys: detachKeys, foreground: true})
}

// runDetached is kiln run -d: the command started in sb, its output
// kept whether or not anyone watches (kiln logs SANDBOX shows it), and
// the sandbox's id printed. A command that cannot start takes its
// sandbox with it.
func (c *cli) runDetached(ctx context.Context, sb *client.Sandbox, o client.StartOptions) error {
	o.Flow, o.Capture = api.FlowDrop, true
	if _, err := sb.Start(ctx, o); err != nil {
		sb.Delete(context.WithoutCancel(ctx), false)
		return err
	}
	fmt.Fprintln(c.stdout, sb.ID)
	return nil
}

// runCmd is kiln run. Long because it is one command's declaration: its
// flags (sandbox create's and a process's), their help and examples, and
// the three ways it runs the command (attached, on a terminal, detached).
func (c *cli) runCmd() *cobra.Command {
	var (
		sf      startFlags
		rm      bool
		detach  bool
		opts    api.CreateSandbox
		network func() *api.Network
		limits  func(*pflag.FlagSet) (api.LimitsRequest, error)
		labels  func() (map[string]string, error)
		volumes func() ([]api.Mount, error)
		placed  func() error
	)
	cmd := &cobra.Command{
		Use:   "run [--rm] [-d] [-i] [-t] [--image IMAGE] [--] [CMD [ARG...]]",
		Short: "Create a sandbox, run a command in it attached, exit with its code",
		Long: `Creates a sandbox and runs a command in it in the foreground, as kiln exec does: its stdout to
kiln's stdout, its stderr to kiln's stderr, its stdin closed unless -i sends kiln's stdin to it.
With -t it runs on a terminal instead; -it makes it interactive (ctrl-p,ctrl-q detach). The
sandbox's limits are those of kiln sandbox create.
` + foregroundExit,
		Example: `  kiln run --rm -- sh -c 'echo hello; exit 7'; echo $?   # hello, then 7
  kiln run -it -- python3                                 # interactive
  SB=$(kiln run -d --name web -- python3 -m http.server)  # detached; kiln logs -f web follows it
  kiln run --rm --memory 256M --pids 64 -- make -j4
  kiln run --rm --egress allow -- curl -sI https://example.com
  kiln run --rm --image busybox                           # the image's own command
  kiln run --rm -v "$PWD":/src:ro -- ls /src              # below kilnd's --allow-mount
  kiln run --rm --from before-upgrade -- make test        # from a snapshot's files
  kiln run --rm --constraint zone=a -- uname -n           # in a cluster: on a node labelled zone=a`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && opts.Image == "" {
				return errors.New("kiln run: a command to run (after --), unless --image gives one")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o, keys, err := sf.parse(cmd, args)
			if err != nil {
				return err
			}
			if opts.Limits, err = limits(cmd.Flags()); err != nil {
				return err
			}
			opts.Network = network()
			if opts.IdleTimeoutSeconds, opts.TTLSeconds, err = lifetimes(cmd); err != nil {
				return err
			}
			if opts.Labels, err = labels(); err != nil {
				return err
			}
			if opts.Mounts, err = volumes(); err != nil {
				return err
			}
			if err := placed(); err != nil {
				return err
			}
			if detach && (rm || sf.tty || sf.stdin) {
				return usageError{errors.New("-d with --rm, -t or -i: a detached command has no terminal or input of kiln's, and kiln is not there to remove its sandbox"), cmd.CommandPath()}
			}
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				sb, err := cl.CreateSandbox(ctx, opts)
				if err != nil {
					return err
				}
				if detach {
					return c.runDetached(ctx, sb, o)
				}
				if rm {
					// As Docker's --rm: the sandbox and its logs.
					c.removing = true
					defer sb.Delete(context.WithoutCancel(ctx), true)
				} else {
					fmt.Fprintln(c.stderr, "kiln: sandbox", sb.ID)
				}
				if sf.tty {
					return c.terminal(ctx, sb, o, keys)
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
	cmd.Flags().BoolVar(&rm, "rm", false, "remove the sandbox and its captured logs afterwards")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "start the command and print the sandbox's id; its output is captured (kiln logs SANDBOX)")
	limits = limitFlags(cmd)
	onOOMFlag(cmd, &opts.OnOOM)
	cmd.Flags().StringVar(&opts.Image, "image", "", "an `image` kilnd has (kiln image pull) as the root, its config the command's defaults")
	cmd.Flags().StringVar(&opts.Rootfs, "rootfs", "", "a root filesystem: a `directory` in kilnd's images directory, instead of the host's /usr and /etc")
	cmd.Flags().StringVar(&opts.Runtime, "runtime", "", "the kind of sandbox: namespaces (the default) or gvisor")
	network = networkFlags(cmd)
	labels = labelFlag(cmd)
	volumes = volumeFlag(cmd)
	lifetimeFlags(cmd)
	cmd.Flags().StringVar(&opts.Name, "name", "", "a `name` for the sandbox, as kiln sandbox create --name")
	cmd.Flags().StringVar(&opts.Snapshot, "from", "", "a `snapshot` the sandbox is made from: its files, and unless flags say otherwise its image, limits, network policy and labels")
	placed = placementFlags(cmd, &opts)
	return cmd
}
