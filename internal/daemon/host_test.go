package daemon

import (
	"net"
	"net/http"
	"testing"
)

// TestHostAllowed: which Host values a TCP request may carry, for kilnd
// listening on every address, on one, and with names configured.
func TestHostAllowed(t *testing.T) {
	tests := []struct {
		listen net.IP
		allow  []string
		host   string
		want   bool
	}{
		{net.IPv4zero, nil, "localhost:7777", true},
		{net.IPv4zero, nil, "127.0.0.2:7777", true},
		{net.IPv4zero, nil, "[::1]:7777", true},
		{net.IPv4zero, nil, "localhost.:7777", true},
		{net.IPv4zero, nil, "localhost:7778", false},
		{net.IPv4zero, nil, "10.1.2.3:7777", false}, // every address: only the loopback ones are kilnd's own
		{net.IPv4zero, nil, "0.0.0.0:7777", false},
		{net.IPv4zero, nil, "", false},
		{net.IPv4(10, 1, 2, 3), nil, "10.1.2.3:7777", true},
		{net.IPv4(10, 1, 2, 3), nil, "10.1.2.4:7777", false},
		{net.IPv4zero, []string{"kiln.example.com"}, "kiln.example.com:7777", true},
		{net.IPv4zero, []string{"kiln.example.com"}, "KILN.example.com", true},
		{net.IPv4zero, []string{"kiln.example.com"}, "evil.kiln.example.com:7777", false},
		{net.IPv4zero, []string{"kiln.example.com:443"}, "kiln.example.com:443", true},
		{net.IPv4zero, []string{"kiln.example.com:443"}, "kiln.example.com:7777", false},
		{net.IPv4zero, []string{"kiln.example.com:80"}, "kiln.example.com", true},
	}
	for _, tc := range tests {
		d := &Daemon{cfg: Config{AllowHosts: tc.allow}}
		d.tcp.Store(&net.TCPAddr{IP: tc.listen, Port: 7777})
		if got := d.hostAllowed(&http.Request{Host: tc.host}); got != tc.want {
			t.Errorf("listening on %v, allowed %v: Host %q allowed %v, want %v", tc.listen, tc.allow, tc.host, got, tc.want)
		}
	}
}
