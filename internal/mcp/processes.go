package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// Bounds of exec's run time, in milliseconds.
const (
	defaultExecTimeoutMS = 60_000
	maxExecTimeoutMS     = 600_000
)

var (
	errNoSandbox = errors.New("sandbox is required: a sandbox's id or name, as sandbox_create or sandbox_list give it")
	errNoPID     = errors.New("pid is required: a process's id, as process_start gives it")
)

// CommandInput is what runs: a shell command line, or a program and its
// arguments.
type CommandInput struct {
	Sandbox string            `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Command string            `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c (pipes, redirections and && work); give this or argv"`
	Argv    []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run without a shell; give this or command"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory (default the image's, or /)"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"environment variables added to the sandbox's"`
}

// check says what is wrong with a command, in the words of its arguments.
func (in CommandInput) check() error {
	switch {
	case in.Sandbox == "":
		return errNoSandbox
	case in.Command == "" && len(in.Argv) == 0:
		return errors.New("command or argv is required: a shell command line, or a program and its arguments")
	case in.Command != "" && len(in.Argv) > 0:
		return errors.New("command and argv exclude each other: give one")
	case len(in.Argv) > 0 && in.Argv[0] == "":
		return errors.New("argv[0], the program, is empty")
	}
	return nil
}

// ExecInput is exec's arguments.
type ExecInput struct {
	CommandInput
	TimeoutMS      int64 `json:"timeout_ms,omitempty" jsonschema:"kill the command after this many milliseconds: default 60000, at most 600000"`
	MaxOutputBytes int   `json:"max_output_bytes,omitempty" jsonschema:"output kept, stdout and stderr together: default 16384, 256 to 65536; the rest is counted, not kept"`
}

// ExecOutput is exec's result.
type ExecOutput struct {
	ExitCode  int    `json:"exit_code" jsonschema:"the command's exit code (128+N when signal N ended it)"`
	Signal    string `json:"signal,omitempty" jsonschema:"the signal that ended it, if one did"`
	Stdout    string `json:"stdout" jsonschema:"its stdout, as UTF-8 (an invalid byte is U+FFFD)"`
	Stderr    string `json:"stderr" jsonschema:"its stderr"`
	Truncated bool   `json:"truncated" jsonschema:"it wrote more than max_output_bytes: the rest is not here"`
	TimedOut  bool   `json:"timed_out,omitempty" jsonschema:"it was killed at timeout_ms"`
	MaxBytes  int    `json:"max_output_bytes" jsonschema:"the most output this result could carry"`
	Note      string `json:"note" jsonschema:"the bound, and what was cut, in words"`
}

// StartInput is process_start's arguments.
type StartInput struct {
	CommandInput
	Stdin bool `json:"stdin,omitempty" jsonschema:"open stdin for process_write_stdin; without it stdin is empty"`
}

// StartOutput is process_start's result.
type StartOutput struct {
	Sandbox string           `json:"sandbox" jsonschema:"the sandbox it runs in"`
	PID     string           `json:"pid" jsonschema:"the process's id, for process_output, process_write_stdin and process_signal"`
	Offsets map[string]int64 `json:"offsets" jsonschema:"the offsets its output starts at, for process_output"`
	Log     string           `json:"log" jsonschema:"the resource URI of its captured output"`
	Note    string           `json:"note"`
}

// StdinInput is process_write_stdin's arguments.
type StdinInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	PID     string `json:"pid" jsonschema:"the process's id, from process_start"`
	Data    string `json:"data,omitempty" jsonschema:"text to write (at most 65536 bytes); include the newline a line needs"`
	Close   bool   `json:"close,omitempty" jsonschema:"close stdin after writing: the program reads end-of-input"`
}

// StdinOutput is process_write_stdin's result.
type StdinOutput struct {
	Written int  `json:"written_bytes"`
	Closed  bool `json:"stdin_closed"`
}

// SignalInput is process_signal's arguments.
type SignalInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	PID     string `json:"pid" jsonschema:"the process's id, from process_start"`
	Signal  string `json:"signal,omitempty" jsonschema:"TERM (the default), INT, KILL, HUP, USR1, … or a number"`
}

// SignalOutput is process_signal's result.
type SignalOutput struct {
	Sent string `json:"sent"`
	Note string `json:"note"`
}

func (s *Server) addProcessTools() {
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "exec",
		Description: "Run a command in a sandbox and wait for it to finish; return its exit code, stdout and stderr. Use it for " +
			"commands that finish within a minute or so (timeout_ms, default 60000, kills it after). At most max_output_bytes " +
			"(default 16384) of output is returned, stdout and stderr together, from the start; truncated says when more was " +
			"written and not returned. For long-running or very talkative commands (builds, servers, test suites) use " +
			"process_start and process_output instead.",
	}, s.exec)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "process_start",
		Description: "Start a long-running command in a sandbox in the background and return its pid at once. Its output is " +
			"kept whether or not anyone reads it: read it with process_output from offsets {\"stdout\":0,\"stderr\":0}, passing " +
			"back the next_offsets each result gives, until it says exited. With stdin true, feed it input with " +
			"process_write_stdin; stop it with process_signal.",
	}, s.start)
	mcp.AddTool(s.s, &mcp.Tool{
		Name:        "process_output",
		InputSchema: outputSchema(),
		Description: "Read a process's output from given offsets: the bytes of stdout and stderr after them, at most max_bytes " +
			"(default 16384) in one result. Pass the next_offsets of the previous result to read on; nothing is missed or " +
			"repeated. more says output is already waiting beyond next_offsets (call again at once); exited with exit_code says " +
			"the process ended and everything it wrote has been returned. lost_bytes counts output that could not be kept. " +
			"While a process runs and has written nothing new, wait_ms (default 0, at most 30000) waits that long for output.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.output)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "process_write_stdin",
		Description: "Write text to the stdin of a process started with stdin true, as if typed, and with close true end its " +
			"input. Each write comes after the earlier ones; at most 65536 bytes a call. Read the answer with process_output.",
	}, s.writeStdin)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "process_signal",
		Description: "Send a signal to a process and everything it started: TERM (the default) asks it to stop, INT is Ctrl-C, " +
			"KILL ends it at once. Sending does not wait for the exit: process_output says exited once it has.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)},
	}, s.signal)
}

func (s *Server) exec(ctx context.Context, _ *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	if err := in.check(); err != nil {
		return nil, ExecOutput{}, err
	}
	max, err := outputBound("max_output_bytes", in.MaxOutputBytes)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	timeout := in.TimeoutMS
	switch {
	case timeout == 0:
		timeout = defaultExecTimeoutMS
	case timeout < 0 || timeout > maxExecTimeoutMS:
		return nil, ExecOutput{}, fmt.Errorf("timeout_ms %d: want 1 to %d (use process_start for longer)", timeout, maxExecTimeoutMS)
	}
	o := client.ExecOptions{Shell: in.Command, Cwd: in.Cwd, Env: in.Env, MaxOutputBytes: int64(max), TimeoutMS: timeout}
	if len(in.Argv) > 0 {
		o.Command, o.Args = in.Argv[0], in.Argv[1:]
	}
	r, err := s.c.Handle(in.Sandbox).Exec(ctx, o)
	if err != nil {
		return nil, ExecOutput{}, fmt.Errorf("exec in %s: %w", in.Sandbox, err)
	}
	out := ExecOutput{ExitCode: r.Exit.Code(), Signal: r.Exit.Signal(), Stdout: text(r.Stdout), Stderr: text(r.Stderr),
		Truncated: r.Truncated, TimedOut: r.TimedOut, MaxBytes: max}
	notes := []string{fmt.Sprintf("at most %d bytes of output are returned", max)}
	if r.Truncated {
		notes = append(notes, "the command wrote more, which is not shown: rerun it with output redirected to a file and read that with file_read, or use process_start and process_output")
	}
	if r.TimedOut {
		notes = append(notes, fmt.Sprintf("killed after timeout_ms %d", timeout))
	}
	out.Note = strings.Join(notes, "; ")
	return nil, out, nil
}

func (s *Server) start(ctx context.Context, _ *mcp.CallToolRequest, in StartInput) (*mcp.CallToolResult, StartOutput, error) {
	if err := in.check(); err != nil {
		return nil, StartOutput{}, err
	}
	// Captured, so that its output outlives the memory kilnd keeps of it
	// and can be read from any offset; flow drop, so that it never waits
	// for a reader, which a model is only now and then.
	o := client.StartOptions{Shell: in.Command, Cwd: in.Cwd, Env: in.Env, Stdin: in.Stdin, Capture: true, Flow: api.FlowDrop}
	if len(in.Argv) > 0 {
		o.Command, o.Args = in.Argv[0], in.Argv[1:]
	}
	sb := s.c.Handle(in.Sandbox)
	p, err := sb.Start(ctx, o)
	if err != nil {
		return nil, StartOutput{}, fmt.Errorf("process_start in %s: %w", in.Sandbox, err)
	}
	p.Detach()
	return nil, StartOutput{Sandbox: in.Sandbox, PID: p.ID, Offsets: map[string]int64{"stdout": 0, "stderr": 0},
		Log:  logURI(in.Sandbox, p.ID),
		Note: "running in the background; read its output with process_output from these offsets"}, nil
}

func (s *Server) writeStdin(ctx context.Context, _ *mcp.CallToolRequest, in StdinInput) (*mcp.CallToolResult, StdinOutput, error) {
	switch {
	case in.Sandbox == "":
		return nil, StdinOutput{}, errNoSandbox
	case in.PID == "":
		return nil, StdinOutput{}, errNoPID
	case len(in.Data) > api.MaxStdin:
		return nil, StdinOutput{}, fmt.Errorf("data is %d bytes: at most %d a call", len(in.Data), api.MaxStdin)
	case in.Data == "" && !in.Close:
		return nil, StdinOutput{}, errors.New("data or close is required: nothing to do")
	}
	p, err := s.c.Handle(in.Sandbox).Process(ctx, in.PID, client.ProcessOptions{})
	if err != nil {
		return nil, StdinOutput{}, fmt.Errorf("process_write_stdin %s: %w", in.PID, err)
	}
	defer p.Detach()
	if in.Data != "" {
		if err := p.Write(ctx, []byte(in.Data)); err != nil {
			return nil, StdinOutput{}, fmt.Errorf("process_write_stdin %s: %w", in.PID, err)
		}
	}
	if in.Close {
		if err := p.CloseStdin(ctx); err != nil {
			return nil, StdinOutput{}, fmt.Errorf("process_write_stdin %s: wrote %d bytes, then closing stdin: %w", in.PID, len(in.Data), err)
		}
	}
	return nil, StdinOutput{Written: len(in.Data), Closed: in.Close}, nil
}

func (s *Server) signal(ctx context.Context, _ *mcp.CallToolRequest, in SignalInput) (*mcp.CallToolResult, SignalOutput, error) {
	switch {
	case in.Sandbox == "":
		return nil, SignalOutput{}, errNoSandbox
	case in.PID == "":
		return nil, SignalOutput{}, errNoPID
	}
	sig := in.Signal
	if sig == "" {
		sig = "TERM"
	}
	p, err := s.c.Handle(in.Sandbox).Process(ctx, in.PID, client.ProcessOptions{})
	if err == nil {
		defer p.Detach()
		err = p.Signal(ctx, sig)
	}
	if err != nil {
		return nil, SignalOutput{}, fmt.Errorf("process_signal %s %s: %w", sig, in.PID, err)
	}
	return nil, SignalOutput{Sent: sig, Note: "sent; process_output says exited once the process has ended"}, nil
}

// outputSchema is process_output's input schema, whose offsets may be
// null as well as left out: a first call may pass what it has not got.
func outputSchema() *jsonschema.Schema {
	s, err := jsonschema.For[OutputInput](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: process_output's schema: %v", err))
	}
	off := s.Properties["offsets"]
	off.Type, off.Types = "", []string{"null", "object"}
	return s
}

// outputBound reads a bound on a result's bytes: 0 is the default.
func outputBound(name string, n int) (int, error) {
	switch {
	case n == 0:
		return DefaultOutputBytes, nil
	case n < MinOutputBytes || n > MaxOutputBytes:
		return 0, fmt.Errorf("%s %d: want %d to %d", name, n, MinOutputBytes, MaxOutputBytes)
	}
	return n, nil
}
