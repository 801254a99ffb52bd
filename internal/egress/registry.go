package egress

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/sandkiln/sandkiln/internal/claims"
)

// Claim is what a kilnd instance records of itself in the registry.
type Claim struct {
	Instance string       `json:"instance"`
	StateDir string       `json:"state_dir"`
	Range    netip.Prefix `json:"range"`
}

// who names the kilnd that made the claim, in an error; one with no
// instance stands for a kilnd older than instances, its table's.
func (c Claim) who() string {
	if c.Instance == "" {
		return "a kilnd older than instances (its table inet " + legacyTable + ")"
	}
	return fmt.Sprintf("kilnd instance %q (state directory %s)", c.Instance, c.StateDir)
}

// Registration is a running kilnd's claim. It holds a shared lock on its
// file, which tells every other kilnd that it runs, until Close; the file
// stays, for its next start to keep the range.
type Registration struct {
	Claim
	f *os.File
}

// Close ends the kilnd's hold on its claim; its sandboxes' rules (its
// table) hold it on while they are there.
func (r *Registration) Close() error { return r.f.Close() }

// Register claims an egress range for kilnd instance me.Instance, on
// state directory me.StateDir, in the registry dir (made if missing).
// me.Range, when set, is the range asked for: refused, with an error
// naming the other instance, if it overlaps another's. Otherwise the
// range is the one this instance had (a restart keeps its sandboxes'
// addresses), else the first of DefaultRange and the /16s after it that
// overlaps no other's.
//
// Another instance's claim counts while its kilnd runs (holds the lock on
// its claim) or its table holds a sandbox's rules (its sandboxes outlive
// it); the rest are forgotten. So does the table all kilnds shared before
// instances while it holds rules for a link not in attached (the
// sandboxes this kilnd adopted). The instance's name may be no other
// running kilnd's, and the prefix of its links no other's either.
func Register(dir string, me Claim, attached map[string]Attachment) (*Registration, error) {
	if err := CheckInstance(me.Instance); err != nil {
		return nil, err
	}
	// Locked while the claims are read and this one written: two kilnds
	// starting at once take turns.
	reg, err := claims.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	defer reg.Close()
	c, chains := readChains()
	others, own, err := readClaims(reg, me, usedTables(chains))
	if err != nil {
		return nil, err
	}
	legacy, err := legacyRange(c, chains, attached)
	if err != nil {
		return nil, err
	}
	for _, o := range others {
		switch {
		case o.Instance == me.Instance:
			return nil, fmt.Errorf("egress: %s runs already: give this one another name (--instance)", o.who())
		case IfacePrefix(o.Instance) == IfacePrefix(me.Instance):
			return nil, fmt.Errorf("egress: the links of kilnd instance %q and of %s would have the same names (%s…): give this one another name (--instance)",
				me.Instance, o.who(), IfacePrefix(me.Instance))
		}
	}
	if legacy.IsValid() {
		others = append(others, Claim{Range: legacy})
	}
	if me.Range.IsValid() {
		me.Range = me.Range.Masked()
		if o, ok := overlapping(me.Range, others); ok {
			return nil, fmt.Errorf("egress: range %s overlaps %s, the range of %s: give another (--egress-range), or none for a free one",
				me.Range, o.Range, o.who())
		}
	} else {
		me.Range, err = freeRange(own, others)
		if err != nil {
			return nil, err
		}
	}
	f, err := reg.Write(me.Instance, me)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return &Registration{Claim: me, f: f}, nil
}

// readClaims reads the registry's claims that count (Register), removing
// those that no longer do, and returns those of other instances and the
// range this one had, if any. Claims of this state directory under
// another name are this instance's former ones: forgotten.
func readClaims(dir *claims.Dir, me Claim, tables map[string]bool) (others []Claim, own netip.Prefix, err error) {
	all, err := dir.List()
	if err != nil {
		return nil, netip.Prefix{}, fmt.Errorf("egress: %w", err)
	}
	for _, f := range all {
		var c Claim
		if json.Unmarshal(f.Data, &c) != nil || c.Instance != f.Name || !c.Range.IsValid() {
			continue // not a claim: left as it is
		}
		if c.Instance == me.Instance && c.StateDir == me.StateDir {
			own = c.Range
			continue
		}
		if c.StateDir == me.StateDir || !f.Held() && !tables[TableName(c.Instance)] {
			dir.Remove(f)
			continue
		}
		others = append(others, c)
	}
	return others, own, nil
}

