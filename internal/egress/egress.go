// Package egress gives the sandboxes that ask for it a network beyond their loopback: a veth pair to the host, an address from kilnd's range, NAT, and their policy as nftables rules.
package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// DefaultRange is the range sandboxes' addresses come from unless kilnd is
// told otherwise: each sandbox takes a /30 of it (its address and the
// host's end of its link).
var DefaultRange = netip.MustParsePrefix("10.200.0.0/16")

// MaxCIDRs bounds each of a policy's lists.
const MaxCIDRs = 64

// Config is how kilnd connects sandboxes.
type Config struct {
	// Instance is the kilnd instance's name (see TableName and
	// IfacePrefix): required.
	Instance string
	// Range is where sandboxes' addresses come from (default
	// DefaultRange); it must not be in use on the host (Register).
	Range netip.Prefix
	// Resolvers are the name servers a sandbox's resolv.conf names and
	// its policy lets it reach on port 53.
	Resolvers []netip.Addr
}

// Attachment is a sandbox's place on the network, kept in its record:
// enough to rebuild its rules after kilnd restarts.
type Attachment struct {
	Iface  string      `json:"iface"` // the host's end of the link
	Host   netip.Addr  `json:"host"`  // the host's address on it, the sandbox's gateway
	Addr   netip.Addr  `json:"addr"`  // the sandbox's
	Policy api.Network `json:"policy"`
}

// Wanted says whether a policy asks for a network at all: egress, or
// something allowed.
func Wanted(p *api.Network) bool {
	return p != nil && (p.Egress == api.EgressAllow || len(p.Allow) > 0)
}

// Validate checks a policy as a create request gives it.
func Validate(p *api.Network) error {
	if p == nil {
		return nil
	}
	switch p.Egress {
	case "", api.EgressNone, api.EgressAllow:
	default:
		return fmt.Errorf("%w: network egress %q: want %q or %q", errdefs.ErrInvalidArgument, api.Clip(p.Egress), api.EgressNone, api.EgressAllow)
	}
	for _, l := range []struct {
		name  string
		cidrs []string
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		if len(l.cidrs) > MaxCIDRs {
			return fmt.Errorf("%w: network %s: %d entries, at most %d", errdefs.ErrInvalidArgument, l.name, len(l.cidrs), MaxCIDRs)
		}
		for _, c := range l.cidrs {
			if _, err := ParseCIDR(c); err != nil {
				return fmt.Errorf("%w: network %s: %w", errdefs.ErrInvalidArgument, l.name, err)
			}
		}
	}
	return nil
}

// ParseCIDR reads an IPv4 CIDR or address (a /32).
func ParseCIDR(s string) (netip.Prefix, error) {
	var p netip.Prefix
	var err error
	if strings.Contains(s, "/") {
		p, err = netip.ParsePrefix(s)
	} else {
		var a netip.Addr
		if a, err = netip.ParseAddr(s); err == nil {
			p = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", api.Clip(s))
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%q: only IPv4 is supported", api.Clip(s))
	}
	return p.Masked(), nil
}

// refused are the ranges no sandbox reaches unless its policy allows
// them: this host's neighbours and everything that is not the internet.
var refused = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/3"), // multicast, reserved, broadcast
}

// Manager connects sandboxes and keeps the host's rules for them: one
// nftables table, this kilnd instance's alone, rebuilt whole (atomically)
// whenever a sandbox joins or leaves.
type Manager struct {
	cfg    Config
	table  string // TableName(cfg.Instance)
	prefix string // IfacePrefix(cfg.Instance)
	// former are the tables of this kilnd's sandboxes that an earlier
	// kilnd on its state directory made (under another instance name, or
	// the table all kilnds shared before instances): removed in the
	// transaction that first installs this one's.
	former []string

	// mu guards attached and serializes rebuilds of the table.
	mu       sync.Mutex
	attached map[string]Attachment // by sandbox id
}

// New checks the host can do what egress needs and installs the rules for
// the sandboxes attached already (those that outlived a kilnd, from their
// records; their links are as they were, their names perhaps an earlier
// kilnd's): the error says why not.
func New(cfg Config, attached map[string]Attachment) (*Manager, error) {
	if err := CheckInstance(cfg.Instance); err != nil {
		return nil, err
	}
	if !cfg.Range.IsValid() {
		cfg.Range = DefaultRange
	}
	if !cfg.Range.Addr().Is4() || cfg.Range.Bits() > 29 {
		return nil, fmt.Errorf("egress: range %s: want an IPv4 range of at least /29", cfg.Range)
	}
	cfg.Range = cfg.Range.Masked()
	m := &Manager{cfg: cfg, table: TableName(cfg.Instance), prefix: IfacePrefix(cfg.Instance), attached: map[string]Attachment{}}
	for id, a := range attached {
		m.attached[id] = a
	}
	former, err := formerTables(m.table, attached)
	if err != nil {
		return nil, err
	}
	m.former = former
	if err := m.apply(); err != nil {
		return nil, err
	}
	m.former = nil
	return m, nil
}

