package daemon

import (
	"cmp"
	"fmt"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// Each preview is served on a host of its own, ID.DOMAIN, and so on an
// origin of its own: a page a sandbox serves can reach neither the web
// console's storage nor another preview's, and kilnd's API and console
// are never served there. DOMAIN is "localhost" unless kilnd is told
// otherwise (--preview-domain): browsers and curl resolve every name
// under it to loopback themselves, and since a browser takes "localhost"
// for a public suffix, each ID.localhost is a site of its own, whose
// cookies no other preview can read or set.
//
// Every name under DOMAIN (any depth) is the previews': a request naming
// one reaches a preview or nothing, never the API or the console; a
// request naming another host never reaches a preview.

// DefaultPreviewDomain is where previews' hosts are by default.
const DefaultPreviewDomain = "localhost"

// previewDomain is the domain previews' hosts are under.
func (d *Daemon) previewDomain() string {
	return cmp.Or(d.cfg.PreviewDomain, DefaultPreviewDomain)
}

// ValidatePreviewDomain checks a --preview-domain: a DNS name, not an
// address, with room for a preview's label, and no name kilnd serves its
// API at (allowHosts, name or name:port) under it. Empty is the default,
// DefaultPreviewDomain.
func ValidatePreviewDomain(domain string, allowHosts []string) error {
	domain = cmp.Or(domain, DefaultPreviewDomain)
	bad := func(why string) error {
		return fmt.Errorf("%w: preview domain %q: %s", errdefs.ErrInvalidArgument, api.Clip(domain), why)
	}
	if len(domain) > 200 {
		return bad("longer than 200 bytes")
	}
	if net.ParseIP(strings.Trim(domain, "[]")) != nil {
		return bad("an address; want a DNS name whose subdomains all resolve to kilnd (a wildcard record)")
	}
	for label := range strings.SplitSeq(domain, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.IndexFunc(label, func(c rune) bool { return !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') }) >= 0 {
			return bad("want a DNS name in lower case, such as preview.example.com")
		}
	}
	for _, h := range allowHosts {
		name := strings.ToLower(h)
		if host, _, err := net.SplitHostPort(name); err == nil {
			name = host
		}
		if underDomain(strings.TrimSuffix(name, "."), domain) {
			return fmt.Errorf("%w: allowed host %q is under the preview domain %s: every name there is a preview's", errdefs.ErrInvalidArgument, api.Clip(h), domain)
		}
	}
	return nil
}

// underDomain reports whether name is a subdomain of domain.
func underDomain(name, domain string) bool {
	return len(name) > len(domain)+1 && strings.HasSuffix(name, "."+domain)
}

// loopbackDomain reports whether names under domain are this machine's
// alone (RFC 6761): their port must be the previews' listener's.
func loopbackDomain(domain string) bool {
	return domain == "localhost" || strings.HasSuffix(domain, ".localhost")
}

// previewHost reads r's Host: ns says it names the previews' domain, and
// id is the preview it names, if it is a preview's host as kilnd serves
// it (one label of a preview id's form, and for a loopback domain the
// previews' listener's port); ns without an id reaches nothing.
func (d *Daemon) previewHost(r *http.Request) (id string, ns bool) {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, "80"
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	domain := d.previewDomain()
	if !underDomain(host, domain) {
		return "", false
	}
	label := strings.TrimSuffix(host, "."+domain)
	if !previewID(label) {
		return "", true
	}
	if loopbackDomain(domain) && port != d.previewPort() {
		return "", true
	}
	return label, true
}

// PreviewRequest reports whether r was made to the previews' server: it
// names a host under the previews' domain (a preview's, or one that
// reaches nothing), it came to the previews' own listener, or another
// node forwarded it for a preview (previewForwarded).
func (d *Daemon) PreviewRequest(r *http.Request) bool {
	if _, ns := d.previewHost(r); ns || d.previewForwarded(r) {
		return true
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	pl := d.previewTCP.Load()
	return local != nil && pl != nil && local.Port == pl.Port && (pl.IP.IsUnspecified() || pl.IP.Equal(local.IP))
}

// previewID reports whether s has a preview id's form: 8 to 32 lower-case
// hex digits (kilnd makes 16; earlier versions made 8).
func previewID(s string) bool {
	if len(s) < 8 || len(s) > 32 {
		return false
	}
	return strings.IndexFunc(s, func(c rune) bool { return !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') }) < 0
}

// previewPort is the port of the listener previews are served on: the
// previews' own (--preview-listen) or else the API's TCP listener; empty
// before it listens, or without one.
func (d *Daemon) previewPort() string {
	if d.cfg.PreviewListen != "" {
		if a := d.previewTCP.Load(); a != nil {
			return strconv.Itoa(a.Port)
		}
		return ""
	}
	_, port := d.tcpAddr()
	return port
}

// PreviewAddr is the address the previews' own listener listens on, once
// Serve has started it; empty without one (previews are then served on
// the API's TCP listener).
func (d *Daemon) PreviewAddr() string {
	if a := d.previewTCP.Load(); a != nil {
		return a.String()
	}
	return ""
}

// previewAuthority is what follows a new preview's id in its URL's
// authority: ".DOMAIN" and the port, unless it is 80. A preview under a
// domain of kilnd's own (not a loopback one) served on the API's
// listener takes the port its creator reached that listener on, as a
// proxy in front of kilnd passes it on; any other takes the listener's.
func (d *Daemon) previewAuthority(r *http.Request, tcp bool) (string, error) {
	port := d.previewPort()
	if port == "" {
		return "", errdefs.New(errdefs.ErrFailedPrecondition, "a preview URL needs a TCP listener: kilnd's (--listen) or the previews' own (--preview-listen)")
	}
	domain := d.previewDomain()
	if tcp && d.cfg.PreviewListen == "" && !loopbackDomain(domain) {
		port = "80"
		if _, p, err := net.SplitHostPort(r.Host); err == nil {
			port = p
		}
	}
	if port == "80" {
		return "." + domain, nil
	}
	return "." + domain + ":" + port, nil
}

// notPreviewed answers a request that reaches no preview on a preview's
// host, or one for the previews' listener naming another host.
func notPreviewed(w http.ResponseWriter, r *http.Request) {
	reply.Error(w, errdefs.New(errdefs.ErrNotFound, "host "+api.Clip(r.Host)+" is no preview's, and a preview's host serves that preview alone"))
}

// PreviewHandler serves previews alone, as the previews' own listener
// (--preview-listen) does: a request naming another host is answered 404.
func (d *Daemon) PreviewHandler() http.Handler {
	return d.metrics.instrument(d.previewHandler())
}

// previewHandler serves a preview's host: /preview/{token}/{path...}, the
// token being the preview's, and nothing else. kilnd checks no Origin
// and adds no CORS headers there: the answers are the app's.
func (d *Daemon) previewHandler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc(previewPrefix, d.servePreview)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		reply.Error(w, errdefs.New(errdefs.ErrNotFound, "a preview's host serves "+previewPrefix+"TOKEN/ alone (no route "+api.Clip(r.URL.Path)+")"))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, _ := d.previewHost(r); id == "" {
			notPreviewed(w, r)
			return
		}
		// Refused rather than redirected, as the API's paths are.
		if p := r.URL.EscapedPath(); p != "/" && path.Clean(p) != strings.TrimSuffix(p, "/") {
			reply.Error(w, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("path %s is not clean (no \"..\", \".\" or empty segment)", api.Clip(p))))
			return
		}
		// Set by kilnd alone, for the agent.
		r.Header.Del(api.PrefixHeader)
		m.ServeHTTP(w, r)
	})
}