// readChains lists the host's inet chains. Where nftables cannot be read
// (a kernel without it) there are none, and no kilnd's rules: egress
// fails there at its first use, saying why, and kilnd runs on without.
func readChains() (*nftables.Conn, []*nftables.Chain) {
	c, err := nftables.New()
	if err != nil {
		return nil, nil
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, nil
	}
	return c, chains
}

// usedTables are the kilnd tables that hold a sandbox's rules.
func usedTables(chains []*nftables.Chain) map[string]bool {
	used := map[string]bool{}
	for _, ch := range chains {
		if isKilndTable(ch.Table) && strings.HasPrefix(ch.Name, sandboxChainPrefix) {
			used[ch.Table.Name] = true
		}
	}
	return used
}

// legacyRange is the range of the table all kilnds shared before
// instances, if that table holds rules for a link not in attached: a
// kilnd of that age runs beside this one, or its sandboxes do.
func legacyRange(c *nftables.Conn, chains []*nftables.Chain, attached map[string]Attachment) (netip.Prefix, error) {
	mine := map[string]bool{}
	for _, a := range attached {
		mine[a.Iface] = true
	}
	ifaces := tableIfaces(legacyTable, chains)
	if !slices.ContainsFunc(ifaces, func(i string) bool { return !mine[i] }) {
		return netip.Prefix{}, nil
	}
	i := slices.IndexFunc(chains, func(ch *nftables.Chain) bool {
		return ch.Table.Name == legacyTable && ch.Name == natChain
	})
	if i < 0 {
		return DefaultRange, nil
	}
	rules, err := c.GetRules(chains[i].Table, chains[i])
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("egress: read table %s: %w", legacyTable, err)
	}
	for _, r := range rules {
		if p, ok := sourcePrefix(r.Exprs); ok {
			return p, nil
		}
	}
	return DefaultRange, nil
}

// sourcePrefix reads back the source prefix a rule matches, as prefix
// writes it.
func sourcePrefix(exprs []expr.Any) (netip.Prefix, bool) {
	for i := 0; i+2 < len(exprs); i++ {
		p, ok1 := exprs[i].(*expr.Payload)
		b, ok2 := exprs[i+1].(*expr.Bitwise)
		c, ok3 := exprs[i+2].(*expr.Cmp)
		if !ok1 || !ok2 || !ok3 || p.Base != expr.PayloadBaseNetworkHeader || p.Offset != 12 || p.Len != 4 || len(b.Mask) != 4 || len(c.Data) != 4 {
			continue
		}
		bits := 0
		for m := binary.BigEndian.Uint32(b.Mask); m&0x80000000 != 0; m <<= 1 {
			bits++
		}
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(c.Data)), bits).Masked(), true
	}
	return netip.Prefix{}, false
}

// overlapping finds the claim whose range overlaps p.
func overlapping(p netip.Prefix, claims []Claim) (Claim, bool) {
	for _, c := range claims {
		if c.Range.Overlaps(p) {
			return c, true
		}
	}
	return Claim{}, false
}

// freeRange is the range of an instance that asks for none: its own
// earlier one, else the first of DefaultRange and the /16s after it in
// 10.0.0.0/8 that overlaps none of others'.
func freeRange(own netip.Prefix, others []Claim) (netip.Prefix, error) {
	if own.IsValid() {
		if _, ok := overlapping(own, others); !ok {
			return own, nil
		}
	}
	for p := DefaultRange; ; {
		if _, ok := overlapping(p, others); !ok {
			return p, nil
		}
		b := p.Addr().As4()
		if b[1] == 255 {
			return netip.Prefix{}, fmt.Errorf("egress: no free range from %s to 10.255.0.0/16 (%d kilnd instances have them): give one (--egress-range)", DefaultRange, len(others))
		}
		b[1]++
		p = netip.PrefixFrom(netip.AddrFrom4(b), 16)
	}
}
