// Package agent serves a sandbox's process API over HTTP: the engine's processes, their output as WebSocket or plain streams, stdin, signals and waits.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/decode"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/files"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// Config sets up a Server.
type Config struct {
	// Table holds the sandbox's processes; the Server does not own it.
	Table *process.Table
	// Env is every process's base environment; a request's env is added
	// to it, replacing entries with the same name.
	Env []string
	// Dir is the default working directory.
	Dir string
	// Entrypoint and Cmd, an image's, are what a request of no command
	// runs (api.ImageConfig.Command); without them it is refused.
	Entrypoint, Cmd []string
	// User, an image's, is who a request of no user runs as (empty:
	// root).
	User string
	// Logs is the directory under which captured processes get theirs
	// (one per process id); nil refuses capture.
	Logs *capture.Dir
	// Capture sets up each captured run's writer.
	Capture capture.Options
	// Launch, when set, starts every process (see process.Spec.Launch):
	// the sandbox's isolation and confinement.
	Launch func(cmd *exec.Cmd) (*os.Process, error)
	// OOMKills, when set, counts the sandbox's out-of-memory kills (see
	// process.Spec.OOMKills).
	OOMKills func() int64
	// FlowGrace is how long the output of a process started with flow
	// block waits for its holding watcher (zero: process.DefaultFlowGrace).
	FlowGrace time.Duration
	// Disk is a directory on the sandbox's own disk, whose use GET /counts
	// reports; empty when the sandbox has none (its /workspace is then a
	// directory of the host's, whose use is not the sandbox's).
	Disk string
	// Usage, when set, reads what a runtime's own kernel counts of the
	// sandbox's processes, which GET /usage answers for kilnd (see
	// handoff.GuestUsage).
	Usage func() (handoff.GuestUsage, error)
	Log   *slog.Logger
}

// Server is the HTTP face of a process table.
type Server struct {
	cfg Config
	mux *http.ServeMux
	// Watchers of output: attached, and the gaps and bytes they were told
	// they lost.
	watchers, gaps, lost atomic.Int64
	// feed is the processes' starts and ends, for kilnd's events.
	feed *feed
	// runs are the captured processes' log writers, held for a memory
	// snapshot or not (see hold.go).
	runs runs
}

// New makes a Server.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), feed: newFeed()}
	if cfg.Table != nil {
		cfg.Table.Observe(s.feed.observe)
	}
	s.routes()
	return s
}

// ServeHTTP serves the process API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Serve serves the process API with hs (its Handler and ConnContext are
// set here) on the connections l accepts, as http.Server.Serve does: the
// output watchers' handlers write to their connections themselves.
func (s *Server) Serve(hs *http.Server, l net.Listener) error {
	hs.Handler = s
	hs.ConnContext = withConn
	return hs.Serve(moveListener{l})
}

// byPrefix has h called with the {pid} of the request the whole id of
// the process it names (process.Table.Resolve): a unique prefix of four
// characters or more does, as a sandbox's does at kilnd.
func (s *Server) byPrefix(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := s.cfg.Table.Resolve(r.PathValue("pid"))
		if err != nil {
			writeError(w, err)
			return
		}
		r.SetPathValue("pid", id)
		h(w, r)
	}
}

