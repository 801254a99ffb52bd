// Package api holds the wire types that kilnd, the in-sandbox agent and clients share: JSON bodies, error codes and the kiln.v1 WebSocket frames.
package api

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// ExecRequest starts a process: POST /exec (finite) or POST /exec-stream
// (detached).
type ExecRequest struct {
	// Command is the program, looked up in the sandbox's PATH; Args follow
	// it. No shell is involved unless Command is one.
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	// Env is added to the sandbox's default environment.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory; empty is the sandbox's default.
	Cwd string `json:"cwd,omitempty"`
	// User runs the process as a user of the sandbox's, as docker exec
	// --user does: NAME, UID, NAME:GROUP or UID:GID, names from the
	// sandbox's /etc/passwd and /etc/group; empty is its image's user, or
	// root. A user other than root holds no capabilities.
	User string `json:"user,omitempty"`
	// Stdin is "pipe" (write with POST …/stdin) or "closed" (the default).
	Stdin string `json:"stdin,omitempty"`
	// TTY runs the process on a terminal of that size: one combined output
	// stream ("terminal"), input through the terminal.
	TTY *TTY `json:"tty,omitempty"`
	// Capture keeps the output durably in the sandbox's captured logs.
	Capture bool `json:"capture,omitempty"`
	// Flow is "drop" (the default: a watcher that falls behind is told
	// exactly what it missed, and the process never waits for one) or
	// "block": a watcher attaching with flow=block is given every byte,
	// the process waiting for it if need be, as a foreground command's
	// output waits for its terminal. The output is held for that watcher
	// from the start, and for the grace period after it goes (kilnd's
	// --flow-grace, 30 s), for it to come back to, or for twice that while
	// it stays but neither reads nor acks; then it drops again.
	Flow string `json:"flow,omitempty"`

	// DrainMS bounds, in milliseconds, how long the output is read after
	// the process exits, while something it left behind (a background
	// child) still holds its output open: the output ends when its last
	// writer closes it, or when the drain time runs out, and then the
	// exit says the output was cut (Exit.OutputCut). What is left of the
	// process's group is killed once the output has ended. 0 is
	// DefaultDrainMS; at most MaxDrainMS.
	DrainMS int64 `json:"drain_ms,omitempty"`

	// Finite exec only. MaxOutputBytes bounds the output kept, both streams
	// together (default and ceiling DefaultMaxOutput); bytes beyond it are
	// counted. TimeoutMS kills the process after that long (0: none).
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	TimeoutMS      int64 `json:"timeout_ms,omitempty"`
}

// TTY is a terminal's size.
type TTY struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Stdin modes.
const (
	StdinPipe   = "pipe"
	StdinClosed = "closed"
)

// Flows of a process's output.
const (
	FlowDrop  = "drop"
	FlowBlock = "block"
)

// DefaultMaxOutput is the default and the ceiling of ExecRequest.MaxOutputBytes.
const DefaultMaxOutput = 1 << 20

// MaxTimeoutMS bounds a finite exec's timeout_ms: 7 days.
const MaxTimeoutMS = 7 * 24 * 60 * 60 * 1000

// The drain time after a process's exit (ExecRequest.DrainMS).
const (
	DefaultDrainMS = 3000
	MaxDrainMS     = 60_000
)

// Bounds on a request, enforced by the agent and by kilnd.
const (
	MaxBody     = 1 << 20   // bytes of a JSON request body
	MaxArgs     = 65536     // command plus arguments (xargs -n 65536 fits)
	MaxUser     = 256       // a request's user
	MaxEnv      = 1024      // environment entries
	MaxArgvEnv  = 256 << 10 // bytes of command, arguments and environment together
	MaxStdin    = 64 << 10  // bytes of one stdin write
	MaxTTYSize  = 4096      // columns or rows
	MaxWSClient = 64 << 10  // bytes of one WebSocket message from a client
)

// Started answers POST /exec-stream.
type Started struct {
	ID string `json:"id"`
}

// ExecResult answers POST /exec.
type ExecResult struct {
	Exit
	// Stdout and Stderr are the output kept, as text; where it is not
	// valid UTF-8, the exact bytes are in StdoutBase64 / StderrBase64 and
	// the text has replacement characters.
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	StdoutBase64 string `json:"stdout_base64,omitempty"`
	StderrBase64 string `json:"stderr_base64,omitempty"`
	// Truncated is set when output beyond MaxOutputBytes was not kept, or
	// was lost before it could be read; the totals say how much there was.
	Truncated   bool  `json:"truncated"`
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// TimedOut is set when the process was killed at TimeoutMS.
	TimedOut bool `json:"timed_out,omitempty"`
}

// Exit is how a process ended: its exit code and, when a signal ended it,
// the signal. Neither is set while the exit is not known. A process a
// signal ended has the exit code the shell and Docker give it, 128 plus
// the signal's number (137 for KILL), beside the signal's name.
type Exit struct {
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// OOMKilled says the kernel's out-of-memory killer ended the process
	// (its sandbox's memory limit was reached).
	OOMKilled bool `json:"oom_killed,omitempty"`
	// OutputCut says the process's output did not end by itself: the
	// process exited, something it left behind still held its output
	// open when the drain time (ExecRequest.DrainMS) ran out, and the
	// output was ended there; what was written later was not read. Its
	// value is the reason, OutputCutDrain. It is known once the output
	// has ended: the exit message that follows the output's end says it,
	// and so does the process's description from then on.
	OutputCut string `json:"output_cut,omitempty"`
}

// OutputCutDrain is Exit.OutputCut's reason: the drain time ran out.
const OutputCutDrain = "drain_timeout"

// SignalExit is the exit of a process that signal (named as kill -l names
// it, "KILL", or with its SIG prefix) ended: its code 128 plus the
// signal's number on Linux, the convention of the shell and Docker.
func SignalExit(signal string) Exit {
	name := strings.TrimPrefix(signal, "SIG")
	e := Exit{Signal: name}
	if n, ok := signalNumbers[name]; ok {
		code := 128 + n
		e.ExitCode = &code
	}
	return e
}

// WithCode fills in the exit code of an exit that names only its signal
// (as records written before signals had codes do).
func (e Exit) WithCode() Exit {
	if e.ExitCode == nil && e.Signal != "" {
		e.ExitCode = SignalExit(e.Signal).ExitCode
	}
	return e
}

// signalNumbers are Linux's signal numbers, by kill -l's names: the
// sandbox's kernel's, whatever system a client runs on.
var signalNumbers = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8,
	"KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
	"STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22,
	"URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29,
	"PWR": 30, "SYS": 31,
}

// String is the seed's closing line: "process exited with code N", or
// how a signal ended the process.
func (e Exit) String() string {
	switch {
	case e.OOMKilled:
		return "process killed by signal " + e.Signal + ": out of memory"
	case e.Signal != "":
		return "process killed by signal " + e.Signal
	case e.ExitCode != nil:
		return fmt.Sprintf("process exited with code %d", *e.ExitCode)
	}
	return "process exit unknown"
}

// Process states.
const (
	StateRunning = "running"
	StateExited  = "exited"
)

