package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// sockets are the inodes of the sockets process pid ("self" for this
// one) has descriptors of.
func sockets(t *testing.T, pid string) []string {
	t.Helper()
	dir := filepath.Join("/proc", pid, "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var inodes []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			inodes = append(inodes, l)
		}
	}
	return inodes
}

// TestWatcherHandedToTheAgent: kilnd hands an output watcher's connection
// to the sandbox's agent, which writes to it itself, so that kilnd copies
// none of the output: while the watcher watches, the agent holds the
// socket kilnd accepted (kilnd is this process); once the watcher has
// gone, it does not, and it held no socket of kilnd's before.
func TestWatcherHandedToTheAgent(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var info daemon.Info
	k.json("POST", "/sandboxes", `{}`, &info)
	var st api.Started
	k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", `{"command":"sh","args":["-c","echo ready; exec sleep 60"]}`, &st)
	agentPID := strconv.Itoa(info.AgentPID)
	shared := func() []string {
		mine := sockets(t, "self")
		return slices.DeleteFunc(sockets(t, agentPID), func(s string) bool { return !slices.Contains(mine, s) })
	}
	if s := shared(); len(s) != 0 {
		t.Fatalf("before any watcher, the agent holds kilnd's sockets %v", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+info.ID+"/exec-stream/"+st.ID+"/logs",
		&websocket.DialOptions{Subprotocols: []string{api.TokenProtocolPrefix + k.d.Token()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, b, err := c.Read(ctx); err != nil || string(b) != "ready\n" {
		t.Fatalf("first message %q, %v", b, err)
	}
	if s := shared(); len(s) != 1 {
		t.Errorf("watching, the agent holds kilnd's sockets %v, want the watcher's alone", s)
	}
	c.Close(websocket.StatusNormalClosure, "")
	for deadline := time.Now().Add(10 * time.Second); len(shared()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the watcher gone, the agent still holds kilnd's sockets %v", shared())
		}
	}
}
