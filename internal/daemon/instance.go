package daemon

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/sandkiln/sandkiln/internal/egress"
)

// Many kilnds may run on one host, each on a state directory of its own
// and each an instance with a name (Config.Instance, kilnd --instance).
// Every name a kilnd gives the host carries it: its nftables table
// (egress.TableName), its sandboxes' links (egress.IfacePrefix) and the
// cgroup its sandboxes' groups are made in; its runsc root is in its state
// directory already. Its egress range and its window of host uids are
// claimed in a registry under /run (egress.Register, sandbox.ClaimUIDs),
// where no other instance's may overlap them.

// DefaultClaimsDir is where the kilnds of a host claim their egress
// ranges and windows of host uids (in egress and uids): under /run, so
// that the claims end with the boot, as the sandboxes, links and rules
// they describe do.
const DefaultClaimsDir = "/run/sandkiln"

// DefaultInstance is the name of the instance a kilnd on stateDir is
// unless told otherwise: the directory's base name, made fit for a name
// and cut to 16 characters, "-" and six hex digits of a hash of its
// absolute path (symbolic links resolved where they can be), such as
// sandkiln-3fa2c1 for /var/lib/sandkiln. It stays the same from one start
// to the next, and two state directories of one name get two.
func DefaultInstance(stateDir string) string {
	dir := canonical(stateDir)
	var b strings.Builder
	for _, r := range strings.ToLower(filepath.Base(dir)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	base := strings.Trim(b.String(), "-")
	if len(base) > 16 {
		base = strings.TrimRight(base[:16], "-")
	}
	if base == "" {
		base = "kilnd"
	}
	h := sha256.Sum256([]byte(dir))
	return base + "-" + hex.EncodeToString(h[:3])
}

// canonical is dir's absolute path, symbolic links resolved where they
// can be: what the registry and the default instance name know a state
// directory by.
func canonical(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = filepath.Clean(dir)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	return abs
}

// ValidateInstance checks an instance's name as kilnd --instance gives it.
func ValidateInstance(name string) error {
	if err := egress.CheckInstance(name); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "egress: "))
	}
	return nil
}

// registerEgress claims the instance's egress range (the one configured,
// or a free one) among the kilnds of the host, once the sandboxes with a
// network that outlived the last kilnd are known: a range that overlaps
// another kilnd's is refused, with its name.
func (d *Daemon) registerEgress() error {
	dir := filepath.Join(cmp.Or(d.cfg.ClaimsDir, DefaultClaimsDir), "egress")
	d.netMu.Lock()
	adopted := maps.Clone(d.adopted)
	d.netMu.Unlock()
	r, err := egress.Register(dir, egress.Claim{Instance: d.cfg.Instance, StateDir: canonical(d.cfg.StateDir), Range: d.cfg.EgressRange}, adopted)
	if err != nil {
		return fmt.Errorf("kilnd: %w", err)
	}
	d.registration, d.cfg.EgressRange = r, r.Range
	return nil
}

// Instance is this kilnd's instance name.
func (d *Daemon) Instance() string { return d.cfg.Instance }

// EgressRange is the range this kilnd's sandboxes' addresses come from,
// as it claimed it at start.
func (d *Daemon) EgressRange() netip.Prefix { return d.cfg.EgressRange }
