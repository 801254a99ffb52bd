package client

import (
	"strings"
	"testing"
)

// TestParseAddr: kilnd's address in the forms DOCKER_HOST is written in,
// and clear refusals of the rest (an http:// URL used to become the host
// "http", looked up in DNS).
func TestParseAddr(t *testing.T) {
	for _, tc := range []struct{ in, addr, sock, err string }{
		{in: ""},
		{in: "127.0.0.1:7833", addr: "127.0.0.1:7833"},
		{in: "tcp://127.0.0.1:7833", addr: "127.0.0.1:7833"},
		{in: "http://127.0.0.1:7833", addr: "127.0.0.1:7833"},
		{in: "http://127.0.0.1:7833/", addr: "127.0.0.1:7833"},
		{in: "http://[::1]:7833", addr: "[::1]:7833"},
		{in: "kiln.example:7777", addr: "kiln.example:7777"},
		{in: "unix:///var/lib/sandkiln/kilnd.sock", sock: "/var/lib/sandkiln/kilnd.sock"},
		{in: "unix://kilnd.sock", err: "absolute"},
		{in: "https://127.0.0.1:7833", err: "plain HTTP"},
		{in: "ftp://127.0.0.1:7833", err: `unknown scheme "ftp"`},
		{in: "127.0.0.1", err: "not a host and port"},
		{in: "http://127.0.0.1:7833/api", err: "not a host and port"},
		{in: "http://user@127.0.0.1:7833", err: "not a host and port"},
		{in: ":7833", err: "not a host and port"},
		{in: "127.0.0.1:0", err: `port "0"`},
		{in: "127.0.0.1:http", err: `port "http"`},
	} {
		addr, sock, err := parseAddr(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "want host:port") {
				t.Errorf("%q: %v, want an error saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || addr != tc.addr || sock != tc.sock {
			t.Errorf("%q: %q %q %v, want %q %q", tc.in, addr, sock, err, tc.addr, tc.sock)
		}
	}
	// New refuses a bad address before anything else.
	if _, err := New(Options{Addr: "http//127.0.0.1:7833", Token: "x"}); err == nil {
		t.Error("New took a malformed address")
	}
}
