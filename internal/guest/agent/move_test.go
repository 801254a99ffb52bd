package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// unixPair is a connected pair of unix stream sockets.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// moveMessage is kilnd's answer to a move: early bytes, and the socket
// as ancillary data when given.
func moveMessage(t *testing.T, kilnd *net.UnixConn, marker byte, early []byte, socket *net.UnixConn) {
	t.Helper()
	msg := append([]byte{marker, 0, 0, 0, 0}, early...)
	binary.BigEndian.PutUint32(msg[1:], uint32(len(early)))
	var oob []byte
	if socket != nil {
		f, err := socket.File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		oob = unix.UnixRights(int(f.Fd()))
	}
	if _, _, err := kilnd.WriteMsgUnix(msg, oob, nil); err != nil {
		t.Fatal(err)
	}
}

// TestMoveToTheClient: once kilnd hands the client's socket over, the
// agent reads what the client sent early, then the client's socket, and
// writes to the client; closing it ends kilnd's connection too, which is
// how kilnd learns the watcher is done.
func TestMoveToTheClient(t *testing.T) {
	kilnd, agentSide := unixPair(t)
	client, clientPeer := unixPair(t) // clientPeer is kilnd's end of the client's connection
	c := &movable{Conn: agentSide}
	moveMessage(t, kilnd, api.MoveMarker, []byte("early "), clientPeer)
	clientPeer.Close() // kilnd's copy; the agent has its own
	if err := c.awaitMove(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write([]byte("later")); err != nil {
		t.Fatal(err)
	}
	client.CloseWrite()
	got := make([]byte, 64)
	n, _ := io.ReadAtLeast(c, got, len("early later"))
	if string(got[:n]) != "early later" {
		t.Errorf("read %q, want the early bytes, then the client's", got[:n])
	}
	if _, err := c.Write([]byte("output")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	out, err := io.ReadAll(client)
	if err != nil || string(out) != "output" {
		t.Errorf("the client got %q (%v), want the output, then the end", out, err)
	}
	if n, err := kilnd.Read(got); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("kilnd's connection after the watcher: %d bytes, %v; want its end", n, err)
	}
}

// TestMoveRefused: kilnd that has no socket to hand over answers without
// one, and the agent stays on kilnd's connection, the client's early
// bytes first; an answer that is not a move's fails, and a socket sent
// with it is not kept.
func TestMoveRefused(t *testing.T) {
	kilnd, agentSide := unixPair(t)
	c := &movable{Conn: agentSide}
	moveMessage(t, kilnd, api.MoveMarker, []byte("early "), nil)
	if err := c.awaitMove(); err != nil {
		t.Fatal(err)
	}
	kilnd.Write([]byte("relayed"))
	got := make([]byte, 64)
	n, _ := io.ReadAtLeast(c, got, len("early relayed"))
	if string(got[:n]) != "early relayed" {
		t.Errorf("read %q, want the early bytes, then kilnd's connection", got[:n])
	}
	c.Write([]byte("output"))
	if n, _ := kilnd.Read(got); string(got[:n]) != "output" {
		t.Errorf("kilnd got %q, want the output", got[:n])
	}

	kilnd, agentSide = unixPair(t)
	client, clientPeer := unixPair(t)
	c = &movable{Conn: agentSide}
	moveMessage(t, kilnd, 'X', nil, clientPeer)
	clientPeer.Close()
	if err := c.awaitMove(); err == nil {
		t.Fatal("a move begun with X was taken")
	}
	if c.to.Load() != nil {
		t.Error("a failed move kept the socket")
	}
	// The agent's copy was closed: the client sees its connection end
	// (and, were it kept, a timeout).
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := client.Read(got); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("the client after a failed move: %d bytes, %v; want its end", n, err)
	}
}

// TestWriteMessage: messages the agent frames itself, of every header
// length, read whole by a client nobody here wrote (coder/websocket's),
// with coder/websocket's pings on the same connection between them.
func TestWriteMessage(t *testing.T) {
	sizes := []int{0, 1, 125, 126, 127, 0xffff, 0x10000, 300 << 10}
	srv := serveAsTheAgent(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mc := r.Context().Value(connKey{}).(*movable)
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		mc.frameMessages()
		ctx := c.CloseRead(r.Context())
		for i, n := range sizes {
			head := []byte{byte(i)}
			body := bytes.Repeat([]byte{byte(n)}, n)
			if err := mc.writeMessage(nil, wsBinary, head, body, time.Minute); err != nil {
				t.Errorf("message %d: %v", i, err)
				return
			}
			if err := c.Ping(ctx); err != nil {
				t.Errorf("ping after message %d: %v", i, err)
				return
			}
		}
		if err := mc.writeMessage([]byte("\x81\x00"), wsText, []byte(`{"type":`), []byte(`"end"}`), time.Minute); err != nil {
			t.Error(err)
		}
		c.Close(websocket.StatusNormalClosure, "")
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	for i, n := range sizes {
		typ, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		want := append([]byte{byte(i)}, bytes.Repeat([]byte{byte(n)}, n)...)
		if typ != websocket.MessageBinary || !bytes.Equal(b, want) {
			t.Fatalf("message %d: %v of %d bytes, want binary of %d", i, typ, len(b), len(want))
		}
	}
	if typ, b, err := c.Read(ctx); err != nil || typ != websocket.MessageText || len(b) != 0 {
		t.Fatalf("the empty message written before the last: %v %q %v", typ, b, err)
	}
	if typ, b, err := c.Read(ctx); err != nil || typ != websocket.MessageText || string(b) != `{"type":"end"}` {
		t.Fatalf("last message: %v %q %v", typ, b, err)
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Errorf("after the messages: %v, want a normal close", err)
	}
}

// TestNoMessageAfterClose: once coder/websocket wrote a close frame, the
// agent's own messages are refused, the connection still open.
func TestNoMessageAfterClose(t *testing.T) {
	agentSide, client := unixPair(t)
	c := &movable{Conn: agentSide}
	c.frameMessages()
	if err := c.writeMessage(nil, wsBinary, []byte("early"), nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte{0x80 | wsClose, 2, 0x03, 0xe8}); err != nil { // as coder/websocket writes it
		t.Fatal(err)
	}
	if err := c.writeMessage(nil, wsBinary, []byte("late"), nil, time.Minute); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a message after the close frame: %v, want net.ErrClosed", err)
	}
	agentSide.Close()
	got, _ := io.ReadAll(client)
	if want := "\x82\x05early\x88\x02\x03\xe8"; string(got) != want {
		t.Errorf("the client got %q, want %q", got, want)
	}
}

// TestControlFrameAfterAQuietSpell: a watcher's output may be quiet for
// longer than a message's write deadline; coder/websocket's pings then
// must still go out, not meet that deadline, long past.
func TestControlFrameAfterAQuietSpell(t *testing.T) {
	agentSide, client := unixPair(t)
	c := &movable{Conn: agentSide}
	c.frameMessages()
	const deadline = 250 * time.Millisecond // a pause of the test longer than it fails the write
	if err := c.writeMessage(nil, wsBinary, []byte("output"), nil, deadline); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * deadline) // the message's deadline is now past
	ping := []byte{0x89, 0}
	if _, err := c.Write(ping); err != nil {
		t.Fatalf("a ping after the message's deadline: %v", err)
	}
	got := make([]byte, 10)
	if _, err := io.ReadFull(client, got); err != nil || string(got) != "\x82\x06output\x89\x00" {
		t.Errorf("the client got %q (%v)", got, err)
	}
}
