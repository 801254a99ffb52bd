package egress

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/sandkiln/sandkiln/api"
)

// Many kilnds share a host, each an instance with a name of its own
// (kilnd --instance). Everything of egress that the host sees by name
// carries it: the nftables table and the host ends of the links. No
// kilnd's rules ever touch another's sandboxes, and none rebuilds
// another's table.

// CheckInstance checks an instance's name: 1 to 32 of a-z, 0-9 and "-",
// beginning with a letter or digit, so that it names a table, a cgroup and
// a file as it is.
func CheckInstance(name string) error {
	ok := len(name) >= 1 && len(name) <= 32 && name[0] != '-'
	for _, r := range name {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}
	if !ok {
		return fmt.Errorf("egress: instance name %q: want 1 to 32 of a-z, 0-9 and -, not beginning with -", api.Clip(name))
	}
	return nil
}

// TableName is the nftables table (family inet) of kilnd instance: it
// holds every rule for that kilnd's sandboxes, and nothing else does.
func TableName(instance string) string { return tablePrefix + instance }

// tablePrefix begins every instance's table; legacyTable is the one
// table every kilnd shared before instances, whose sandboxes' links were
// named legacyIfacePrefix and the end of their ids.
const (
	tablePrefix       = "kiln-"
	legacyTable       = "kiln"
	legacyIfacePrefix = "kv-"
)

// IfacePrefix begins the name of the host end of every link of instance's
// sandboxes: "kv", four hex digits of a hash of the name, and "-", so that
// the name, with the sandbox's part (ifaceSuffixLen hex digits), fits the
// kernel's 15 characters. The rules refuse what comes from or goes to a
// link of that prefix the instance does not know. Two instances whose
// names hash alike are refused by Register, which says so.
func IfacePrefix(instance string) string {
	h := sha256.Sum256([]byte(instance))
	return "kv" + hex.EncodeToString(h[:2]) + "-"
}

// ifaceSuffixLen is how much of a sandbox's id its link's name carries.
const ifaceSuffixLen = 8

// sandboxChain names the chain of a sandbox's policy.
func sandboxChain(a Attachment) string { return sandboxChainPrefix + a.Iface }

const sandboxChainPrefix = "sandbox-"

// tableIfaces lists the links the sandbox chains of table name are for,
// by the naming of the kilnd that made it.
func tableIfaces(name string, chains []*nftables.Chain) []string {
	var ifaces []string
	for _, ch := range chains {
		if ch.Table.Name != name || ch.Table.Family != nftables.TableFamilyINet {
			continue
		}
		rest, ok := strings.CutPrefix(ch.Name, sandboxChainPrefix)
		if !ok {
			continue
		}
		if name == legacyTable {
			rest = legacyIfacePrefix + rest
		}
		ifaces = append(ifaces, rest)
	}
	return ifaces
}

// isKilndTable says whether an nftables table is a kilnd's.
func isKilndTable(t *nftables.Table) bool {
	return t.Family == nftables.TableFamilyINet && (t.Name == legacyTable || strings.HasPrefix(t.Name, tablePrefix))
}

// formerTables are the kilnd tables, other than own, that hold rules for
// the sandboxes attached and for no other: an earlier kilnd's on the same
// state directory (the shared table of a kilnd older than instances, or
// this state directory's under another instance name). Their sandboxes
// are this kilnd's now, so are their rules. A table that also holds rules
// for a link this kilnd does not know is another kilnd's, and is left.
func formerTables(own string, attached map[string]Attachment) ([]string, error) {
	if len(attached) == 0 {
		return nil, nil
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("egress: nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("egress: list the nftables tables: %w", err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("egress: list the nftables chains: %w", err)
	}
	mine := map[string]bool{}
	for _, a := range attached {
		mine[a.Iface] = true
	}
	var former []string
	for _, t := range tables {
		if !isKilndTable(t) || t.Name == own {
			continue
		}
		ifaces := tableIfaces(t.Name, chains)
		if len(ifaces) > 0 && !slices.ContainsFunc(ifaces, func(i string) bool { return !mine[i] }) {
			former = append(former, t.Name)
		}
	}
	return former, nil
}