// Process describes one process without its output.
type Process struct {
	ID       string   `json:"id"`
	Command  string   `json:"command"`
	Args     []string `json:"args,omitempty"`
	State    string   `json:"state"`
	Exit              // once observed
	PID      int      `json:"pid,omitempty"`
	Terminal bool     `json:"terminal,omitempty"`
	// Flow is the process's ("drop" or "block"); Held says its output
	// waits now for a watcher holding it to read on.
	Flow string `json:"flow"`
	Held bool   `json:"held,omitempty"`
	// Streams are the process's output streams with their totals.
	Streams   map[string]StreamStatus `json:"streams"`
	Stdin     *StdinStatus            `json:"stdin,omitempty"`
	StartedAt time.Time               `json:"started_at"`
	ExitedAt  *time.Time              `json:"exited_at,omitempty"`
	// ForkedFrom, set on a process of the sandbox's history (it came with
	// the snapshot the sandbox was made from or rolled back to), says
	// where it ran.
	ForkedFrom *ForkedFrom `json:"forked_from,omitempty"`
}

// StateForked is the state of a process of a sandbox's history: it ran
// in the sandbox a snapshot was taken of, and was running then; its
// output up to the snapshot is kept, and it does not run here.
const StateForked = "forked"

// ForkedFrom says where a process of a sandbox's history comes from: the
// sandbox a snapshot was taken of, its process there, and how far each
// of its output streams had come when the snapshot was taken.
type ForkedFrom struct {
	Sandbox  string           `json:"sandbox"`
	Process  string           `json:"process"`
	Snapshot string           `json:"snapshot"`
	Offsets  map[string]int64 `json:"offsets"`
}

// StreamStatus is one output stream's position.
type StreamStatus struct {
	// TotalBytes is how many bytes the stream has produced.
	TotalBytes int64 `json:"total_bytes"`
	// Ended is set once the stream reached its end.
	Ended bool `json:"ended"`
	// CaptureDropped counts bytes the durable log could not take.
	CaptureDropped int64 `json:"capture_dropped,omitempty"`
}

// StdinStatus is a stdin pipe's position: bytes accepted (the offset the
// next write must carry) and delivered to the process.
type StdinStatus struct {
	Accepted  int64 `json:"accepted"`
	Delivered int64 `json:"delivered"`
	Closed    bool  `json:"closed"`
	Broken    bool  `json:"broken,omitempty"`
}

// StdinAccepted answers POST …/stdin: the stdin offset after the write.
type StdinAccepted struct {
	Accepted int64 `json:"accepted"`
}

// SignalRequest is the body of POST …/signal. Signal is a name ("TERM",
// "SIGTERM") or a number ("15"). Group, by default true, signals the
// process's whole group.
type SignalRequest struct {
	Signal string `json:"signal"`
	Group  *bool  `json:"group,omitempty"`
}

// ResizeRequest is the body of POST …/resize.
type ResizeRequest = TTY

// Error is every error response's body.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says what went wrong: a code from the list below and a message
// for people.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Version describes a build of kiln or kilnd (GET /version).
type Version struct {
	Version   string `json:"version"`            // the module's version, or "devel"
	Revision  string `json:"revision,omitempty"` // the commit built
	Modified  bool   `json:"modified,omitempty"` // the tree built had changes
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"` // GOOS/GOARCH
}

// Error codes, each with one HTTP status.
const (
	CodeInvalid      = "invalid_argument"    // 400
	CodeUnauthorized = "unauthenticated"     // 401
	CodeForbidden    = "permission_denied"   // 403
	CodeNotFound     = "not_found"           // 404
	CodeMethod       = "method_not_allowed"  // 405
	CodeConflict     = "already_exists"      // 409
	CodeTooLarge     = "too_large"           // 413
	CodeOutOfRange   = "out_of_range"        // 416
	CodePrecondition = "failed_precondition" // 412
	CodeUnavailable  = "unavailable"         // 503
	// CodeUnknown: the request reached the sandbox's agent and no answer
	// came back: it may or may not have taken effect.
	CodeUnknown  = "outcome_unknown" // 502
	CodeInternal = "internal"        // 500
	// CodeBadGateway: a sandbox's port answered badly, or nothing listens
	// on it.
	CodeBadGateway = "bad_gateway" // 502
	// CodeCommandNotFound and CodeNotExecutable: a process's program is
	// not there, or cannot be run (not executable, a directory, not a
	// program the kernel can load).
	CodeCommandNotFound = "command_not_found" // 400
	CodeNotExecutable   = "not_executable"    // 400
	// CodeNoSpace: what was to be written, or asked for, does not fit in
	// the space there is (a sandbox's disk, its quota, kilnd's state
	// directory).
	CodeNoSpace = "no_space" // 507
	// CodePaused: the sandbox is paused, and what was asked needs it to
	// run (a process started, stdin written, its files or ports reached):
	// it succeeds once the sandbox is resumed.
	CodePaused = "paused" // 409
)

// WebSocket subprotocols of GET …/logs.
const (
	// ProtocolV1 frames every message (see Frame and the control types).
	ProtocolV1 = "kiln.v1"
	// ProtocolRaw is the plain shape: binary messages of raw output, then
	// one text line with the exit. It is what a client offering no
	// subprotocol gets too.
	ProtocolRaw = "kiln.raw"
	// TokenProtocolPrefix carries the bearer token for clients that cannot
	// set headers (a browser's WebSocket): offer "kiln.token.<token>"
	// beside the protocol wanted. Offered alone, it is the protocol the
	// answer names, and the connection speaks kiln.raw.
	TokenProtocolPrefix = "kiln.token."
	// ProtocolTCP is GET /sandboxes/{id}/tcp/{port}'s: its binary
	// messages are a TCP connection's bytes, each way.
	ProtocolTCP = "kiln.tcp"
	// ProtocolWatch is a files watch's: text messages of JSON, a
	// WatchHello then FileEvents.
	ProtocolWatch = "kiln.watch"
	// ProtocolEvents is GET /events's as a WebSocket: text messages, each
	// an Event as the NDJSON form's lines.
	ProtocolEvents = "kiln.events"
)

// ErrorHeader marks an answer that is kilnd's or an agent's error (its
// value the code), not one of a sandbox's app behind a port's proxy.
const ErrorHeader = "Kiln-Error"

// PrefixHeader is how kilnd tells a sandbox's agent the path it serves a
// port's proxy under, for redirects the app makes.
const PrefixHeader = "Kiln-Prefix"

// Stream codes in kiln.v1 binary frames.
const (
	StreamStdout   byte = 1
	StreamStderr   byte = 2
	StreamTerminal byte = 3
)

// StreamNames name the streams in JSON and query parameters, by code.
var StreamNames = map[byte]string{StreamStdout: "stdout", StreamStderr: "stderr", StreamTerminal: "terminal"}

// FrameHeader is the size of a kiln.v1 binary frame's header: the stream
// code, then the offset and the seq, each 8 bytes, unsigned big-endian.
const FrameHeader = 17

// Frame is one kiln.v1 binary message: output of one stream at an offset.
type Frame struct {
	Stream byte
	Offset uint64
	Seq    uint64
	Data   []byte
}

// AppendFrame appends f in the kiln.v1 binary layout.
func AppendFrame(dst []byte, f Frame) []byte {
	dst = append(dst, f.Stream)
	dst = binary.BigEndian.AppendUint64(dst, f.Offset)
	dst = binary.BigEndian.AppendUint64(dst, f.Seq)
	return append(dst, f.Data...)
}

