package daemon

import (
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/sandkiln/sandkiln/internal/errdefs"
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
		{net.IPv4zero, nil, "app.localhost:7777", false}, // the previews' names
		{net.IPv4zero, nil, "10.1.2.3:7777", false},      // every address: only the loopback ones are kilnd's own
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

// TestPreviewHost: which Host values are a preview's, which are under the
// previews' domain but no preview's, and which are neither, for the
// default domain (its port kilnd's, or the previews' own listener's) and
// for one of kilnd's own (any port).
func TestPreviewHost(t *testing.T) {
	const id = "0123456789abcdef"
	tests := []struct {
		domain, previewListen string
		host                  string
		id                    string // "" and ns: under the domain, no preview's
		ns                    bool
	}{
		{"", "", id + ".localhost:7777", id, true},
		{"", "", "0123ABCD.LocalHost.:7777", "0123abcd", true}, // an earlier kilnd's 8 digits
		{"", "", id + ".localhost:7778", "", true},
		{"", "", id + ".localhost", "", true},
		{"", "", "app.localhost:7777", "", true},
		{"", "", "x." + id + ".localhost:7777", "", true},
		{"", "", id + "0123456789abcdef0.localhost:7777", "", true}, // 33 digits
		{"", "", "0123456.localhost:7777", "", true},
		{"", "", "localhost:7777", "", false},
		{"", "", "127.0.0.1:7777", "", false},
		{"", "", id + ".localhost.evil.example:7777", "", false},
		{"", "", "evil.example", "", false},
		{"", "", "", "", false},
		{"", "127.0.0.1:9000", id + ".localhost:9000", id, true},
		{"", "127.0.0.1:9000", id + ".localhost:7777", "", true},
		{"preview.example.com", "", id + ".preview.example.com", id, true},
		{"preview.example.com", "", id + ".preview.example.com:8443", id, true},
		{"preview.example.com", "", "preview.example.com", "", false},
		{"preview.example.com", "", "kiln.example.com", "", false},
		{"preview.example.com", "", id + ".localhost:7777", "", false},
		{"preview.example.com", "", "a.b.preview.example.com", "", true},
	}
	for _, tc := range tests {
		d := &Daemon{cfg: Config{PreviewDomain: tc.domain, PreviewListen: tc.previewListen}}
		d.tcp.Store(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7777})
		if tc.previewListen != "" {
			d.previewTCP.Store(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9000})
		}
		if id, ns := d.previewHost(&http.Request{Host: tc.host}); id != tc.id || ns != tc.ns {
			t.Errorf("domain %q, previews' listener %q: Host %q is (%q, %v), want (%q, %v)", tc.domain, tc.previewListen, tc.host, id, ns, tc.id, tc.ns)
		}
	}
}

// TestPreviewAuthority: what follows a new preview's id in its URL.
func TestPreviewAuthority(t *testing.T) {
	tests := []struct {
		domain, previewListen string
		tcp                   bool
		host                  string // the create request's
		want                  string
	}{
		{"", "", true, "127.0.0.1:7777", ".localhost:7777"},
		{"", "", true, "kiln.example.com:443", ".localhost:7777"}, // a loopback name: the listener's port
		{"", "", false, "kilnd", ".localhost:7777"},
		{"", "127.0.0.1:9000", true, "127.0.0.1:7777", ".localhost:9000"},
		{"preview.example.com", "", true, "kiln.example.com:8443", ".preview.example.com:8443"},
		{"preview.example.com", "", true, "kiln.example.com", ".preview.example.com"},
		{"preview.example.com", "", false, "kilnd", ".preview.example.com:7777"},
		{"preview.example.com", "0.0.0.0:80", true, "kiln.example.com:7777", ".preview.example.com"},
	}
	for _, tc := range tests {
		d := &Daemon{cfg: Config{PreviewDomain: tc.domain, PreviewListen: tc.previewListen}}
		d.tcp.Store(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7777})
		if tc.previewListen != "" {
			a, _ := net.ResolveTCPAddr("tcp", tc.previewListen)
			if a.Port == 9000 || a.Port == 80 {
				d.previewTCP.Store(a)
			}
		}
		got, err := d.previewAuthority(&http.Request{Host: tc.host}, tc.tcp)
		if err != nil || got != tc.want {
			t.Errorf("domain %q, previews' listener %q, Host %q: %q %v, want %q", tc.domain, tc.previewListen, tc.host, got, err, tc.want)
		}
	}
	// Without a TCP listener there is no URL to give.
	d := &Daemon{}
	if _, err := d.previewAuthority(&http.Request{Host: "kilnd"}, false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("no TCP listener: %v", err)
	}
}

// TestValidatePreviewDomain: a DNS name in lower case, not an address,
// and no name the API is served at under it.
func TestValidatePreviewDomain(t *testing.T) {
	for _, tc := range []struct {
		domain string
		allow  []string
		ok     bool
	}{
		{"", nil, true},
		{"localhost", []string{"kiln.example.com", "localhost:7777"}, true},
		{"preview.example.com", []string{"kiln.example.com", "example.com"}, true},
		{"p-1.example.com", nil, true},
		{"", []string{"kiln.localhost"}, false},
		{"preview.example.com", []string{"kiln.preview.example.com:443"}, false},
		{"preview.example.com", []string{"A.Preview.Example.com."}, false},
		{"Preview.example.com", nil, false},
		{"preview..example.com", nil, false},
		{".example.com", nil, false},
		{"-p.example.com", nil, false},
		{"p_1.example.com", nil, false},
		{"*.example.com", nil, false},
		{"example.com:8080", nil, false},
		{"10.0.0.1", nil, false},
		{"::1", nil, false},
		{"[::1]", nil, false},
		{"a." + string(make([]byte, 250)), nil, false},
	} {
		if err := ValidatePreviewDomain(tc.domain, tc.allow); (err == nil) != tc.ok {
			t.Errorf("%q with %q: %v, want ok %v", tc.domain, tc.allow, err, tc.ok)
		}
	}
}
