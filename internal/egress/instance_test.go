package egress_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/egress/egresstest"
)

func TestInstanceNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"sandkiln-3fa2c1", true},
		{"a", true},
		{"0", true},
		{strings.Repeat("x", 32), true},
		{strings.Repeat("x", 33), false},
		{"", false},
		{"-a", false},
		{"A", false},
		{"a_b", false},
		{"a/b", false},
		{"a.json", false},
	} {
		if err := egress.CheckInstance(tc.name); (err == nil) != tc.ok {
			t.Errorf("CheckInstance(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	if got := egress.TableName("a1"); got != "kiln-a1" {
		t.Errorf("TableName = %q", got)
	}
	seen := map[string]string{}
	for _, name := range []string{"a", "b", "sandkiln-3fa2c1", strings.Repeat("x", 32)} {
		p := egress.IfacePrefix(name)
		// The kernel's limit, with the sandbox's part of the name.
		if len(p)+8 > unix.IFNAMSIZ-1 || !strings.HasPrefix(p, "kv") || strings.HasPrefix(p, "kv-") {
			t.Errorf("IfacePrefix(%q) = %q", name, p)
		}
		if p != egress.IfacePrefix(name) {
			t.Errorf("IfacePrefix(%q) is not stable", name)
		}
		if other, ok := seen[p]; ok {
			t.Errorf("IfacePrefix(%q) = IfacePrefix(%q)", name, other)
		}
		seen[p] = name
	}
}

// TestRegister holds the registry's rules: a free range for an instance
// that asks for none, kept across its restarts; a range that overlaps
// another instance's refused with that instance's name, as long as its
// kilnd runs or its table holds a sandbox's rules (a kilnd older than
// instances' too); names (and their links' prefixes) never shared.
func TestRegister(t *testing.T) {
	if !egresstest.Isolate(t) {
		return
	}
	dir := t.TempDir()
	reg := func(instance, state, r string, attached map[string]egress.Attachment) (*egress.Registration, error) {
		var p netip.Prefix
		if r != "" {
			p = netip.MustParsePrefix(r)
		}
		return egress.Register(dir, egress.Claim{Instance: instance, StateDir: state, Range: p}, attached)
	}
	must := func(instance, state, r, want string) *egress.Registration {
		t.Helper()
		g, err := reg(instance, state, r, nil)
		if err != nil {
			t.Fatalf("register %s: %v", instance, err)
		}
		if g.Range.String() != want {
			t.Fatalf("register %s: range %s, want %s", instance, g.Range, want)
		}
		return g
	}
	refused := func(instance, state, r string, attached map[string]egress.Attachment, says ...string) {
		t.Helper()
		g, err := reg(instance, state, r, attached)
		if err == nil {
			g.Close()
			t.Fatalf("register %s %s: accepted", instance, r)
		}
		for _, s := range says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("register %s %s: %v; want it to say %q", instance, r, err, s)
			}
		}
	}
	a := must("a", "/state/a", "", "10.200.0.0/16")
	b := must("b", "/state/b", "", "10.201.0.0/16")
	refused("c", "/state/c", "10.200.128.0/24", nil, `range 10.200.128.0/24 overlaps 10.200.0.0/16, the range of kilnd instance "a" (state directory /state/a)`)
	refused("c", "/state/c", "10.0.0.0/8", nil, "overlaps")
	refused("a", "/state/other", "", nil, `kilnd instance "a" (state directory /state/a) runs already`)
	c := must("c", "/state/c", "10.202.0.0/24", "10.202.0.0/24")
	c.Close()

	// b's kilnd stops, its sandbox's rules stay: the range stays b's.
	attachedB := map[string]egress.Attachment{"0190bbbb-0000-7000-8000-000000000001": {
		Iface: egress.IfacePrefix("b") + "00000001", Host: netip.MustParseAddr("10.201.0.1"), Addr: netip.MustParseAddr("10.201.0.2"),
		Policy: api.Network{Egress: api.EgressAllow}}}
	if _, err := egress.New(egress.Config{Instance: "b", Range: b.Range, Resolvers: []netip.Addr{netip.MustParseAddr("198.51.100.2")}}, attachedB); err != nil {
		t.Fatal(err)
	}
	b.Close()
	refused("d", "/state/d", "10.201.7.0/24", nil, `"b"`, "/state/b")
	// a's stops with no sandbox: its range is free, its claim forgotten.
	a.Close()
	must("d", "/state/d", "", "10.200.0.0/16").Close()
	if _, err := os.Stat(filepath.Join(dir, "a.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a's claim is left: %v", err)
	}
	// b restarts, asking for no range: its own, which d did not take.
	b = must("b", "/state/b", "", "10.201.0.0/16")
	defer b.Close()
	// An instance renamed on its state directory takes its claim over.
	must("b2", "/state/d", "", "10.200.0.0/16").Close()

	// Two names whose links would share a prefix.
	x, y := samePrefix(t)
	must(x, "/state/x", "10.210.0.0/16", "10.210.0.0/16")
	refused(y, "/state/y", "10.211.0.0/16", nil, "same names", x)

	// The table of a kilnd older than instances, with a sandbox's rules.
	legacy := legacyTable(t, "0123456789ab", netip.MustParsePrefix("10.220.0.0/16"))
	refused("e", "/state/e", "10.220.3.0/24", nil, "overlaps 10.220.0.0/16, the range of a kilnd older than instances (its table inet kiln)")
	mine := map[string]egress.Attachment{"0190eeee-0000-7000-8000-0123456789ab": {Iface: "kv-0123456789ab",
		Host: netip.MustParseAddr("10.220.0.1"), Addr: netip.MustParseAddr("10.220.0.2"), Policy: api.Network{Egress: api.EgressAllow}}}
	e, err := reg("e", "/state/e", "10.220.0.0/16", mine)
	if err != nil {
		t.Fatalf("the old table's sandboxes adopted: %v", err)
	}
	defer e.Close()
	if _, err := egress.New(egress.Config{Instance: "e", Range: e.Range, Resolvers: []netip.Addr{netip.MustParseAddr("198.51.100.2")}}, mine); err != nil {
		t.Fatal(err)
	}
	if tables := kilnTables(t); tables[legacy] || !tables["kiln-e"] {
		t.Errorf("after the old table's sandboxes were adopted, tables %v: want kiln-e, not %s", tables, legacy)
	}
}

