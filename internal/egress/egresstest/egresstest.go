// Package egresstest gives egress tests a network of their own: the test re-run in a fresh network namespace, and an upstream host (another namespace, a link to it, a web server and a name server) that is the only place its sandboxes reach.
package egresstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// isolatedEnv marks the test process re-run in a network namespace.
const isolatedEnv = "KILN_TEST_NETNS"

// Isolate runs the calling test in a network namespace of its own, so
// that its links, routes, forwarding and nftables rules are never the
// host's: it returns false after re-running the test binary (only this
// test) in a fresh namespace and reporting its result, and true in that
// re-run, with the loopback up. The caller returns when it is false.
func Isolate(t *testing.T) bool {
	t.Helper()
	if os.Getenv(isolatedEnv) == t.Name() {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatalf("bring the loopback up: %v", err)
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.count=1", "-test.v"}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), isolatedEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET, Pdeathsig: unix.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own:\n%s", out)
	if err != nil {
		t.Fatalf("the test in its network namespace: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("the test did not pass in its network namespace")
	}
	return false
}

// Upstream is a host beyond the sandboxes' host: a network namespace
// joined to the test's by a link, with addresses in a public range
// (198.51.100.0/24, reserved for documentation) and a private one.
type Upstream struct {
	// Addr is its public address; HostAddr the test host's end.
	Addr, HostAddr netip.Addr
	// Private is a second address, in 192.168.77.0/24.
	Private netip.Addr
	// HTTP is the port its web server listens on, on each address: it
	// answers every request with "upstream saw " and the client's address.
	HTTP uint16
	// Names are what its name server (port 53, UDP) answers for; each
	// resolves to Addr.
	Names []string
}

// StartUpstream makes an upstream for the test, removed when it ends.
// Call it in an isolated test (Isolate).
func StartUpstream(t *testing.T) *Upstream {
	t.Helper()
	u := &Upstream{
		Addr: netip.MustParseAddr("198.51.100.2"), HostAddr: netip.MustParseAddr("198.51.100.1"),
		Private: netip.MustParseAddr("192.168.77.2"), HTTP: 8080, Names: []string{"upstream.test"},
	}
	var ls []net.Listener
	var dns net.PacketConn
	err := inNewNetns(t, func(orig, ns netns.NsHandle) error {
		if err := u.link(orig, ns); err != nil {
			return err
		}
		if err := u.upInside(); err != nil {
			return err
		}
		var err error
		ls, dns, err = u.listen()
		return err
	})
	if err != nil {
		t.Fatalf("upstream: %v", err)
	}
	u.serve(t, ls, dns)
	return u
}

// link joins the test's namespace (orig) to the upstream's (ns): a link
// made from the test's, one end moved into the upstream's, the test's end
// addressed and routed to, both the public and the private range.
func (u *Upstream) link(orig, ns netns.NsHandle) error {
	h, err := netlink.NewHandleAt(orig)
	if err != nil {
		return err
	}
	defer h.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "upstream0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("upstream link: %w", err)
	}
	host, err := h.LinkByName("upstream0")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(host, addr(u.HostAddr, 24)); err != nil {
		return err
	}
	if err := h.LinkSetUp(host); err != nil {
		return err
	}
	// The private range is reached through the upstream too.
	if err := h.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(192, 168, 77, 0), Mask: net.CIDRMask(24, 32)}, Gw: net.IP(u.Addr.AsSlice())}); err != nil {
		return fmt.Errorf("route to the private range: %w", err)
	}
	return nil
}

// upInside brings up the upstream's own end, and its loopback, with both
// its addresses. The calling thread must be in the upstream's namespace.
func (u *Upstream) upInside() error {
	for _, name := range []string{"lo", "eth0"} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if name == "eth0" {
			if err := netlink.AddrAdd(l, addr(u.Addr, 24)); err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, addr(u.Private, 24)); err != nil {
				return err
			}
		}
	}
	return nil
}

// listen opens the upstream's sockets: its web server's on each address
// and its name server's. The calling thread must be in the upstream's
// namespace: sockets belong to the namespace they are made in, whichever
// thread serves them later. On a failure none is left open.
func (u *Upstream) listen() ([]net.Listener, net.PacketConn, error) {
	var ls []net.Listener
	closeAll := func() {
		for _, l := range ls {
			l.Close()
		}
	}
	for _, a := range []netip.Addr{u.Addr, u.Private} {
		l, err := net.Listen("tcp", netip.AddrPortFrom(a, u.HTTP).String())
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ls = append(ls, l)
	}
	dns, err := net.ListenPacket("udp", netip.AddrPortFrom(u.Addr, 53).String())
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return ls, dns, nil
}