func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	m.HandleFunc("POST /exec", s.exec)
	m.HandleFunc("POST /exec-stream", s.startStream)
	m.HandleFunc("GET /exec-stream", s.list)
	m.HandleFunc("GET /counts", s.counts)
	m.HandleFunc("GET /process-events", s.serveFeed)
	m.HandleFunc("GET /top", s.top)
	m.HandleFunc("GET "+handoff.UsagePath, s.usage)
	m.HandleFunc("GET /exec-stream/{pid}", s.byPrefix(s.status))
	m.HandleFunc("DELETE /exec-stream/{pid}", s.byPrefix(s.terminate))
	m.HandleFunc("GET /exec-stream/{pid}/wait", s.byPrefix(s.wait))
	m.HandleFunc("POST /exec-stream/{pid}/signal", s.byPrefix(s.signal))
	m.HandleFunc("POST /exec-stream/{pid}/stdin", s.byPrefix(s.stdin))
	m.HandleFunc("POST /exec-stream/{pid}/stdin/close", s.byPrefix(s.closeStdin))
	m.HandleFunc("POST /exec-stream/{pid}/resize", s.byPrefix(s.resize))
	m.HandleFunc("POST /exec-stream/{pid}/release", s.byPrefix(s.release))
	m.HandleFunc("GET /exec-stream/{pid}/logs", s.byPrefix(s.logs))
	m.HandleFunc("GET "+handoff.RetainedPath+"{pid}", s.byPrefix(s.retained))
	m.HandleFunc("POST /capture/hold", s.holdRuns)
	m.HandleFunc("POST /capture/release", s.releaseRuns)
	m.HandleFunc("POST /capture/continue", s.continueRuns)
	if s.cfg.Launch != nil {
		(&files.Server{Launch: s.cfg.Launch}).Register(m)
	}
	m.HandleFunc("/ports/{port}/{path...}", s.proxyPort)
	m.HandleFunc("/ports/{port}", func(w http.ResponseWriter, r *http.Request) {
		// An app's relative links need the trailing slash.
		http.Redirect(w, r, r.Header.Get(api.PrefixHeader)+"/", http.StatusMovedPermanently)
	})
	m.HandleFunc("GET /tcp/{port}", s.forwardPort)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("%w: no route %s %s", errdefs.ErrNotFound, r.Method, r.URL.Path))
	})
}

// errBadJSON is a body or a control message that is not the JSON asked
// for: the one decoder's refusal (decode.Body), for messages too.
var errBadJSON = decode.ErrMalformed

// writeError answers with the error's class, the engine's errors and this
// package's alike: no error is mapped here.
var writeError = reply.Error

var writeJSON = reply.JSON

// spec turns a request into a process spec, checking every bound.
func (s *Server) spec(req api.ExecRequest, finite bool) (process.Spec, error) {
	if req.Command == "" {
		if argv := (api.ImageConfig{Entrypoint: s.cfg.Entrypoint, Cmd: s.cfg.Cmd}).Command(req.Args); len(argv) > 0 {
			req.Command, req.Args = argv[0], argv[1:]
		}
	}
	if err := req.Check(finite); err != nil {
		return process.Spec{}, err
	}
	argv := append([]string{req.Command}, req.Args...)
	env := slices.Clone(s.cfg.Env)
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, k+"="+req.Env[k])
	}
	spec := process.Spec{Argv: argv, Env: env, Dir: req.Cwd, Launch: s.cfg.Launch, OOMKills: s.cfg.OOMKills, FlowGrace: s.cfg.FlowGrace}
	if name := cmp.Or(req.User, s.cfg.User); name != "" && name != "root" && name != "0" && name != "0:0" && name != "root:root" {
		u, err := lookupUser(name)
		if err != nil {
			return process.Spec{}, err
		}
		spec.Credential = u.cred
		// Its home, as docker sets it, unless the request says.
		if _, set := req.Env["HOME"]; !set && u.home != "" {
			spec.Env = slices.DeleteFunc(spec.Env, func(e string) bool { return strings.HasPrefix(e, "HOME=") })
			spec.Env = append(spec.Env, "HOME="+u.home)
		}
	}
	if req.Flow == api.FlowBlock {
		spec.Flow = process.FlowBlock
	}
	spec.Drain = time.Duration(req.DrainMS) * time.Millisecond
	if spec.Dir == "" {
		spec.Dir = s.cfg.Dir
	}
	if req.Stdin == api.StdinPipe {
		spec.Stdin = process.StdinPipe
	}
	if t := req.TTY; t != nil {
		spec.Terminal = &process.WindowSize{Cols: t.Cols, Rows: t.Rows}
	}
	if req.Capture {
		if s.cfg.Logs == nil {
			return process.Spec{}, fmt.Errorf("%w: this sandbox has no capture directory", process.ErrInvalid)
		}
		spec.Begin = s.begin
	}
	return spec, nil
}

// begin starts the capture of process id in its own directory.
func (s *Server) begin(id string) (process.Capturer, error) {
	d, err := s.cfg.Logs.Sub(id)
	if err != nil {
		return nil, err
	}
	w, err := capture.Begin(d, uuid.Must(uuid.NewV7()).String(), s.cfg.Capture)
	if err != nil {
		d.Close()
		return nil, err
	}
	s.runs.add(id, w)
	// The writer uses the directory until its run ends.
	go func() {
		<-w.Done()
		s.runs.remove(id)
		d.Close()
	}()
	return w, nil
}