// ErrFrame reports a binary message that is not a kiln.v1 frame.
var ErrFrame = errdefs.New(errdefs.ErrInvalidArgument, "api: malformed kiln.v1 frame")

// ParseFrame reads a kiln.v1 binary message; Data aliases b.
func ParseFrame(b []byte) (Frame, error) {
	if len(b) < FrameHeader {
		return Frame{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrFrame, len(b), FrameHeader)
	}
	if _, ok := StreamNames[b[0]]; !ok {
		return Frame{}, fmt.Errorf("%w: unknown stream %d", ErrFrame, b[0])
	}
	return Frame{
		Stream: b[0],
		Offset: binary.BigEndian.Uint64(b[1:9]),
		Seq:    binary.BigEndian.Uint64(b[9:17]),
		Data:   b[FrameHeader:],
	}, nil
}

// Control message types: kiln.v1 text messages are JSON objects with one
// of these in "type".
const (
	TypeHello      = "hello"
	TypeGap        = "gap"
	TypeEnd        = "end"
	TypeExit       = "exit"
	TypeStdinClose = "stdin_close" // client to server
	TypeResize     = "resize"      // client to server
	// TypeAck (client to server) says, in Offsets, where a watcher that
	// holds the output (flow=block&ack=true) has got to: the output stays
	// held from there, not from what was sent, so a watcher whose
	// connection breaks with output on its way comes back, from the
	// offsets it had, to find it still there (within the grace period). A
	// watcher that acks acks at least every 256 KiB it takes, or the
	// process stays held.
	TypeAck = "ack"
	// TypeCredit (client to server) grants Bytes more of output to a
	// watcher that attached with credit=N: the server sends no more output
	// than the watcher has granted, N at the start and Bytes with each
	// credit message, a binary frame costing its payload's length or
	// CreditFrame, whichever is more, so a watcher whose reader
	// falls behind holds the server back without reading ahead of its
	// reader (a runtime whose WebSocket cannot stop reading, a browser's,
	// needs this). The output waits in the ring meanwhile: a flow=block
	// watcher holds it there, another may lose what the ring evicts, and
	// is told exactly how much. Offsets, when set, ack as TypeAck does.
	TypeCredit = "credit"
	// TypeRelease (client to server) says a holding watcher will not come
	// back: when it goes, the output it held is not kept for it, and the
	// process no longer waits for it.
	TypeRelease = "release"
)

// MaxCredit bounds the output a watcher may have granted and not yet
// received: a credit that would take it past this is refused.
const MaxCredit = 1 << 30

// CreditFrame is the least a binary frame costs of a watcher's credit,
// however little it carries: a watcher that grants N bytes is sent at most
// N bytes in at most N/CreditFrame frames (a queue of 64 KiB and 256
// chunks, the streaming contract's, takes a credit of 64 KiB). It is also
// the least credit=N.
const CreditFrame = 256

// Hello opens a kiln.v1 stream: per stream, the oldest offset a watcher is
// given bytes from (the ring's, or a captured process's log's) and the
// total produced so far.
type Hello struct {
	Type    string               `json:"type"`
	Streams map[string]HelloSpan `json:"streams"`
}

// HelloSpan is a stream's retained span at attach time.
type HelloSpan struct {
	First int64 `json:"first"`
	Total int64 `json:"total"`
}

// Gap says bytes [From, To) of Stream were lost to this reader.
type Gap struct {
	Type      string `json:"type"`
	Stream    string `json:"stream"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
	LostBytes int64  `json:"lost_bytes"`
}

// End says Stream ended after TotalBytes.
type End struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	TotalBytes int64  `json:"total_bytes"`
}

// ExitMessage carries the observed exit, last.
type ExitMessage struct {
	Type string `json:"type"`
	Exit
}

// ClientMessage is a kiln.v1 text message from the client: stdin_close,
// resize with Cols and Rows, ack with Offsets per stream name, credit
// with Bytes (and Offsets, acked), or release.
type ClientMessage struct {
	Type    string           `json:"type"`
	Cols    uint16           `json:"cols,omitempty"`
	Rows    uint16           `json:"rows,omitempty"`
	Offsets map[string]int64 `json:"offsets,omitempty"`
	Bytes   int64            `json:"bytes,omitempty"`
}

// Limits bound a sandbox's resources; zero means no limit. Each other
// value is within its range (see MinCPUs and the constants after it),
// or a create asking for it is refused.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids bounds the tasks (processes and threads) of the sandbox's
	// processes at once.
	Pids int64   `json:"pids,omitempty"`
	CPUs float64 `json:"cpus,omitempty"` // in cores, e.g. 0.5, for its processes (its agent has a core more)
	// DiskBytes bounds what the sandbox writes to /workspace and its
	// image's writable layer together.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// The ranges of a sandbox's limits, each also 0 for none. cpus and
// memory_bytes end at what the host has: its CPUs (those kilnd may run
// on) and its memory. A value out of its range is refused with 400
// invalid_argument naming the field, the range and the value.
const (
	// MinCPUs is the kernel's least CPU quota: 1 ms in every 100 ms.
	MinCPUs        = 0.01
	MinMemoryBytes = 4 << 20
	MinPids        = 1
	// MaxPids is the kernel's most process IDs (PID_MAX_LIMIT).
	MaxPids = 1 << 22
	// The disk is an ext4 filesystem, which needs room for its journal
	// and tables, and is at most ext4's largest file. A disk larger than
	// the filesystem of kilnd's state directory is refused with 507
	// no_space, as is one that cannot be made for want of space.
	MinDiskBytes = 64 << 20
	MaxDiskBytes = 16 << 40
)

// MaxIdleTimeoutSeconds bounds CreateSandbox.IdleTimeoutSeconds: a year.
const MaxIdleTimeoutSeconds = 365 * 24 * 60 * 60

// LimitsRequest is what a create request asks for: a limit left out is
// kilnd's default (its --default-memory, --default-pids, --default-cpus
// and --default-disk), and an explicit 0 is no limit.
type LimitsRequest struct {
	MemoryBytes *int64   `json:"memory_bytes,omitempty"`
	Pids        *int64   `json:"pids,omitempty"`
	CPUs        *float64 `json:"cpus,omitempty"`
	DiskBytes   *int64   `json:"disk_bytes,omitempty"`
}

// Apply returns defaults with what r asks for in place of them.
func (r LimitsRequest) Apply(defaults Limits) Limits {
	if r.MemoryBytes != nil {
		defaults.MemoryBytes = *r.MemoryBytes
	}
	if r.Pids != nil {
		defaults.Pids = *r.Pids
	}
	if r.CPUs != nil {
		defaults.CPUs = *r.CPUs
	}
	if r.DiskBytes != nil {
		defaults.DiskBytes = *r.DiskBytes
	}
	return defaults
}

// CreateSandbox is the body of POST /sandboxes.
type CreateSandbox struct {
	// Name, when set, finds the sandbox wherever its id is taken, until it
	// is deleted: a DNS label (RFC 1123: a-z, 0-9 and '-', 1 to 63
	// characters, not beginning or ending with '-'), unique among the
	// sandboxes not deleted. It is the sandbox's hostname unless Hostname
	// says otherwise.
	Name     string `json:"name,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	// Rootfs is a root filesystem directory in kilnd's images directory (a
	// name, or a path inside it), used under a writable overlay; empty uses
	// the host's /usr and /etc read-only.
	Rootfs string `json:"rootfs,omitempty"`
	// Limits left out are kilnd's defaults; the sandbox's record shows
	// the limits it has.
	Limits LimitsRequest `json:"limits,omitzero"`
	// Init is a command whose exit ends the sandbox; its output is
	// captured and its exit becomes the sandbox's.
	Init *ExecRequest `json:"init,omitempty"`
	// IdleTimeoutSeconds deletes the sandbox (keeping its captured logs)
	// after this long idle: no request, no open watcher or reader, and no
	// process running in it (a detached build keeps it).
	IdleTimeoutSeconds int64 `json:"idle_timeout_seconds,omitempty"`
	// TTLSeconds deletes the sandbox (keeping its captured logs) this long
	// after its creation, whatever it is doing: a lifetime. 0 is none; at
	// most MaxIdleTimeoutSeconds.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// Runtime is the kind of sandbox: "namespaces" (the default: Linux
	// namespaces, cgroups and a seccomp filter on the host's kernel) or
	// "gvisor" (the same inside gVisor's user-space kernel, runsc).
	Runtime string `json:"runtime,omitempty"`
	// Network is what the sandbox may reach beyond its loopback; left out,
	// nothing.
	Network *Network `json:"network,omitempty"`
	// Image is an OCI image kilnd has (GET /images): a name, an ID or an
	// ID's unique prefix. Its layers are the sandbox's root, under a
	// writable overlay, and its config's env, working directory, user,
	// entrypoint and command every process's defaults. Not with Rootfs.
	Image string `json:"image,omitempty"`
	// Logs sets the rotation of the sandbox's captured logs; what it
	// leaves out is kilnd's default (--log-max-size, --log-max-files).
	Logs *LogRotation `json:"logs,omitempty"`
	// OnOOM is what happens past the memory limit: OnOOMEndSandbox (the
	// default) or OnOOMKillProcess (the namespaces runtime only).
	OnOOM string `json:"on_oom,omitempty"`
	// Labels are the caller's own key=value pairs, kept with the sandbox
	// and matched by GET /sandboxes?label=: at most MaxLabels, each key
	// 1 to MaxLabelKeyLen of a-z, A-Z, 0-9, '.', '_', '-' and '/' (a
	// letter or digit first), each value at most MaxLabelValueLen bytes
	// of UTF-8 without control characters.
	Labels map[string]string `json:"labels,omitempty"`
	// Mounts are host directories bound into the sandbox, as Docker's -v
	// binds them: at most MaxMounts, each Source below a directory kilnd
	// allows mounts from (kilnd --allow-mount; without one, every mount is
	// refused).
	Mounts []Mount `json:"mounts,omitempty"`
	// Snapshot, when set, makes the sandbox from a snapshot (its id, a
	// unique prefix of it, or its name): its files are the snapshot's,
	// and so, unless the request says otherwise, are its image or rootfs,
	// runtime, limits (its disk's size always), network policy, init
	// command, log rotation, timeouts and labels (the request's labels
	// are added to them). The snapshot's processes are its history.
	Snapshot string `json:"snapshot,omitempty"`
	// Node, on a kilnd in a cluster (kilnd --cluster), places the sandbox
	// on the node of that name; Constraints, on a node whose labels
	// (kilnd --node-label) have each KEY=VALUE. Left out, the sandbox goes
	// to the least loaded node. A kilnd in no cluster takes only its own
	// name, or none.
	Node        string   `json:"node,omitempty"`
	Constraints []string `json:"constraints,omitempty"`
}

