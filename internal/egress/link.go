package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// SandboxIface is the name of a sandbox's end of its link.
const SandboxIface = "eth0"

// Attach connects the network namespace at nsPath (a sandbox's agent's,
// /proc/PID/ns/net) through a's link: a veth pair, the host's end addressed as the
// sandbox's gateway, the sandbox's end as eth0 with its address and a
// default route. Its rules are in place already (Allocate), so nothing it
// sends passes unfiltered. On failure nothing of the link is left.
func (m *Manager) Attach(nsPath string, a Attachment) (err error) {
	if err := enableForwarding(); err != nil {
		return err
	}
	ns, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("egress: the sandbox's network namespace: %w", err)
	}
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.Iface}, PeerName: SandboxIface, PeerNamespace: netlink.NsFd(ns.Fd())}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("egress: make the link %s: %w", a.Iface, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.unlink(a.Iface))
		}
	}()
	host, err := netlink.LinkByName(a.Iface)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	if err := netlink.AddrAdd(host, addrOf(a.Host)); err != nil {
		return fmt.Errorf("egress: address %s on %s: %w", a.Host, a.Iface, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("egress: bring %s up: %w", a.Iface, err)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()))
	if err != nil {
		return fmt.Errorf("egress: netlink in the sandbox: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName(SandboxIface)
	if err != nil {
		return fmt.Errorf("egress: the sandbox's %s: %w", SandboxIface, err)
	}
	if err := h.AddrAdd(eth, addrOf(a.Addr)); err != nil {
		return fmt.Errorf("egress: the sandbox's address %s: %w", a.Addr, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("egress: bring the sandbox's %s up: %w", SandboxIface, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(a.Host.AsSlice())}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("egress: the sandbox's default route: %w", err)
	}
	return nil
}

// unlink removes the host's end of a link (and so both), if it is there.
func (m *Manager) unlink(iface string) error {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("egress: %w", err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("egress: remove the link %s: %w", iface, err)
	}
	return nil
}

// addrOf is a's address on its /30.
func addrOf(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(30, 32)}}
}
