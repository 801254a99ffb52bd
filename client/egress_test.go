package client_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/egress/egresstest"
)

// fetchPy fetches a URL as a sandboxed program would: by name through the
// sandbox's resolv.conf; exit 3 and the error if it cannot.
const fetchPy = `import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode(), end="")
except Exception as e:
    print("error:", e)
    sys.exit(3)
`

// TestEgress creates sandboxes with and without a network, as a user
// would, in a network of the test's own (no traffic leaves it): the
// upstream is reached by name, denied addresses and kilnd's own port are
// refused, the rules survive a kilnd restart and go with the sandbox.
func TestEgress(t *testing.T) {
	t.Parallel()
	if !egresstest.Isolate(t) {
		return
	}
	up := egresstest.StartUpstream(t)
	// kilnd's port on every address of this namespace, the sandboxes'
	// gateways included: only the rules keep them from it.
	cfg := daemon.Config{StateDir: t.TempDir(), Listen: "0.0.0.0:0", EgressDNS: []netip.Addr{up.Addr}}
	k, err := daemontest.StartConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if err := k.Close(); err != nil {
				t.Errorf("kilnd: %v", err)
			}
		}
	})
	c, err := client.New(client.Options{StateDir: cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	create := func(n *api.Network) (*client.Sandbox, api.Sandbox) {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, client.SandboxOptions{Network: n})
		if err != nil {
			t.Fatal(err)
		}
		info := sb.Described
		return sb, info
	}
	fetch := func(sb *client.Sandbox, url string) string {
		t.Helper()
		res, err := sb.Exec(ctx, client.ExecOptions{Command: "python3", Args: []string{"-c", fetchPy, url}})
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout)
	}
	open, openInfo := create(&api.Network{Egress: api.EgressAllow})
	denied, _ := create(&api.Network{Egress: api.EgressAllow, Deny: []string{"198.51.100.0/24"}})
	loopback, loopbackInfo := create(nil)
	web := "http://" + up.Names[0] + ":8080/"
	saw := "upstream saw " + up.HostAddr.String()

	if n := openInfo.Network; n == nil || n.Egress != api.EgressAllow || n.Address == "" {
		t.Fatalf("network of a sandbox with egress: %+v", n)
	}
	if loopbackInfo.Network != nil {
		t.Errorf("network of a sandbox without: %+v", loopbackInfo.Network)
	}
	addr := netip.MustParseAddr(openInfo.Network.Address)
	gateway := addr.Prev()
	_, apiPort, _ := net.SplitHostPort(k.Daemon.TCPAddr())

	check := func(when string) {
		t.Helper()
		if got := fetch(open, web); got != saw {
			t.Errorf("%s: egress allow, by name: %q, want %q", when, got, saw)
		}
		if got := fetch(denied, "http://"+up.Addr.String()+":8080/"); !strings.HasPrefix(got, "error:") {
			t.Errorf("%s: a denied address: %q", when, got)
		}
		if got := fetch(open, "http://"+net.JoinHostPort(gateway.String(), apiPort)+"/v1/sandboxes"); !strings.Contains(got, "refused") {
			t.Errorf("%s: kilnd's port on the gateway: %q, want refused", when, got)
		}
		if got := fetch(open, "http://"+net.JoinHostPort(up.HostAddr.String(), apiPort)+"/v1/sandboxes"); !strings.Contains(got, "refused") {
			t.Errorf("%s: kilnd's port on the host's other address: %q, want refused", when, got)
		}
		if got := fetch(loopback, web); !strings.HasPrefix(got, "error:") {
			t.Errorf("%s: no network: %q", when, got)
		}
	}
	check("created")
	// gVisor's netstack on the same link, under the same rules.
	if gv, err := c.CreateSandbox(ctx, client.SandboxOptions{Runtime: "gvisor", Network: &api.Network{Egress: api.EgressAllow, Deny: []string{up.Private.String()}}}); client.IsUnavailable(err) && strings.Contains(err.Error(), "not available on this host") {
		t.Logf("gvisor not checked: %v", err)
	} else if err != nil {
		t.Fatal(err)
	} else {
		if got := fetch(gv, web); got != saw {
			t.Errorf("gvisor, egress allow, by name: %q, want %q", got, saw)
		}
		if got := fetch(gv, "http://"+net.JoinHostPort(up.HostAddr.String(), apiPort)+"/"); !strings.Contains(got, "refused") {
			t.Errorf("gvisor: kilnd's port: %q, want refused", got)
		}
		if got := fetch(gv, "http://"+up.Private.String()+":8080/"); !strings.HasPrefix(got, "error:") {
			t.Errorf("gvisor: a denied address: %q", got)
		}
		if err := gv.Delete(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	res, err := open.Exec(ctx, client.ExecOptions{Command: "cat", Args: []string{"/etc/resolv.conf"}})
	if err != nil || string(res.Stdout) != "nameserver "+up.Addr.String()+"\n" {
		t.Errorf("resolv.conf with a network: %q, %v", res.Stdout, err)
	}

	// Adopted by a new kilnd, they keep their network and its rules.
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	if k, err = daemontest.StartConfig(cfg); err != nil {
		stopped = true
		t.Fatal(err)
	}
	_, apiPort, _ = net.SplitHostPort(k.Daemon.TCPAddr())
	check("after a restart")

	// Deleted, a sandbox takes its link and its rules with it.
	if err := open.Delete(ctx, true); err != nil {
		t.Fatal(err)
	}
	instance := k.Daemon.Instance()
	iface := egress.IfacePrefix(instance) + strings.ReplaceAll(open.ID, "-", "")[24:]
	if _, err := net.InterfaceByName(iface); err == nil {
		t.Errorf("link %s is left after the sandbox was deleted", iface)
	}
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := conn.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == egress.TableName(instance) && strings.HasSuffix(ch.Name, iface) {
			t.Errorf("chain %s is left after the sandbox was deleted", ch.Name)
		}
	}
	if got := fetch(denied, "http://"+up.Addr.String()+":8080/"); !strings.HasPrefix(got, "error:") {
		t.Errorf("the others keep their rules: a denied address: %q", got)
	}
}
