package egress_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/egress/egresstest"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNameservers(t *testing.T) {
	conf := "# generated\nnameserver 127.0.0.53\nnameserver 192.0.2.53\nnameserver 2001:db8::53\noptions edns0\nnameserver\n"
	if got := egress.Nameservers(conf); len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.53") {
		t.Errorf("nameservers = %v, want [192.0.2.53]", got)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		p   api.Network
		bad string
	}{
		{api.Network{}, ""},
		{api.Network{Egress: "allow", Allow: []string{"10.0.0.0/8", "192.168.1.7"}, Deny: []string{"203.0.113.0/24"}}, ""},
		{api.Network{Egress: "open"}, `egress "open"`},
		{api.Network{Allow: []string{"10.0.0.0/33"}}, "is not a CIDR"},
		{api.Network{Deny: []string{"example.com"}}, "is not a CIDR"},
		{api.Network{Allow: []string{"2001:db8::/32"}}, "only IPv4"},
		{api.Network{Deny: make([]string, egress.MaxCIDRs+1)}, "at most 64"},
	} {
		err := egress.Validate(&tc.p)
		if tc.bad == "" {
			if err != nil {
				t.Errorf("Validate(%+v) = %v", tc.p, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.bad) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Validate(%+v) = %v, want an invalid argument saying %q", tc.p, err, tc.bad)
		}
	}
	if p, err := egress.ParseCIDR("10.1.2.3/8"); err != nil || p.String() != "10.0.0.0/8" {
		t.Errorf("ParseCIDR = %v, %v", p, err)
	}
}

// TestPolicy holds each step of a policy's order against real traffic:
// stand-in sandboxes (network namespaces) connected by the Manager reach an
// upstream the test made, or are refused at once.
func TestPolicy(t *testing.T) {
	if !egresstest.Isolate(t) {
		return
	}
	up := egresstest.StartUpstream(t)
	// A server on the host's own addresses, and one as kilnd's API port.
	hostSrv := listen(t, "0.0.0.0:0")
	apiSrv := listen(t, "0.0.0.0:0")
	cfg := egress.Config{Instance: "policy", Resolvers: []netip.Addr{up.Addr}}
	m, err := egress.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	web := netip.AddrPortFrom(up.Addr, up.HTTP).String()
	private := netip.AddrPortFrom(up.Private, up.HTTP).String()
	hostOwn := net.JoinHostPort(up.HostAddr.String(), strconv.Itoa(int(port(hostSrv))))
	attach := func(id string, p api.Network) (string, egress.Attachment) {
		t.Helper()
		ns := egresstest.NewNetns(t)
		a, err := m.Allocate(id, p)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Attach(ns, a); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Release(id) })
		return ns, a
	}
	open, openAddr := attach("0190aaaa-0000-7000-8000-000000000001", api.Network{Egress: api.EgressAllow})
	denied, _ := attach("0190aaaa-0000-7000-8000-000000000002", api.Network{Egress: api.EgressAllow, Deny: []string{up.Addr.String()}})
	listed, _ := attach("0190aaaa-0000-7000-8000-000000000003", api.Network{Allow: []string{"192.168.77.0/24", "0.0.0.0/0", up.HostAddr.String()}})
	only, _ := attach("0190aaaa-0000-7000-8000-000000000004", api.Network{Allow: []string{up.Private.String()}})

	// A sandbox's own server, which no other reaches.
	peer := listenIn(t, open, "0.0.0.0:9000")
	for _, tc := range []struct {
		name, ns, addr string
		want           string // the body, or "" for refused
	}{
		{"egress reaches the internet, under the host's address", open, web, "upstream saw " + up.HostAddr.String()},
		{"a private range is refused", open, private, ""},
		{"the host's own addresses are refused", open, hostOwn, ""},
		{"the gateway is the host", open, net.JoinHostPort(openAddr.Host.String(), strconv.Itoa(int(port(hostSrv)))), ""},
		{"kilnd's port is refused", open, net.JoinHostPort(up.HostAddr.String(), strconv.Itoa(int(port(apiSrv)))), ""},
		{"allowing the host's address leaves it out", listed, hostOwn, ""},
		{"deny comes first", denied, web, ""},
		{"allowed private range", listed, private, "upstream saw " + up.HostAddr.String()},
		{"allowing everything still leaves kilnd out", listed, net.JoinHostPort(up.HostAddr.String(), strconv.Itoa(int(port(apiSrv)))), ""},
		{"allowing everything leaves the gateway out", listed, net.JoinHostPort(openAddr.Host.String(), strconv.Itoa(int(port(hostSrv)))), ""},
		{"an allow list alone is all there is", only, web, ""},
		{"an allow list alone", only, private, "upstream saw " + up.HostAddr.String()},
		{"sandboxes do not reach each other", listed, net.JoinHostPort(openAddr.Addr.String(), strconv.Itoa(int(port(peer)))), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := egresstest.Get(tc.ns, tc.addr)
			if tc.want == "" {
				if !egresstest.Refused(err) {
					t.Fatalf("GET %s = %q, %v; want refused", tc.addr, body, err)
				}
				return
			}
			if err != nil || body != tc.want {
				t.Fatalf("GET %s = %q, %v; want %q", tc.addr, body, err, tc.want)
			}
		})
	}

	// The resolvers are reached on port 53 whatever the allow list says;
	// deny comes first.
	t.Run("resolver", func(t *testing.T) {
		for _, ns := range []string{open, only} {
			addrs, err := egresstest.Resolver(ns, up.Addr).LookupHost(t.Context(), up.Names[0])
			if err != nil || len(addrs) != 1 || addrs[0] != up.Addr.String() {
				t.Errorf("lookup %s = %v, %v; want %s", up.Names[0], addrs, err, up.Addr)
			}
		}
		if addrs, err := egresstest.Resolver(denied, up.Addr).LookupHost(t.Context(), up.Names[0]); err == nil {
			t.Errorf("lookup from a sandbox denied the resolver = %v", addrs)
		}
	})

	// A new kilnd that knows no sandbox leaves them no way out; one that
	// adopts one rebuilds its rules.
	if _, err := egress.New(cfg, nil); err != nil {
		t.Fatal(err)
	}
	if body, err := egresstest.Get(open, web); !egresstest.Refused(err) {
		t.Fatalf("before adoption: GET = %q, %v; want refused (no rules for it)", body, err)
	}
	a := openAddr
	m2, err := egress.New(cfg, map[string]egress.Attachment{"0190aaaa-0000-7000-8000-000000000001": a})
	if err != nil {
		t.Fatal(err)
	}
	if body, err := egresstest.Get(open, web); err != nil || !strings.HasPrefix(body, "upstream saw") {
		t.Fatalf("after adoption: GET = %q, %v", body, err)
	}
	if err := m2.Release("0190aaaa-0000-7000-8000-000000000001"); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(a.Iface); err == nil {
		t.Errorf("%s is left after Release", a.Iface)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == egress.TableName(cfg.Instance) && strings.HasSuffix(ch.Name, a.Iface) {
			t.Errorf("chain %s is left after Release", ch.Name)
		}
	}
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go serveWord(l, "host")
	t.Cleanup(func() { l.Close() })
	return l
}

func listenIn(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	l, err := egresstest.Listen(ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	go serveWord(l, "peer")
	t.Cleanup(func() { l.Close() })
	return l
}

// serveWord answers each request with word.
func serveWord(l net.Listener, word string) {
	http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, word) }))
}

func port(l net.Listener) uint16 { return uint16(l.Addr().(*net.TCPAddr).Port) }