// Mount is a host directory bound into a sandbox.
type Mount struct {
	// Source is the host directory: an absolute, clean path whose
	// directory, symbolic links resolved, is below a directory kilnd
	// allows mounts from.
	Source string `json:"source"`
	// Target is where the sandbox sees it: an absolute, clean path, not
	// "/", nor in /proc, /sys or /dev, nor one of the sandbox's own
	// mounts (/tmp, /root, /workspace), and no other mount's target.
	Target string `json:"target"`
	// ReadOnly makes it read-only in the sandbox (writes fail with
	// EROFS); it is nosuid and nodev either way.
	ReadOnly bool `json:"read_only,omitempty"`
}

// MaxMounts bounds a sandbox's mounts.
const MaxMounts = 16

// ShortID is how an id is shown where people read it, as Docker shows a
// container's: the first 12 of a sandbox id's 64 hex digits, which are
// random, so that any few of them that no other id begins with find it.
// An id of another shape (a sandbox made before ids were random, a
// UUIDv7, whose first digits are its time) is shown whole.
func ShortID(id string) string {
	if IsSandboxID(id) {
		return id[:ShortIDLen]
	}
	return id
}

// ShortProcessID is how a process's id is shown where space is short: its
// first 8 characters, which a random (version 4) UUID's are, enough to
// tell it from a sandbox's other processes, and any prefix of
// MinIDPrefix characters or more names it. Ids whose first characters are
// a time (version 7, of agents before) are shown whole.
func ShortProcessID(id string) string {
	if len(id) == 36 && id[14] == '4' {
		return id[:8]
	}
	return id
}

// ShortIDLen is the length of ShortID's ids; MinIDPrefix the fewest
// characters of an id that name it.
const (
	ShortIDLen  = 12
	MinIDPrefix = 4
)