// samePrefix finds two instance names whose links' prefixes are the same.
func samePrefix(t *testing.T) (string, string) {
	seen := map[string]string{}
	for i := 0; ; i++ {
		name := "n" + strconv.Itoa(i)
		p := egress.IfacePrefix(name)
		if other, ok := seen[p]; ok {
			return other, name
		}
		seen[p] = name
	}
}

// legacyTable makes the table a kilnd older than instances made, with the
// rules of one sandbox, whose link's name ends in suffix, and its NAT for
// r.
func legacyTable(t *testing.T, suffix string, r netip.Prefix) string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tab := c.AddTable(&nftables.Table{Name: "kiln", Family: nftables.TableFamilyINet})
	accept := nftables.ChainPolicyAccept
	nat := c.AddChain(&nftables.Chain{Name: "postrouting", Table: tab, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddChain(&nftables.Chain{Name: "sandbox-" + suffix, Table: tab})
	mask := make([]byte, 4)
	for i := range r.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	addr := r.Addr().As4()
	c.AddRule(&nftables.Rule{Table: tab, Chain: nat, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	return "kiln"
}

// kilnTables lists the inet tables there are.
func kilnTables(t *testing.T) map[string]bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, tab := range tables {
		out[tab.Name] = true
	}
	return out
}

// TestInstancesApart: two kilnds' rules, each in its own table, each
// rebuilt without the other: each one's sandboxes keep their upstream
// while the other's come and go, and reach neither the host nor the
// other's gateways. A sandbox adopted from a kilnd older than instances
// keeps its link's name and its way out, and the old table goes.
func TestInstancesApart(t *testing.T) {
	if !egresstest.Isolate(t) {
		return
	}
	up := egresstest.StartUpstream(t)
	hostSrv := listen(t, "0.0.0.0:0")
	web := netip.AddrPortFrom(up.Addr, up.HTTP).String()
	saw := "upstream saw " + up.HostAddr.String()
	manager := func(instance, r string, attached map[string]egress.Attachment) *egress.Manager {
		t.Helper()
		m, err := egress.New(egress.Config{Instance: instance, Range: netip.MustParsePrefix(r), Resolvers: []netip.Addr{up.Addr}}, attached)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	attach := func(m *egress.Manager, id string) (string, egress.Attachment) {
		t.Helper()
		ns := egresstest.NewNetns(t)
		a, err := m.Allocate(id, api.Network{Egress: api.EgressAllow, Allow: []string{"0.0.0.0/0"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Attach(ns, a); err != nil {
			t.Fatal(err)
		}
		return ns, a
	}
	reaches := func(who, ns, addr string, want bool) {
		t.Helper()
		body, err := egresstest.Get(ns, addr)
		switch {
		case want && (err != nil || body != saw):
			t.Errorf("%s: GET %s = %q, %v; want %q", who, addr, body, err, saw)
		case !want && !egresstest.Refused(err):
			t.Errorf("%s: GET %s = %q, %v; want refused", who, addr, body, err)
		}
	}
	host := func(a netip.Addr) string { return netip.AddrPortFrom(a, port(hostSrv)).String() }

	ma := manager("a", "10.200.0.0/16", nil)
	mb := manager("b", "10.201.0.0/16", nil)
	na, aa := attach(ma, "0190aaaa-0000-7000-8000-000000000001")
	nb, ab := attach(mb, "0190bbbb-0000-7000-8000-000000000001")
	if aa.Iface[:len(egress.IfacePrefix("a"))] != egress.IfacePrefix("a") || ab.Iface[:len(egress.IfacePrefix("b"))] != egress.IfacePrefix("b") {
		t.Errorf("links %s, %s: want them named by their instances", aa.Iface, ab.Iface)
	}
	check := func(when string) {
		t.Helper()
		reaches(when+": a's sandbox", na, web, true)
		reaches(when+": b's sandbox", nb, web, true)
		reaches(when+": a's sandbox to b's gateway", na, host(ab.Host), false)
		reaches(when+": b's sandbox to a's gateway", nb, host(aa.Host), false)
		reaches(when+": a's sandbox to the host", na, host(up.HostAddr), false)
		reaches(when+": b's sandbox to b's gateway", nb, host(ab.Host), false)
	}
	check("both")
	// b's kilnd restarts: a's sandbox never notices; b's are refused
	// until b adopts them, then keep their way out.
	manager("b", "10.201.0.0/16", nil)
	reaches("b restarted: a's sandbox", na, web, true)
	reaches("b restarted, not adopted: b's sandbox", nb, web, false)
	mb = manager("b", "10.201.0.0/16", map[string]egress.Attachment{"0190bbbb-0000-7000-8000-000000000001": ab})
	check("b restarted")
	// a's sandbox goes, another comes: b's keeps its way.
	if err := ma.Release("0190aaaa-0000-7000-8000-000000000001"); err != nil {
		t.Fatal(err)
	}
	reaches("a's sandbox gone: b's sandbox", nb, web, true)
	na, aa = attach(ma, "0190aaaa-0000-7000-8000-000000000002")
	check("a's second sandbox")

	// A sandbox of a kilnd older than instances: its link and the shared
	// table it made.
	old := egress.Attachment{Iface: "kv-0123456789ab", Host: netip.MustParseAddr("10.250.0.1"), Addr: netip.MustParseAddr("10.250.0.2"),
		Policy: api.Network{Egress: api.EgressAllow}}
	no := egresstest.NewNetns(t)
	if err := ma.Attach(no, old); err != nil {
		t.Fatal(err)
	}
	legacyTable(t, "0123456789ab", netip.MustParsePrefix("10.200.0.0/16"))
	ma = manager("a", "10.200.0.0/16", map[string]egress.Attachment{"0190aaaa-0000-7000-8000-000000000002": aa, "0190cccc-0000-7000-8000-0123456789ab": old})
	reaches("adopted: the old sandbox", no, web, true)
	reaches("adopted: the old sandbox to the host", no, host(up.HostAddr), false)
	check("the old sandbox adopted")
	if tables := kilnTables(t); tables["kiln"] || !tables["kiln-a"] || !tables["kiln-b"] {
		t.Errorf("tables %v: want kiln-a and kiln-b, and the old one gone", tables)
	}
	for _, id := range []string{"0190aaaa-0000-7000-8000-000000000002", "0190cccc-0000-7000-8000-0123456789ab"} {
		if err := ma.Release(id); err != nil {
			t.Error(err)
		}
	}
	if err := mb.Release("0190bbbb-0000-7000-8000-000000000001"); err != nil {
		t.Error(err)
	}
}
