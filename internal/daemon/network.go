package daemon

import (
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// network returns the egress manager, made (and kilnd's nftables table
// installed, for the adopted sandboxes) on first use.
func (d *Daemon) network() (*egress.Manager, error) {
	d.netMu.Lock()
	defer d.netMu.Unlock()
	if d.net != nil {
		return d.net, nil
	}
	resolvers := d.cfg.EgressDNS
	if len(resolvers) == 0 {
		resolvers = egress.HostResolvers()
	}
	m, err := egress.New(egress.Config{Instance: d.cfg.Instance, Range: d.cfg.EgressRange, Resolvers: resolvers}, d.adopted)
	if err != nil {
		return nil, err
	}
	d.net, d.adopted = m, nil
	return m, nil
}

// plug gives sandbox id, about to be made, its place on the network with
// policy p: its address and rules now, into rec; its link once its agent
// runs, through opts. unplug undoes it.
func (d *Daemon) plug(id string, p api.Network, rec *record, opts *sandbox.Options) error {
	m, err := d.network()
	if err != nil {
		return d.hostFailure("a network beyond the loopback cannot be made", err)
	}
	p.Address = ""
	if p.Egress == "" {
		p.Egress = api.EgressNone
	}
	a, err := m.Allocate(id, p)
	if err != nil {
		return err
	}
	rec.Network = &a
	for _, r := range m.Resolvers() {
		opts.Resolvers = append(opts.Resolvers, r.String())
	}
	opts.Network = func(nsPath string) error { return m.Attach(nsPath, a) }
	return nil
}

// unplug removes sandbox id's rules and link, if it has them.
func (d *Daemon) unplug(id string) {
	d.netMu.Lock()
	m := d.net
	delete(d.adopted, id)
	d.netMu.Unlock()
	if m == nil {
		return
	}
	if err := m.Release(id); err != nil {
		d.log.Error("remove a sandbox's network", "id", id, "err", err)
	}
}

// readopt installs the rules of the sandboxes with a network that
// outlived the last kilnd, as kilnd starts serving: until then the last
// kilnd's rules are in force.
func (d *Daemon) readopt() {
	d.netMu.Lock()
	n := len(d.adopted)
	d.netMu.Unlock()
	if n == 0 {
		return
	}
	if _, err := d.network(); err != nil {
		d.log.Error("sandboxes with a network adopted, their rules not rebuilt", "sandboxes", n, "err", err)
	}
}