// StartInit starts a sandbox's init command: like an exec-stream, always
// captured, with stdin closed.
func (s *Server) StartInit(req api.ExecRequest) (string, error) {
	req.Capture = s.cfg.Logs != nil
	req.Stdin = api.StdinClosed
	spec, err := s.spec(req, false)
	if err != nil {
		return "", err
	}
	return s.cfg.Table.Start(spec)
}

func (s *Server) startStream(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := decode.Body(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	spec, err := s.spec(req, false)
	if err != nil {
		writeError(w, err)
		return
	}
	id, err := s.cfg.Table.Start(spec)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Started{ID: id})
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	sts := s.cfg.Table.List()
	out := make([]api.Process, len(sts))
	for i, st := range sts {
		out[i] = toAPI(st)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	st, err := s.cfg.Table.Status(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPI(st))
}

// streamName is a ring stream's name on the wire.
func streamName(st ring.Stream) string {
	return api.StreamNames[streamCode(st)]
}

func streamCode(st ring.Stream) byte {
	switch st {
	case ring.Stderr:
		return api.StreamStderr
	case ring.PTY:
		return api.StreamTerminal
	}
	return api.StreamStdout
}

func toExit(e *process.Exit) api.Exit {
	if e == nil {
		return api.Exit{}
	}
	var x api.Exit
	if e.Signal != 0 {
		x = api.SignalExit(unix.SignalName(e.Signal))
		x.OOMKilled = e.OOMKilled
	} else {
		code := e.Code
		x.ExitCode = &code
	}
	if e.OutputCut {
		x.OutputCut = api.OutputCutDrain
	}
	return x
}

func toAPI(st process.Status) api.Process {
	p := api.Process{
		ID:        st.ID,
		State:     string(st.State),
		Exit:      toExit(st.Exit),
		PID:       st.PID,
		Terminal:  st.Terminal,
		Flow:      api.FlowDrop,
		Held:      st.Held,
		Streams:   map[string]api.StreamStatus{},
		StartedAt: st.StartedAt.UTC(),
	}
	if st.Flow == process.FlowBlock {
		p.Flow = api.FlowBlock
	}
	if len(st.Argv) > 0 {
		p.Command, p.Args = st.Argv[0], st.Argv[1:]
	}
	for _, s := range st.Streams {
		dropped := st.Dropped[s]
		if st.Capture != nil {
			// Once the output has drained, the run's whole loss: the
			// writer's failed writes (a full disk) as well as what its
			// queue dropped. (While it runs, only the queue's drops are
			// known here.)
			ls := capture.LogStdout
			if s == ring.Stderr {
				ls = capture.LogStderr
			}
			dropped = max(dropped, st.Capture.Dropped[ls])
		}
		p.Streams[streamName(s)] = api.StreamStatus{TotalBytes: st.Totals[s], Ended: st.Ended[s], CaptureDropped: dropped}
	}
	if st.Stdin != nil {
		p.Stdin = &api.StdinStatus{Accepted: st.Stdin.Accepted, Delivered: st.Stdin.Delivered, Closed: st.Stdin.Closed, Broken: st.Stdin.Broken != nil}
	}
	if st.State == process.Exited {
		t := st.ExitedAt.UTC()
		p.ExitedAt = &t
	}
	return p
}

// counts answers with what this agent has counted (api.AgentCounts).
func (s *Server) counts(w http.ResponseWriter, r *http.Request) {
	t := s.cfg.Table.Tally()
	c := api.AgentCounts{
		ProcessesStarted: t.Started, ExitedZero: t.ExitedZero, ExitedNonZero: t.ExitedNonZero, Signaled: t.Signaled, OOMKilled: t.OOMKilled,
		CaptureWrittenBytes: t.CaptureWritten, CaptureDroppedBytes: t.CaptureDropped,
		WatchersAttached: s.watchers.Load(), WatcherGaps: s.gaps.Load(), WatcherLostBytes: s.lost.Load(),
	}
	var fs unix.Statfs_t
	if s.cfg.Disk != "" && unix.Statfs(s.cfg.Disk, &fs) == nil {
		size, free := int64(fs.Blocks)*fs.Bsize, int64(fs.Bfree)*fs.Bsize
		used := size - free
		c.DiskUsedBytes, c.DiskSizeBytes = &used, &size
	}
	writeJSON(w, http.StatusOK, c)
}

// usage answers with what the runtime's kernel counts of the sandbox's
// processes; 404 where the host's groups count them.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Usage == nil {
		writeError(w, fmt.Errorf("%w: no usage of the runtime's here", errdefs.ErrNotFound))
		return
	}
	u, err := s.cfg.Usage()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, u)
}

