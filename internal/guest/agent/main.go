package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/guest"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/process"
)

// recordInit waits for the init command and records its exit durably in
// the capture directory, where kilnd reads it even after the sandbox is
// gone.
func recordInit(table *process.Table, in *guest.Inside, id string) error {
	e, err := table.Wait(context.Background(), id)
	if err != nil {
		return err
	}
	rec := handoff.InitExit{Process: id, ExitedAt: time.Now().UTC(), Exit: toExit(&e)}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return in.Logs.WriteFile(handoff.InitExitName, b)
}

// shutdownTimeout bounds the agent's own shutdown: every process killed,
// drained, its capture ended. eventsTimeout bounds its wait, then, for
// kilnd to have read the processes' events.
const (
	shutdownTimeout = 15 * time.Second
	eventsTimeout   = 2 * time.Second
)

// Main runs this process as a sandbox's agent, its PID 1: it enters the
// sandbox, serves the process API on the socket kilnd handed over, reaps
// every orphan the sandbox's processes leave, and on SIGTERM shuts the
// processes down in order. It returns the process's exit code.
func Main() int {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kiln agent:", err)
		return 1
	}
	return 0
}

// Procs is how many threads run the agent's Go code at once. One: the
// agent's work is moving bytes between descriptors, and a pump that wakes
// a watcher then hands it the chunk on the same thread, its bytes still in
// the cache, where two pass it to another thread, woken for it: at a
// small-write program's pace, a tenth to a quarter of the relay's speed
// (the benchmark's attach section, its engine stage). A system call
// that blocks (a disk's write) takes its thread aside and holds up no
// other. It leaves the host's other cores to the sandbox's processes and
// the watchers' clients; the sandbox's CPU limit gives the agent a core
// of its own.
const Procs = 1

func run() error {
	runtime.GOMAXPROCS(Procs)
	// Signals first: as PID 1, a signal without a handler is ignored, and
	// a SIGCHLD missed now would leave a zombie.
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, handoff.ReconnectSignal)
	in, err := guest.Enter()
	if err != nil {
		return err
	}
	// Readers of a captured process take what its ring no longer holds
	// from its log, which the agent writes and may read.
	table := process.NewTable(process.TableConfig{Logs: in.Logs.OpenSub})
	dir := in.Config.Dir
	if dir == "" {
		dir = "/workspace"
	}
	disk := ""
	if in.Config.Disk != "" {
		disk = "/workspace" // on the sandbox's disk, with the writable layer
	}
	srv := New(Config{Table: table, Env: in.Config.Env, Dir: dir, Entrypoint: in.Config.Entrypoint, Cmd: in.Config.Cmd, User: in.Config.User, Logs: in.Logs, Launch: in.Spawner.Start, OOMKills: in.OOMKills,
		Capture: capture.Options{QueueBytes: in.Config.CaptureQueue, MaxSize: in.Config.CaptureMaxSize, MaxFiles: in.Config.CaptureMaxFiles}, FlowGrace: in.Config.FlowGrace, Disk: disk, Usage: in.Usage})
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(hs, in.Listener) }()
	initDone := make(chan error, 1)
	if in.Config.Init != nil {
		id, err := srv.StartInit(*in.Config.Init)
		if err != nil {
			return fmt.Errorf("init command: %w", err)
		}
		go func() { initDone <- recordInit(table, in, id) }()
	}
	for {
		select {
		case sig := <-sigs:
			if sig == unix.SIGCHLD {
				process.ReapOrphans()
				continue
			}
			if sig == handoff.ReconnectSignal {
				if in.Reconnect != nil {
					in.Reconnect()
				}
				continue
			}
		case err := <-served:
			if !errors.Is(err, http.ErrServerClosed) {
				return err
			}
		case err := <-initDone:
			// The init command ended: so does the sandbox.
			if err != nil {
				fmt.Fprintln(os.Stderr, "kiln agent: record the init command's exit:", err)
			}
		}
		break
	}
	// The processes first: their drain ends their captured runs, and the
	// requests waiting on them (waits, follows) end with them. Then the
	// server, whatever is left of it.
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err = table.Shutdown(ctx)
	ectx, ecancel := context.WithTimeout(context.Background(), eventsTimeout)
	defer ecancel()
	srv.EndEvents(ectx)
	in.Spawner.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	if hs.Shutdown(sctx) != nil {
		hs.Close()
	}
	return err
}