// serve serves the web server on ls and the name server on dns until the
// test ends, and then removes the link.
func (u *Upstream) serve(t *testing.T, ls []net.Listener, dns net.PacketConn) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		io.WriteString(w, "upstream saw "+host)
	})}
	done := make(chan struct{})
	for _, l := range ls {
		go srv.Serve(l)
	}
	go func() {
		defer close(done)
		serveDNS(dns, u.Names, u.Addr)
	}()
	t.Cleanup(func() {
		srv.Close()
		dns.Close()
		<-done
		if l, err := netlink.LinkByName("upstream0"); err == nil {
			netlink.LinkDel(l)
		}
	})
}

// inNewNetns runs f on a thread moved from its namespace (orig) into a
// new one (ns), and brings the thread back.
func inNewNetns(t *testing.T, f func(orig, ns netns.NsHandle) error) error {
	return onThread(func() (netns.NsHandle, error) {
		ns, err := netns.New()
		if err == nil {
			t.Cleanup(func() { ns.Close() })
		}
		return ns, err
	}, f)
}

// onThread runs f on a locked thread that enter moves from its namespace
// (orig) into another (ns), and brings the thread back.
func onThread(enter func() (netns.NsHandle, error), f func(orig, ns netns.NsHandle) error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := enter()
		if err != nil {
			netns.Set(orig)
			errc <- err
			return
		}
		err = f(orig, ns)
		// Back, or the thread is not fit for others: it then ends with
		// this goroutine, still locked.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// serveDNS answers A queries for names with a, until c is closed.
func serveDNS(c net.PacketConn, names []string, a netip.Addr) {
	buf := make([]byte, 512)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		known := false
		for _, name := range names {
			if strings.EqualFold(strings.TrimSuffix(q.Name.String(), "."), name) {
				known = true
			}
		}
		hdr := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true}
		if !known {
			hdr.RCode = dnsmessage.RCodeNameError
		}
		resp := dnsmessage.NewBuilder(nil, hdr)
		resp.StartQuestions()
		resp.Question(q)
		resp.StartAnswers()
		if known && q.Type == dnsmessage.TypeA {
			resp.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a.As4()})
		}
		out, err := resp.Finish()
		if err != nil {
			continue
		}
		c.WriteTo(out, from)
	}
}

// InNetns runs f on a thread in the network namespace at nsPath (a
// sandbox's, or one NewNetns made): the sockets it makes are that
// namespace's, whichever thread uses them later.
func InNetns(nsPath string, f func() error) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	return onThread(func() (netns.NsHandle, error) { return ns, netns.Set(ns) }, func(_, _ netns.NsHandle) error { return f() })
}

// Dial connects to addr (network "tcp" or "udp") from the namespace at
// nsPath, as a program there would.
func Dial(nsPath, network, addr string) (c net.Conn, err error) {
	err = InNetns(nsPath, func() error {
		// Refusals are immediate: a timeout is a packet dropped.
		c, err = net.DialTimeout(network, addr, 5*time.Second)
		return err
	})
	return c, err
}

// Listen listens on addr (TCP) in the namespace at nsPath.
func Listen(nsPath, addr string) (l net.Listener, err error) {
	err = InNetns(nsPath, func() error {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// Resolver resolves names as a program in the namespace at nsPath whose
// resolv.conf names server would.
func Resolver(nsPath string, server netip.Addr) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return Dial(nsPath, network, netip.AddrPortFrom(server, 53).String())
	}}
}

// Get fetches http://addr/ from the namespace at nsPath and returns the
// body.
func Get(nsPath, addr string) (string, error) {
	c, err := Dial(nsPath, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", addr); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 64<<10))
	if err != nil {
		return "", err
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		return "", errors.New("no HTTP response")
	}
	return body, nil
}

// Refused says whether err is a connection refused by a rule (a TCP
// reset, or an ICMP "prohibited").
func Refused(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.EACCES)
}

// NewNetns makes a network namespace (a stand-in for a sandbox's), its
// loopback up, and returns a path to it, valid until the test ends.
func NewNetns(t *testing.T) string {
	t.Helper()
	var path string
	err := inNewNetns(t, func(_, ns netns.NsHandle) error {
		path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns))
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("network namespace: %v", err)
	}
	return path
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}}
}