// terminate answers with the process as it was when the kill was sent,
// so "exited" means it had exited before and nothing was sent; a status
// read after the kill could already show the exit the kill caused.
func (s *Server) terminate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pid")
	before, err := s.cfg.Table.Status(id)
	if err != nil {
		writeError(w, err)
		return
	}
	switch err := s.cfg.Table.Terminate(id); {
	case errors.Is(err, process.ErrFinished):
		s.status(w, r)
	case err != nil:
		writeError(w, err)
	default:
		writeJSON(w, http.StatusOK, toAPI(before))
	}
}

// wait blocks until the exit is observed or the client goes away.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) {
	e, err := s.cfg.Table.Wait(r.Context(), r.PathValue("pid"))
	if err != nil {
		if r.Context().Err() != nil {
			return // the client left; nobody to answer
		}
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toExit(&e))
}

// parseSignal reads "TERM", "SIGTERM" or "15".
func parseSignal(v string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("%w: signal %d", process.ErrInvalid, n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, fmt.Errorf("%w: unknown signal %q", process.ErrInvalid, api.Clip(v))
}

func (s *Server) signal(w http.ResponseWriter, r *http.Request) {
	var req api.SignalRequest
	if err := decode.Body(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		writeError(w, err)
		return
	}
	group := req.Group == nil || *req.Group
	if err := s.cfg.Table.Signal(r.PathValue("pid"), sig, group); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// stdin writes the body at ?offset=N (default: where the input stands).
func (s *Server) stdin(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pid")
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, api.MaxStdin))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeError(w, fmt.Errorf("%w: stdin writes are at most %d bytes", errdefs.ErrTooLarge, api.MaxStdin))
		return
	}
	if err != nil {
		// A body cut short: nothing of it is written.
		writeError(w, fmt.Errorf("%w: reading the body: %w", process.ErrInvalid, err))
		return
	}
	offset, given, err := stdinOffset(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	if !given {
		st, err := s.cfg.Table.Status(id)
		if err != nil {
			writeError(w, err)
			return
		}
		if st.Stdin == nil {
			writeError(w, process.ErrNoStdin)
			return
		}
		offset = st.Stdin.Accepted
	}
	accepted, err := s.cfg.Table.Write(id, offset, data)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.StdinAccepted{Accepted: accepted})
}

// stdinOffset reads a stdin write's ?offset=N; given is false without
// one (the write goes where the input stands).
func stdinOffset(q url.Values) (offset int64, given bool, err error) {
	v := q.Get("offset")
	if v == "" {
		return 0, false, nil
	}
	if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
		return 0, false, fmt.Errorf("%w: offset %q", process.ErrInvalid, api.Clip(v))
	}
	return offset, true, nil
}

func (s *Server) closeStdin(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Table.CloseStdin(r.PathValue("pid")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// release lets go of the output a flow block process holds for readers
// not attached (see process.Table.Release).
func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Table.Release(r.PathValue("pid")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resize(w http.ResponseWriter, r *http.Request) {
	var req api.ResizeRequest
	if err := decode.Body(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Cols == 0 || req.Rows == 0 || req.Cols > api.MaxTTYSize || req.Rows > api.MaxTTYSize {
		writeError(w, fmt.Errorf("%w: terminal size %dx%d", process.ErrInvalid, req.Cols, req.Rows))
		return
	}
	if err := s.cfg.Table.Resize(r.PathValue("pid"), process.WindowSize{Cols: req.Cols, Rows: req.Rows}); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// text returns b as a JSON-safe string, and its exact bytes in base64 when
// it is not valid UTF-8.
func text(b []byte) (string, bool) {
	if utf8.Valid(b) {
		return string(b), true
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), false
}

// exitTimeout bounds how long a finite exec waits for a process it killed
// (at its timeout, or because the client left) to be reaped.
const exitTimeout = 10 * time.Second

// background is a context for cleanup after the request's own ended.
func background() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), exitTimeout)
}