// Resolvers are the name servers sandboxes are given.
func (m *Manager) Resolvers() []netip.Addr { return m.cfg.Resolvers }

// ResolvConf is the resolv.conf of a sandbox with a network.
func (m *Manager) ResolvConf() string {
	var b strings.Builder
	for _, r := range m.cfg.Resolvers {
		fmt.Fprintf(&b, "nameserver %s\n", r)
	}
	return b.String()
}

// Allocate gives sandbox id a place in the range, with policy p (which
// Validate accepted), and its rules: nothing of it passes until then.
// Attach connects it; Release ends either.
func (m *Manager) Allocate(id string, p api.Network) (Attachment, error) {
	if len(m.cfg.Resolvers) == 0 {
		return Attachment{}, fmt.Errorf("%w: egress: no resolver for sandboxes (the host's resolv.conf names none they could reach; kilnd --egress-dns names one)", errdefs.ErrUnavailable)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	used := map[netip.Addr]bool{}
	names := map[string]bool{}
	for _, a := range m.attached {
		used[a.Host] = true
		names[a.Iface] = true
	}
	a := Attachment{Policy: p, Iface: m.prefix + ifaceSuffix(id)}
	if names[a.Iface] {
		return Attachment{}, fmt.Errorf("%w: egress: interface %s is taken", errdefs.ErrAlreadyExists, a.Iface)
	}
	base := binary.BigEndian.Uint32(m.cfg.Range.Addr().AsSlice())
	n := uint32(1) << (32 - m.cfg.Range.Bits()) / 4
	for i := range n {
		host := addr4(base + 4*i + 1)
		if !used[host] {
			a.Host, a.Addr = host, addr4(base+4*i+2)
			break
		}
	}
	if !a.Host.IsValid() {
		return Attachment{}, fmt.Errorf("%w: egress: range %s is full (%d sandboxes)", errdefs.ErrUnavailable, m.cfg.Range, n)
	}
	m.attached[id] = a
	if err := m.apply(); err != nil {
		delete(m.attached, id)
		return Attachment{}, err
	}
	return a, nil
}

// Release forgets sandbox id's attachment and its rules; its link ends
// with its network namespace, and is removed now if it is left.
func (m *Manager) Release(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.attached[id]
	if !ok {
		return nil
	}
	delete(m.attached, id)
	err := m.apply()
	return errors.Join(err, m.unlink(a.Iface))
}

// ifaceSuffix is the part of a sandbox's id its interface is named by,
// after its instance's prefix: the end of a UUIDv7, which is random (its
// start is the time). Two sandboxes of one kilnd that share it are told
// apart by Allocate, which refuses the second.
func ifaceSuffix(id string) string {
	s := strings.ReplaceAll(id, "-", "")
	if len(s) > ifaceSuffixLen {
		s = s[len(s)-ifaceSuffixLen:]
	}
	return s
}

func addr4(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// HostResolvers are the host's name servers a sandbox can reach: those of
// /etc/resolv.conf or, where it names only loopback addresses (the stub of
// systemd-resolved, a local cache), those systemd-resolved forwards to, as
// Docker does. IPv4 only.
func HostResolvers() []netip.Addr {
	for _, path := range []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if rs := nameservers(string(b)); len(rs) > 0 {
			return rs
		}
	}
	return nil
}

// nameservers reads a resolv.conf's IPv4 name servers, loopback ones left
// out (a sandbox's loopback is its own).
func nameservers(conf string) []netip.Addr {
	var rs []netip.Addr
	for line := range strings.Lines(conf) {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() && !a.IsLoopback() {
			rs = append(rs, a)
		}
	}
	return rs
}

// enableForwarding turns on the host's IPv4 forwarding, without which
// nothing a sandbox sends leaves the host; done once a sandbox needs it,
// as Docker does.
func enableForwarding() error {
	const path = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("egress: enable IPv4 forwarding: %w", err)
	}
	return nil
}

// sortedIDs lists attached's ids in order, so a rebuilt table reads the
// same each time.
func sortedIDs(attached map[string]Attachment) []string {
	ids := make([]string, 0, len(attached))
	for id := range attached {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
