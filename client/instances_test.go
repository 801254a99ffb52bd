package client_test

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/egress/egresstest"
)

// TestThreeKilnds runs three kilnds on one host, in a network of the
// test's own (no traffic leaves it), each with a sandbox with egress, and
// starts and stops them in every order. After each start and each stop,
// every sandbox, its kilnd running or not, reaches the upstream by name
// and reaches no running kilnd's API port on any of the host's
// addresses; their ranges and host users are apart, and a range that
// overlaps another kilnd's is refused with that kilnd's name.
func TestThreeKilnds(t *testing.T) {
	t.Parallel()
	if !egresstest.Isolate(t) {
		return
	}
	up := egresstest.StartUpstream(t)
	// One directory for the three: they see each other's egress ranges.
	claims, err := daemontest.ClaimsDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		cfg  daemon.Config
		k    *daemontest.Kilnd // nil while stopped
		sb   *client.Sandbox
		info api.Sandbox
		port string
		uids string // the host's first uid of the sandbox's
	}
	var nodes [3]*node
	for i := range nodes {
		nodes[i] = &node{cfg: daemon.Config{StateDir: t.TempDir(), Listen: "0.0.0.0:0", EgressDNS: []netip.Addr{up.Addr}, ClaimsDir: claims}}
	}
	ctx := ctxT(t)
	t.Cleanup(func() {
		for _, n := range nodes {
			if n.k == nil && n.sb != nil {
				k, err := daemontest.StartConfig(n.cfg)
				if err != nil {
					t.Errorf("restart to clean up: %v", err)
					continue
				}
				n.k = k
			}
			if n.k != nil {
				if err := n.k.Close(); err != nil {
					t.Errorf("kilnd: %v", err)
				}
			}
		}
	})
	web := net.JoinHostPort(up.Names[0], strconv.Itoa(int(up.HTTP)))
	saw := "upstream saw " + up.HostAddr.String()

	start := func(n *node) {
		t.Helper()
		k, err := daemontest.StartConfig(n.cfg)
		if err != nil {
			t.Fatal(err)
		}
		n.k = k
		_, n.port, _ = net.SplitHostPort(k.Daemon.TCPAddr())
		if n.sb != nil {
			return // adopted
		}
		c, err := client.New(client.Options{StateDir: n.cfg.StateDir})
		if err != nil {
			t.Fatal(err)
		}
		if n.sb, err = c.CreateSandbox(ctx, client.SandboxOptions{Network: &api.Network{Egress: api.EgressAllow, Allow: []string{"0.0.0.0/0"}}}); err != nil {
			t.Fatal(err)
		}
		n.info = n.sb.Described
		// As a program in it would, once: by name, through its resolv.conf.
		res, err := n.sb.Exec(ctx, client.ExecOptions{Command: "python3", Args: []string{"-c", fetchPy, "http://" + web + "/"}})
		if err != nil || string(res.Stdout) != saw {
			t.Fatalf("a new sandbox: %q, %v; want %q", res.Stdout, err, saw)
		}
		res, err = n.sb.Exec(ctx, client.ExecOptions{Command: "cat", Args: []string{"/proc/self/uid_map"}})
		if f := strings.Fields(string(res.Stdout)); err != nil || len(f) < 3 {
			t.Fatalf("uid map: %q, %v", res.Stdout, err)
		} else {
			n.uids = f[1]
		}
	}
	stop := func(n *node) {
		t.Helper()
		if err := n.k.Stop(); err != nil {
			t.Fatal(err)
		}
		n.k = nil
	}
	// check holds every sandbox to the rules, from its network namespace.
	check := func(when string) {
		t.Helper()
		var hostAddrs []netip.Addr // every address a kilnd listens on but loopback
		hostAddrs = append(hostAddrs, up.HostAddr)
		for _, n := range nodes {
			if n.sb != nil {
				hostAddrs = append(hostAddrs, netip.MustParseAddr(n.info.Network.Address).Prev())
			}
		}
		for i, n := range nodes {
			if n.sb == nil {
				continue
			}
			ns := fmt.Sprintf("/proc/%d/ns/net", n.info.AgentPID)
			addrs, err := egresstest.Resolver(ns, up.Addr).LookupHost(ctx, up.Names[0])
			if err != nil || len(addrs) != 1 {
				t.Errorf("%s: sandbox %d: lookup %s = %v, %v", when, i, up.Names[0], addrs, err)
				continue
			}
			if body, err := egresstest.Get(ns, net.JoinHostPort(addrs[0], strconv.Itoa(int(up.HTTP)))); err != nil || body != saw {
				t.Errorf("%s: sandbox %d: upstream = %q, %v; want %q", when, i, body, err, saw)
			}
			for j, other := range nodes {
				if other.k == nil {
					continue
				}
				for _, a := range hostAddrs {
					addr := net.JoinHostPort(a.String(), other.port)
					if c, err := egresstest.Dial(ns, "tcp", addr); !egresstest.Refused(err) {
						if c != nil {
							c.Close()
						}
						t.Errorf("%s: sandbox %d reached kilnd %d at %s: %v", when, i, j, addr, err)
					}
				}
			}
		}
	}

	orders := [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	for _, order := range orders {
		for _, i := range order {
			start(nodes[i])
			check(fmt.Sprintf("order %v: kilnd %d started", order, i))
		}
		if order == orders[0] {
			ranges := map[string]int{}
			for i, n := range nodes {
				p := netip.MustParseAddr(n.info.Network.Address)
				for r, j := range ranges {
					if netip.MustParsePrefix(r).Contains(p) {
						t.Errorf("sandboxes of kilnds %d and %d are in one range %s", i, j, r)
					}
				}
				ranges[n.k.Daemon.EgressRange().String()] = i
			}
			// Nor do their users meet.
			if nodes[0].uids == nodes[1].uids || nodes[1].uids == nodes[2].uids || nodes[0].uids == nodes[2].uids {
				t.Errorf("the sandboxes' host uids begin at %s, %s and %s: want three", nodes[0].uids, nodes[1].uids, nodes[2].uids)
			}
			// A fourth kilnd asking for the second's range is refused,
			// the second named.
			taken := nodes[1].k.Daemon.EgressRange()
			_, err := daemontest.StartConfig(daemon.Config{StateDir: t.TempDir(), EgressRange: taken, EgressDNS: []netip.Addr{up.Addr}, ClaimsDir: claims})
			if err == nil || !strings.Contains(err.Error(), nodes[1].k.Daemon.Instance()) || !strings.Contains(err.Error(), "overlaps") {
				t.Fatalf("a kilnd asking for %s, another's range: %v; want refused, naming %s", taken, err, nodes[1].k.Daemon.Instance())
			}
		}
		for _, i := range order {
			stop(nodes[i])
			check(fmt.Sprintf("order %v: kilnd %d stopped", order, i))
		}
	}
}