// IsSandboxID reports whether id has the shape of the sandbox ids kilnd
// makes: 64 lower-case hex digits.
func IsSandboxID(id string) bool {
	if len(id) != 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Event is one thing that happened to a sandbox, as GET /events streams
// them: numbered from 1 in the order kilnd saw them (Seq), so that a
// reader that lost its connection asks for those after the last it read
// and misses none, repeats none. Events older than kilnd keeps come as one
// of type EventGap whose Lost counts them exactly.
type Event struct {
	Seq     int64     `json:"seq"`
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Sandbox string    `json:"sandbox,omitempty"`
	// Name is the sandbox's, when it has one.
	Name string `json:"name,omitempty"`
	// Reason says why it stopped or was deleted ("out of memory: …",
	// "stopped by request", "idle for 600s", "its ttl of 60s ended",
	// "deleted").
	Reason string `json:"reason,omitempty"`
	// Exit is its init command's, when it stopped with it.
	Exit *Exit `json:"exit,omitempty"`
	// Process describes the process of a process.started or
	// process.exited event: its id, command, exit and, per stream, the
	// bytes it wrote and those its captured log lost (final once exited).
	Process *Process `json:"process,omitempty"`
	// Snapshot is the snapshot of a sandbox.snapshotted event, the one a
	// sandbox.rolled_back event's sandbox was rolled back to, and the one
	// a sandbox.created event's sandbox was made from, if any.
	Snapshot string `json:"snapshot,omitempty"`
	// Lost counts the events a gap stands for.
	Lost int64 `json:"lost,omitempty"`
	// Epoch names what numbered the event: a kilnd, which numbers from 1
	// again once restarted, or, in a cluster, the cluster's stream of
	// events, whose numbers every node gives alike.
	Epoch string `json:"epoch"`
	// Node is the node of a cluster the event happened on; a gap's, the
	// node whose events never reached the cluster.
	Node string `json:"node,omitempty"`
}

// The types of Event. A sandbox started again after it stopped (kiln
// start) is EventStarted; its creation, which starts it first, is
// EventCreated alone.
const (
	EventCreated = "sandbox.created"
	EventStarted = "sandbox.started"
	EventStopped = "sandbox.stopped"
	EventDeleted = "sandbox.deleted"
	// A sandbox paused, and one resumed (not one stopped or deleted while
	// paused: EventStopped and EventDeleted say it).
	EventPaused  = "sandbox.paused"
	EventResumed = "sandbox.resumed"
	// A snapshot taken of a sandbox (Event.Snapshot names it), and a
	// sandbox rolled back to one.
	EventSnapshotted = "sandbox.snapshotted"
	EventRolledBack  = "sandbox.rolled_back"
	// A process started in a sandbox, and one that finished: it exited
	// and its output was read to the end.
	EventProcessStarted = "process.started"
	EventProcessExited  = "process.exited"
	EventGap            = "gap"
)

// EventTypes are the types of event GET /events?type= chooses from.
var EventTypes = []string{EventCreated, EventStarted, EventStopped, EventDeleted, EventPaused, EventResumed, EventSnapshotted, EventRolledBack, EventProcessStarted, EventProcessExited}

// NextCursorHeader carries, on a page of GET /sandboxes?limit=, the
// cursor of the page after it; absent on the last.
const NextCursorHeader = "Kiln-Next-Cursor"

// The bounds of a sandbox's labels.
const (
	MaxLabels        = 64
	MaxLabelKeyLen   = 128
	MaxLabelValueLen = 256
)

// What happens to a sandbox past its memory limit (CreateSandbox.OnOOM).
const (
	// OnOOMEndSandbox ends the whole sandbox, as a Kubernetes container
	// is ended: every process is killed at once and the sandbox is
	// stopped with a reason beginning "out of memory".
	OnOOMEndSandbox = "end_sandbox"
	// OnOOMKillProcess has the kernel's out-of-memory killer end one
	// process, the one using the most, which reports oom_killed; the
	// sandbox runs on, as a Docker container does.
	OnOOMKillProcess = "kill_process"
)

// LogRotation is when a captured log rotates and how many of its files
// are kept: per process, at most MaxSizeBytes × MaxFiles bytes on disk.
// Zero or left out is kilnd's default.
type LogRotation struct {
	// MaxSizeBytes is the size at which the active file is rotated:
	// MinLogFileSize to MaxLogFileSize.
	MaxSizeBytes int64 `json:"max_size_bytes,omitempty"`
	// MaxFiles is how many files are kept, the active one included:
	// MinLogFiles to MaxLogFiles.
	MaxFiles int `json:"max_files,omitempty"`
}

// Bounds of a LogRotation.
const (
	MinLogFileSize = 64 << 10
	MaxLogFileSize = 1 << 30
	MinLogFiles    = 2
	MaxLogFiles    = 100
)

// Network is a sandbox's network beyond its loopback. With egress, or an
// allow list, the sandbox gets an interface (eth0) with an address from
// kilnd's range, a route out through the host (NAT), and a resolv.conf
// naming the host's resolvers; its traffic is filtered in this order:
// Deny refused, the resolvers (port 53) reached, the host's own
// addresses refused whatever Allow says (so no kilnd's API port is ever
// reached), Allow reached, the private, loopback, link-local, shared and
// multicast ranges refused, then the rest reached with egress "allow"
// and refused with "none". IPv4 only; both runtimes.
type Network struct {
	// Egress is "none" (the default: only Allow) or "allow" (everything
	// but the refused above).
	Egress string `json:"egress,omitempty"`
	// Allow and Deny are IPv4 CIDRs ("203.0.113.0/24", or an address).
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
	// Address is the sandbox's address, kilnd's to choose: set in a
	// sandbox's description, ignored in a request.
	Address string `json:"address,omitempty"`
}

// Egress values.
const (
	EgressNone  = "none"
	EgressAllow = "allow"
)

// Sandbox states.
const (
	SandboxRunning = "running"
	SandboxStopped = "stopped"
	SandboxDeleted = "deleted"
	// SandboxPaused is a running sandbox whose processes are paused (POST
	// /sandboxes/{id}/pause): they keep their memory and run nothing until
	// it is resumed.
	SandboxPaused = "paused"
	// SandboxUnknown is, in a cluster, a sandbox whose node has missed its
	// heartbeats: it may run on or not, nobody can say yet.
	SandboxUnknown = "unknown"
	// SandboxNodeLost is, in a cluster, a sandbox whose node has been gone
	// longer than kilnd --node-lost-after: what it last was, its
	// processes' output up to what reached the cluster, stays readable; it
	// did not exit.
	SandboxNodeLost = "node_lost"
)

// Sandbox describes a sandbox.
type Sandbox struct {
	ID string `json:"id"`
	// Name is the name it was created with, if any.
	Name      string     `json:"name,omitempty"`
	State     string     `json:"state"`
	CreatedAt time.Time  `json:"created_at"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// PausedAt is when a paused sandbox was paused.
	PausedAt *time.Time `json:"paused_at,omitempty"`
	Hostname string     `json:"hostname"`
	Rootfs   string     `json:"rootfs,omitempty"`
	Runtime  string     `json:"runtime"`
	Limits   Limits     `json:"limits"`
	// OnOOM is what happens to it past its memory limit
	// (CreateSandbox.OnOOM).
	OnOOM    string `json:"on_oom"`
	Reason   string `json:"reason,omitempty"`
	AgentPID int    `json:"agent_pid,omitempty"`
	// Exit is the init command's exit, once the sandbox ended with it.
	Exit               *Exit `json:"exit,omitempty"`
	IdleTimeoutSeconds int64 `json:"idle_timeout_seconds,omitempty"`
	TTLSeconds         int64 `json:"ttl_seconds,omitempty"`
	// Network is the sandbox's network beyond its loopback, if any.
	Network *Network `json:"network,omitempty"`
	// Image is the image it was created from, as the request named it,
	// and ImageID that image's ID.
	Image   string `json:"image,omitempty"`
	ImageID string `json:"image_id,omitempty"`
	// Labels are those it was created with.
	Labels map[string]string `json:"labels,omitempty"`
	// Mounts are its host directories, as its create gave them.
	Mounts []Mount `json:"mounts,omitempty"`
	// Node is, in a cluster, the name of the node it runs on.
	Node string `json:"node,omitempty"`
}

// Node states, in a cluster (GET /nodes).
const (
	// NodeReady takes new sandboxes.
	NodeReady = "ready"
	// NodeDraining serves its sandboxes but takes no new ones (kiln node
	// drain).
	NodeDraining = "draining"
	// NodeUnreachable has missed its heartbeats for a few seconds.
	NodeUnreachable = "unreachable"
	// NodeLost has been unreachable longer than kilnd --node-lost-after:
	// its sandboxes are node_lost.
	NodeLost = "lost"
)

// Node describes one kilnd of a cluster, as its last heartbeat told.
type Node struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// APIURL is where the other nodes reach its API.
	APIURL string `json:"api_url"`
	// Labels are its kilnd --node-label pairs, matched by a create's
	// constraints.
	Labels map[string]string `json:"labels,omitempty"`
	// Version is its kilnd's version; Incarnation is new at each start
	// of its kilnd.
	Version     string    `json:"version"`
	Incarnation string    `json:"incarnation"`
	StartedAt   time.Time `json:"started_at"`
	// SeenAt is when its last heartbeat reached the cluster.
	SeenAt time.Time `json:"seen_at"`
	// Capacity and load, from that heartbeat.
	CPUs            int   `json:"cpus"`
	MemoryBytes     int64 `json:"memory_bytes"`
	FreeMemoryBytes int64 `json:"free_memory_bytes"`
	Sandboxes       int   `json:"sandboxes"`
	// Self is set on the node that answered.
	Self bool `json:"self,omitempty"`
	// Moved is, in the answer of a drain that moves stopped sandboxes
	// (DrainRequest.MoveStopped), each such sandbox and where it went.
	Moved []MovedSandbox `json:"moved,omitempty"`
}

// DrainRequest is the body of POST /nodes/{name}/drain, which may be
// left out.
type DrainRequest struct {
	// MoveStopped moves each stopped sandbox of the node to another
	// ready node: a snapshot of its files, exported and imported there,
	// becomes a sandbox of the same name, labels and settings, then the
	// one on the drained node is deleted.
	MoveStopped bool `json:"move_stopped,omitempty"`
}

// MovedSandbox is one stopped sandbox a drain moved, or failed to.
type MovedSandbox struct {
	// Sandbox is its id on the drained node, Name its name.
	Sandbox string `json:"sandbox"`
	Name    string `json:"name,omitempty"`
	// Node and ID are the node it went to and its id there.
	Node string `json:"node,omitempty"`
	ID   string `json:"id,omitempty"`
	// Error says why it did not move; Snapshot, then, a snapshot that
	// holds its files (on the drained node, and on Node when it reached
	// it): nothing of it is lost.
	Error    string `json:"error,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
}

// Health is GET /healthz's and GET /readyz's answer.
type Health struct {
	// Status is "ok", or at /readyz why kilnd is not ready.
	Status string `json:"status"`
	// Cluster is there on a kilnd in a cluster.
	Cluster *Cluster `json:"cluster,omitempty"`
}

// Cluster is GET /healthz's word on a clustered kilnd's cluster.
type Cluster struct {
	// Node is this kilnd's name in it.
	Node string `json:"node"`
	// State is "connected", or "down" with Error saying why: the node
	// serves its own sandboxes meanwhile, and exports their output when
	// the cluster is back.
	State string `json:"state"`
	// Error is why it is down, for kilnd's log: the routes that tell the
	// state ask no token, and say no more.
	Error string `json:"-"`
}

// SandboxStats are a running sandbox's resource figures, read from its
// cgroups when asked. A figure the host's cgroups do not keep for it (on
// a host with cgroup v1 controllers, those of a controller it has no
// limit on) is left out, as is a limit it does not have.
type SandboxStats struct {
	// CPUSeconds is the CPU time its processes, the agent among them,
	// have used since it was created.
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryBytes and MemoryPeakBytes are its memory now and at most.
	MemoryBytes      *int64 `json:"memory_bytes,omitempty"`
	MemoryPeakBytes  *int64 `json:"memory_peak_bytes,omitempty"`
	MemoryLimitBytes *int64 `json:"memory_limit_bytes,omitempty"`
	// Pids counts its tasks (threads included).
	Pids      *int64 `json:"pids,omitempty"`
	PidsLimit *int64 `json:"pids_limit,omitempty"`
	// OOMKills counts the kernel's out-of-memory kills in it.
	OOMKills *int64 `json:"oom_kills,omitempty"`
	// Processes counts the processes its agent runs now (those started
	// through the API), when the agent answered.
	Processes *int `json:"processes,omitempty"`
	// Counts are what its agent has counted since the sandbox started,
	// when the agent answered.
	Counts *AgentCounts `json:"counts,omitempty"`
	ReadAt time.Time    `json:"read_at"`
}

// AgentCounts are what a sandbox's agent has counted since it started:
// the processes it started and, of those that finished, how they ended
// and what their captured logs kept; the watchers of their output, and
// what those were told they lost.
type AgentCounts struct {
	ProcessesStarted    int64 `json:"processes_started"`
	ExitedZero          int64 `json:"exited_zero"`
	ExitedNonZero       int64 `json:"exited_nonzero"`
	Signaled            int64 `json:"signaled"`
	OOMKilled           int64 `json:"oom_killed"` // of Signaled
	CaptureWrittenBytes int64 `json:"capture_written_bytes"`
	CaptureDroppedBytes int64 `json:"capture_dropped_bytes"`
	WatchersAttached    int64 `json:"watchers_attached"`
	WatcherGaps         int64 `json:"watcher_gaps"`
	WatcherLostBytes    int64 `json:"watcher_lost_bytes"`
	// DiskUsedBytes and DiskSizeBytes are the use of the sandbox's own
	// disk now (its /workspace and writable layer), when it has one.
	DiskUsedBytes *int64 `json:"disk_used_bytes,omitempty"`
	DiskSizeBytes *int64 `json:"disk_size_bytes,omitempty"`
}

// Image is an OCI image kilnd keeps, that sandboxes start from.
type Image struct {
	// ID is "sha256:" and the hex digest of its config.
	ID string `json:"id"`
	// Names are its fully qualified references
	// ("index.docker.io/library/busybox:latest"); an image without one is
	// reached by its ID.
	Names []string `json:"names"`
	// Digest is the manifest's (or index's) digest it was pulled by.
	Digest string `json:"digest,omitempty"`
	// Layers are its layers' diffIDs, the bottom one first.
	Layers []string `json:"layers"`
	// Size is the bytes of its unpacked layers' files.
	Size     int64       `json:"size"`
	Created  time.Time   `json:"created,omitzero"`
	Added    time.Time   `json:"added"`
	Platform string      `json:"platform"`
	Config   ImageConfig `json:"config"`
}

// ImageConfig is what an image's config says of the processes started in
// a sandbox made from it: their defaults.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Command is what a process given no command runs in a sandbox made from
// the image, as docker run has it: the entrypoint and args, or, without
// args, the entrypoint and the image's cmd. Empty if the image has
// neither.
func (c ImageConfig) Command(args []string) []string {
	if len(args) == 0 {
		args = c.Cmd
	}
	if len(c.Entrypoint)+len(args) == 0 {
		return nil
	}
	return append(slices.Clone(c.Entrypoint), args...)
}

// PullImage is the body of POST /images/pull.
type PullImage struct {
	// Ref is a reference: "busybox", "registry.example:5000/team/app:v2",
	// "name@sha256:…".
	Ref string `json:"ref"`
}

// ImageProgress is one line of the NDJSON answer of POST /images/pull
// and POST /images/import: a layer's progress, then "done" with the
// images, or "error" with what went wrong (the answer's status is 200
// once a line is written).
type ImageProgress struct {
	// Status is "downloading", "unpacking" (an import), "exists" (a layer
	// kilnd has), "done" or "error".
	Status string `json:"status"`
	// Layer is the diffID the line is about; Bytes of Total (0: unknown)
	// of its blob are read.
	Layer string `json:"layer,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
	Total int64  `json:"total,omitempty"`
	// Images are what a "done" pulled or imported.
	Images []Image `json:"images,omitempty"`
	// Error is an "error" line's.
	Error *ErrorBody `json:"error,omitempty"`
}

// The last line's statuses of an ImageProgress answer.
const (
	ImageDone  = "done"
	ImageError = "error"
)

// ImageRemoval answers DELETE /images/{name}: the names removed, and
// whether the image went with its last name (and the layers no other
// image has).
type ImageRemoval struct {
	ID       string   `json:"id"`
	Untagged []string `json:"untagged"`
	Deleted  bool     `json:"deleted"`
}

// RunLossless is the State of a Run that lost nothing.
const RunLossless = "lossless"

// Run is one run of a captured log and what the log says of it:
// lossless, lossy, interrupted, retention-loss, unknown or corrupted.
type Run struct {
	ID      string           `json:"id,omitempty"`
	State   string           `json:"state"`
	Dropped map[string]int64 `json:"dropped,omitempty"`
	// Missed is set when the reader missed part of the run to rotation.
	Missed   bool     `json:"missed,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// Parent is the run this one continues: a process restored from a
	// memory snapshot goes on in a run of its own, from where the
	// snapshot's run stood. ContinuedBy is the run that continues this
	// one in the log, from where its records end.
	Parent      string `json:"parent,omitempty"`
	ContinuedBy string `json:"continued_by,omitempty"`
}

// LogStats count what reading a captured log could not return.
type LogStats struct {
	Before        int64 `json:"before,omitempty"`         // log bytes rotated away before the oldest file kept
	Missed        int64 `json:"missed,omitempty"`         // log bytes rotated away while reading
	MissedUnknown int   `json:"missed_unknown,omitempty"` // gaps of unknown size
	Corrupt       int   `json:"corrupt,omitempty"`        // lines that were not records
	Torn          int   `json:"torn,omitempty"`           // lines cut short
	Bytes         int64 `json:"bytes"`                    // log bytes read
}

// CapturedLog describes one process's captured log.
type CapturedLog struct {
	Process string   `json:"process"`
	Runs    []Run    `json:"runs"`
	Stats   LogStats `json:"stats"`
	// Complete is set when every retained run is lossless.
	Complete bool `json:"complete"`
}

// LogRecord is one captured record in the NDJSON shape of
// GET /sandboxes/{id}/logs/{pid} (?format=json, or Accept:
// application/x-ndjson), or a gap: LostBytes of Stream lost at Offset
// (the capture's queue or writer lost them), or Gap log bytes rotation
// removed while reading.
type LogRecord struct {
	Time   time.Time `json:"time"`
	Stream string    `json:"stream,omitempty"`
	// Offset is where the record's bytes (or a stream gap's) begin in its
	// stream: how many bytes the stream had produced before them. Left out
	// when the log does not say.
	Offset  *int64 `json:"offset,omitempty"`
	Partial bool   `json:"partial,omitempty"`
	Text    string `json:"text,omitempty"`
	Base64  string `json:"base64,omitempty"` // the content, when not valid UTF-8
	// LostBytes makes the record a stream gap: bytes of Stream that are
	// not in the log, lost right before its next record.
	LostBytes int64 `json:"lost_bytes,omitempty"`
	Gap       int64 `json:"gap,omitempty"`
}

// Errors of Check; a server answers them with CodeInvalid and CodeTooLarge.
var (
	ErrInvalid  = errdefs.New(errdefs.ErrInvalidArgument, "invalid request")
	ErrTooLarge = errdefs.New(errdefs.ErrTooLarge, "request too large")
)

// Check validates an exec request against the API's bounds: a command, at
// most MaxArgs words and MaxEnv variables, MaxArgvEnv bytes of them, no NUL
// anywhere, environment names without '=', a known stdin mode (none for a
// finite exec), a terminal size within MaxTTYSize, and the finite-only
// fields only on a finite exec.
func (r ExecRequest) Check(finite bool) error {
	if r.Command == "" {
		return fmt.Errorf("%w: command is required", ErrInvalid)
	}
	if n := 1 + len(r.Args); n > MaxArgs {
		return fmt.Errorf("%w: %d arguments, at most %d", ErrTooLarge, n, MaxArgs)
	}
	if len(r.Env) > MaxEnv {
		return fmt.Errorf("%w: %d environment entries, at most %d", ErrTooLarge, len(r.Env), MaxEnv)
	}
	if len(r.User) > MaxUser || strings.IndexByte(r.User, 0) >= 0 {
		return fmt.Errorf("%w: user: at most %d bytes, no NUL", ErrInvalid, MaxUser)
	}
	size := 0
	for _, a := range append([]string{r.Command, r.Cwd}, r.Args...) {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("%w: a NUL byte in the command, an argument or the working directory", ErrInvalid)
		}
		size += len(a) + 1
	}
	for k, v := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("%w: environment variable %q", ErrInvalid, Clip(k))
		}
		size += len(k) + len(v) + 2
	}
	if size > MaxArgvEnv {
		return fmt.Errorf("%w: command, arguments and environment take %d bytes, at most %d", ErrTooLarge, size, MaxArgvEnv)
	}
	switch r.Stdin {
	case "", StdinClosed:
	case StdinPipe:
		if finite {
			return fmt.Errorf("%w: a finite exec has no stdin; use exec-stream", ErrInvalid)
		}
	default:
		return fmt.Errorf("%w: stdin %q: want %q or %q", ErrInvalid, Clip(r.Stdin), StdinPipe, StdinClosed)
	}
	switch r.Flow {
	case "", FlowDrop, FlowBlock:
	default:
		return fmt.Errorf("%w: flow %q: want %q or %q", ErrInvalid, Clip(r.Flow), FlowDrop, FlowBlock)
	}
	if r.DrainMS < 0 || r.DrainMS > MaxDrainMS {
		return fmt.Errorf("%w: drain_ms %d: want 0 (the default, %d) to %d", ErrInvalid, r.DrainMS, DefaultDrainMS, MaxDrainMS)
	}
	if t := r.TTY; t != nil && (t.Cols == 0 || t.Rows == 0 || t.Cols > MaxTTYSize || t.Rows > MaxTTYSize) {
		return fmt.Errorf("%w: terminal size %dx%d", ErrInvalid, t.Cols, t.Rows)
	}
	if finite {
		if r.MaxOutputBytes < 0 || r.MaxOutputBytes > DefaultMaxOutput {
			return fmt.Errorf("%w: max_output_bytes %d: want 1 to %d", ErrInvalid, r.MaxOutputBytes, DefaultMaxOutput)
		}
		if r.TimeoutMS < 0 || r.TimeoutMS > MaxTimeoutMS {
			return fmt.Errorf("%w: timeout_ms %d: want 0 (none) to %d (7 days)", ErrInvalid, r.TimeoutMS, MaxTimeoutMS)
		}
	} else if r.MaxOutputBytes != 0 || r.TimeoutMS != 0 {
		return fmt.Errorf("%w: max_output_bytes and timeout_ms belong to a finite exec", ErrInvalid)
	}
	return nil
}

