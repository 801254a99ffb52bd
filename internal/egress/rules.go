package egress

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// The table's chains. The base chains send what comes from a sandbox's
// link to that sandbox's chain (sandboxChain), whether it is bound for
// the host (input) or beyond (forward); what goes to a link is only ever
// a reply. refuseChain answers a refused connection at once (a TCP reset,
// or an ICMP "administratively prohibited"), so programs fail fast
// rather than time out.
const (
	inputChain   = "input"
	forwardChain = "forward"
	natChain     = "postrouting"
	refuseChain  = "refuse"
)

// apply replaces the table with one for the sandboxes attached now, in
// one transaction: a packet meets the old rules or the new, never none.
// m.mu is held.
func (m *Manager) apply() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("egress: nftables: %w", err)
	}
	t := &nftables.Table{Name: m.table, Family: nftables.TableFamilyINet}
	// Added, then deleted, then added: the deletion cannot fail for want
	// of a table, and the transaction leaves exactly the new one.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	// The rules an earlier kilnd made for these sandboxes go as these
	// come: never both, never neither.
	for _, name := range m.former {
		c.DelTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
	}
	accept := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: inputChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	forward := c.AddChain(&nftables.Chain{Name: forwardChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	nat := c.AddChain(&nftables.Chain{Name: natChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	refuse := c.AddChain(&nftables.Chain{Name: refuseChain, Table: t})
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
	}

	rule(refuse, l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	rule(refuse, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})

	// Into a link: replies only, from anywhere (another sandbox included).
	// The links are this instance's by their prefix, or (adopted from a
	// kilnd that named them otherwise) one by one; another instance's are
	// its table's to guard.
	established := ctState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
	rule(forward, ifname(expr.MetaKeyOIFNAME, m.prefix, true), established, verdict(expr.VerdictAccept, ""))
	rule(forward, ifname(expr.MetaKeyOIFNAME, m.prefix, true), verdict(expr.VerdictGoto, refuseChain))
	for _, id := range sortedIDs(m.attached) {
		if a := m.attached[id]; !strings.HasPrefix(a.Iface, m.prefix) {
			rule(forward, ifname(expr.MetaKeyOIFNAME, a.Iface, false), established, verdict(expr.VerdictAccept, ""))
			rule(forward, ifname(expr.MetaKeyOIFNAME, a.Iface, false), verdict(expr.VerdictGoto, refuseChain))
		}
	}
	for _, id := range sortedIDs(m.attached) {
		a := m.attached[id]
		ch := c.AddChain(&nftables.Chain{Name: sandboxChain(a), Table: t})
		m.policy(rule, ch, a)
		for _, base := range []*nftables.Chain{input, forward} {
			rule(base, ifname(expr.MetaKeyIIFNAME, a.Iface, false), verdict(expr.VerdictGoto, ch.Name))
		}
	}
	// From a link of this instance it does not know (one left behind):
	// nothing.
	for _, base := range []*nftables.Chain{input, forward} {
		rule(base, ifname(expr.MetaKeyIIFNAME, m.prefix, true), verdict(expr.VerdictGoto, refuseChain))
	}
	// Out to the world, under the host's address: the range's, and any
	// sandbox's outside it (adopted from a kilnd that had another range).
	rule(nat, nfproto(unix.NFPROTO_IPV4), prefix(12, m.cfg.Range), ifnameNot(expr.MetaKeyOIFNAME, m.prefix), []expr.Any{&expr.Masq{}})
	for _, id := range sortedIDs(m.attached) {
		if a := m.attached[id]; !m.cfg.Range.Contains(a.Addr) {
			rule(nat, nfproto(unix.NFPROTO_IPV4), prefix(12, netip.PrefixFrom(a.Addr, 32)), ifnameNot(expr.MetaKeyOIFNAME, m.prefix), []expr.Any{&expr.Masq{}})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress: install the nftables rules: %w", err)
	}
	return nil
}

// policy fills a sandbox's chain: its Network's order (see api.Network),
// after the checks no policy changes: IPv4 from its own address only,
// replies to what it opened, and none of the host's own addresses, so no
// kilnd's port on any of them, whatever allow says (the resolvers on port
// 53 alone, should one be the host's).
func (m *Manager) policy(rule func(*nftables.Chain, ...[]expr.Any), ch *nftables.Chain, a Attachment) {
	refuse := verdict(expr.VerdictGoto, refuseChain)
	accept := verdict(expr.VerdictAccept, "")
	rule(ch, nfprotoNot(unix.NFPROTO_IPV4), verdict(expr.VerdictDrop, ""))
	rule(ch, prefixNot(12, netip.PrefixFrom(a.Addr, 32)), verdict(expr.VerdictDrop, ""))
	rule(ch, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
	for _, s := range a.Policy.Deny {
		if p, err := ParseCIDR(s); err == nil {
			rule(ch, prefix(16, p), refuse)
		}
	}
	for _, r := range m.cfg.Resolvers {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rule(ch, prefix(16, netip.PrefixFrom(r, 32)), l4proto(proto), port(53), accept)
		}
	}
	rule(ch, local(), refuse)
	for _, s := range a.Policy.Allow {
		if p, err := ParseCIDR(s); err == nil {
			rule(ch, prefix(16, p), accept)
		}
	}
	for _, p := range refused {
		rule(ch, prefix(16, p), refuse)
	}
	if a.Policy.Egress == api.EgressAllow {
		rule(ch, accept)
	} else {
		rule(ch, refuse)
	}
}

// The expressions the rules are made of.

func verdict(k expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k, Chain: chain}}
}

// ifname matches an interface's name, or (prefixOnly) its beginning.
func ifname(key expr.MetaKey, name string, prefixOnly bool) []expr.Any {
	data := []byte(name)
	if !prefixOnly {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}}
}

func ifnameNot(key expr.MetaKey, begin string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(begin)}}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func nfprotoNot(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{p}}}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

// port matches a TCP or UDP destination port (after l4proto).
func port(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(p >> 8), byte(p)}},
	}
}

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native(bits), Xor: native(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: native(0)},
	}
}

// local matches a destination that is one of the host's own addresses,
// whichever they are at the time.
func local() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: native(unix.RTN_LOCAL)},
	}
}

// prefix matches an IPv4 header's address at offset (12 the source, 16
// the destination) against p.
func prefix(offset uint32, p netip.Prefix) []expr.Any {
	return prefixOp(offset, p, expr.CmpOpEq)
}

func prefixNot(offset uint32, p netip.Prefix) []expr.Any {
	return prefixOp(offset, p, expr.CmpOpNeq)
}

func prefixOp(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	var m [4]byte
	for i := range p.Bits() {
		m[i/8] |= 0x80 >> (i % 8)
	}
	net := p.Masked().Addr().As4()
	return append(nfproto(unix.NFPROTO_IPV4),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m[:], Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: net[:]},
	)
}

// native is a 32-bit value in the host's byte order, as the kernel keeps
// conntrack states and address types in registers.
func native(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }
