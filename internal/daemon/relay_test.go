package daemon

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
)

// TestCopyOut moves a stream larger than any buffer on the way through
// the relay, over unix sockets (spliced) and over in-memory pipes (copied),
// and checks the client gets every byte once, in order, and then EOF.
func TestCopyOut(t *testing.T) {
	want := make([]byte, 3<<20+17)
	rand.Read(want)
	for _, tc := range []struct {
		name string
		pair func(t *testing.T) (net.Conn, net.Conn)
	}{
		{"unix", unixPair},
		{"pipe", func(*testing.T) (net.Conn, net.Conn) { return net.Pipe() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agentSide, relayIn := tc.pair(t)   // the agent writes, the relay reads
			relayOut, clientSide := tc.pair(t) // the relay writes, the client reads
			go func() {
				agentSide.Write(want)
				agentSide.Close()
			}()
			done := make(chan struct{})
			go func() {
				defer close(done)
				copyOut(relayOut, relayIn)
				relayOut.Close()
			}()
			got, err := io.ReadAll(clientSide)
			<-done
			relayIn.Close()
			clientSide.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("client got %d bytes, want the %d written", len(got), len(want))
			}
		})
	}
}

func unixPair(t *testing.T) (net.Conn, net.Conn) {
	l, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	return c, s
}
