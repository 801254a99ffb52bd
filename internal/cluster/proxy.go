package cluster

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// nodeTransport carries requests between nodes: connections kept, a
// node that does not answer found out in seconds.
var nodeTransport = &http.Transport{
	Proxy:                 nil, // node to node, never through an HTTP proxy
	DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	MaxIdleConnsPerHost:   64,
	IdleConnTimeout:       90 * time.Second,
	TLSHandshakeTimeout:   5 * time.Second,
	ResponseHeaderTimeout: 0, // a watcher's stream may wait long for its first byte
	ExpectContinueTimeout: time.Second,
}

// newProxy forwards requests to node to's API as they came, the path and
// query unchanged, output flushed as it comes (a kiln.v1 WebSocket goes
// through as its upgrade).
func newProxy(n *Node, to api.Node) *httputil.ReverseProxy {
	base, err := url.Parse(to.APIURL)
	return &httputil.ReverseProxy{
		Transport: nodeTransport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			pr.Out.Host = base.Host
			// The caller's credentials are for this node; the next is
			// told it is this node that asks.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Set("Authorization", "Bearer "+n.Token())
			pr.Out.Header.Set(ForwardedHeader, n.cfg.Node)
			// Where it came from, for the other node's logs; not its
			// Origin, which this node has checked already.
			pr.Out.Header.Del("Origin")
			pr.SetXForwarded()
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, perr error) {
			if err != nil {
				perr = err
			}
			n.log.Warn("cluster: forwarding to a node failed", "to", to.Name, "err", perr)
			reply.Error(w, errdefs.Opaque(errdefs.ErrUnavailable, "node "+to.Name+" does not answer", perr))
		},
	}
}