// Clip is a value a client sent, as an error quotes it back: its first
// 64 bytes, "…" if there were more, and valid UTF-8.
func Clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// FileInfo describes an entry of a sandbox's file system, as the files
// routes list and stat it.
type FileInfo struct {
	Name    string    `json:"name"`
	Type    string    `json:"type"` // FileRegular, FileDir, FileSymlink or FileOther
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // permission bits in octal, as chmod takes them: "0644"
	ModTime time.Time `json:"mtime"`
	Link    string    `json:"link,omitempty"` // a symbolic link's target
}

// FileInfo types.
const (
	FileRegular = "file"
	FileDir     = "dir"
	FileSymlink = "symlink"
	FileOther   = "other" // a device, socket or FIFO
)

// PathStatHeader carries, on GET /sandboxes/{id}/archive, the FileInfo
// (JSON) of the path archived, as Docker's X-Docker-Container-Path-Stat
// does.
const PathStatHeader = "Kiln-Path-Stat"

// CreatePreview is the body of POST /sandboxes/{id}/previews.
type CreatePreview struct {
	Port       int   `json:"port"`
	TTLSeconds int64 `json:"ttl_seconds,omitempty"` // default an hour, at most 7 days
}

// Preview is a URL reaching a sandbox's port without kilnd's token. URL
// and Token are given once, when it is made.
type Preview struct {
	ID        string    `json:"id"`
	Port      int       `json:"port"`
	URL       string    `json:"url,omitempty"`
	Token     string    `json:"token,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
}

// FileEvent is a message of a files watch (GET …/files/DIR?watch=true):
// an event under the directory, with its sequence number, or a gap of
// Lost events the watch no longer holds, up to Seq.
type FileEvent struct {
	Type string `json:"type"`          // WatchTypeEvent or WatchTypeGap
	Seq  uint64 `json:"seq,omitempty"` // an event's number, from 1; a gap's last
	Op   string `json:"op,omitempty"`  // FileCreated, FileWritten, FileRemoved, FileRenamed, FileOverflow
	Path string `json:"path,omitempty"`
	From string `json:"from,omitempty"` // a rename's old path
	Dir  bool   `json:"dir,omitempty"`
	Lost uint64 `json:"lost,omitempty"` // a gap's count
}

// FileEvent ops. An overflow is the kernel's queue overflowing: events
// were lost there, how many it does not say.
const (
	FileCreated  = "create"
	FileWritten  = "write"
	FileRemoved  = "remove"
	FileRenamed  = "rename"
	FileOverflow = "overflow"
)

// The types of a files watch's messages (kiln.watch): a WatchHello, then
// FileEvents, each an event or a gap.
const (
	WatchTypeHello = "hello"
	WatchTypeEvent = "event"
	WatchTypeGap   = "gap"
)

// WatchHello is a files watch's first message: its id (to resume with
// ?id=ID&after=SEQ), its directory, and the last event's number so far.
type WatchHello struct {
	Type string `json:"type"` // WatchTypeHello
	ID   string `json:"id"`
	Dir  string `json:"dir"`
	Seq  uint64 `json:"seq"`
}

// MoveHeader, on a WebSocket request kilnd sends an agent, offers to hand
// the agent the client's connection itself, so that the output goes to
// the client without passing through kilnd; on the agent's switch of
// protocols it takes the offer. The agent then writes MoveMarker, once its
// server reads no more of the connection, and nothing else until kilnd
// has answered with its MoveMarker message: the marker byte, the length of what
// the client had sent early (four bytes, big-endian), those bytes, and,
// as ancillary data, the client's socket, or none where kilnd cannot hand
// it over (the agent stays on kilnd's connection, and kilnd relays).
const MoveHeader = "Kiln-Move"

// MoveMarker begins the message that answers a MoveHeader.
const MoveMarker = 'M'

// MaxMoveEarly bounds the client's early bytes a MoveMarker message
// carries (kilnd's buffered reader holds fewer).
const MaxMoveEarly = 64 << 10

// TopProcess is one process running in a sandbox, as GET
// /sandboxes/{id}/top lists them (docker top's rows): every process of
// the sandbox, those the API started and those they started, the
// sandbox's agent (its PID 1) among them.
type TopProcess struct {
	// PID and PPID are the process's and its parent's, as the sandbox
	// sees them.
	PID  int `json:"pid"`
	PPID int `json:"ppid"`
	UID  int `json:"uid"`
	// State is the kernel's letter: R running, S sleeping, D in a disk's
	// wait, Z a zombie, T stopped.
	State      string  `json:"state"`
	CPUSeconds float64 `json:"cpu_seconds"`
	RSSBytes   int64   `json:"rss_bytes"`
	// Command is its command line, its arguments joined by spaces (at
	// most MaxTopCommand bytes, then "…"); a kernel thread's or a zombie's
	// name in brackets.
	Command string `json:"command"`
}

// MaxTopCommand bounds a TopProcess's Command; MaxTopProcesses the rows
// of one answer.
const (
	MaxTopCommand   = 4096
	MaxTopProcesses = 16384
)

// Snapshot is a sandbox's files as they were at one moment: its disk (its
// workspace and, with an image, the image's writable layer), copied while
// its file system was frozen. It outlives its sandbox.
type Snapshot struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Sandbox is the id of the sandbox it was taken of, SandboxName that
	// sandbox's name then.
	Sandbox     string    `json:"sandbox"`
	SandboxName string    `json:"sandbox_name,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	Runtime     string    `json:"runtime"`
	Image       string    `json:"image,omitempty"`
	// DiskBytes is the size of its disk (the sandbox's disk quota);
	// SizeBytes what it takes of the host's disk, which counts against
	// kilnd's snapshot quota.
	DiskBytes int64 `json:"disk_bytes"`
	SizeBytes int64 `json:"size_bytes"`
	// Copy is how its disk was copied: "reflink" (extents shared with the
	// sandbox's, copied when either writes) or "copy".
	Copy string `json:"copy"`
	// Processes are the sandbox's processes when it was taken, each
	// stream's total_bytes its offset then.
	Processes []Process `json:"processes"`
	// Memory says its processes were saved too (a gVisor sandbox's): a
	// sandbox made from it goes on running them where they were.
	Memory bool `json:"memory,omitempty"`
	// Node is the node that keeps its files, in a cluster (kilnd
	// --cluster); NodeState that node's state (a Node's State): a
	// snapshot of an unreachable or lost node is listed, not served.
	Node      string `json:"node,omitempty"`
	NodeState string `json:"node_state,omitempty"`
}

// SnapshotRequest is the body of POST /sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	// Name, when set, names the snapshot: unique among snapshots, as a
	// sandbox's name is (ValidName).
	Name string `json:"name,omitempty"`
	// Memory saves the sandbox's processes too, memory and all (runsc
	// checkpoint): a gVisor sandbox's only.
	Memory bool `json:"memory,omitempty"`
}

// RollbackRequest is the body of POST /sandboxes/{id}/rollback.
type RollbackRequest struct {
	// Snapshot is the snapshot, of this sandbox, whose files it gets.
	Snapshot string `json:"snapshot"`
}

// ForkRequest is the body of POST /sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many sandboxes to make (default 1, at most MaxForks).
	Count int `json:"count,omitempty"`
	// Labels are added to those each fork has from its sandbox.
	Labels map[string]string `json:"labels,omitempty"`
	// FilesOnly forks a running gVisor sandbox's files alone; otherwise
	// its processes are saved and go on in each fork, where they were.
	// (A namespace sandbox's forks have its files alone.)
	FilesOnly bool `json:"files_only,omitempty"`
}

// MaxForks bounds one fork's sandboxes.
const MaxForks = 64

// Forked answers POST /sandboxes/{id}/fork: the sandboxes made, each
// with the files the sandbox had at the moment of the fork.
type Forked struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}
