package cluster

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
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
	base, _ := url.Parse(to.APIURL) // checked by Forward
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
			n.log.Warn("cluster: forwarding to a node failed", "to", to.Name, "err", perr)
			reply.Error(w, errdefs.Opaque(errdefs.ErrUnavailable, "node "+to.Name+" does not answer", perr))
		},
	}
}

// Do calls node to's API as this node (the cluster's token), with body
// as the request's (JSON unless it is an io.Reader, sent as it is, of
// contentType), and decodes a 2xx answer into out (when not nil). An
// answer of the API's error shape comes back as an error wrapping its
// kind.
func (n *Node) Do(ctx context.Context, to api.Node, method, path, contentType string, body any, out any) error {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case io.Reader:
		rd = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return err
		}
		rd, contentType = bytes.NewReader(j), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(to.APIURL, "/")+path, rd)
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Authorization", "Bearer "+n.Token())
	req.Header.Set(ForwardedHeader, n.cfg.Node)
	resp, err := (&http.Client{Transport: nodeTransport}).Do(req)
	if err != nil {
		return errdefs.Opaque(errdefs.ErrUnavailable, "node "+to.Name+" does not answer", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		json.Unmarshal(b, &e)
		msg := cmp.Or(e.Error.Message, resp.Status)
		return fmt.Errorf("%w: node %s: %s", classOf(resp.StatusCode), to.Name, msg)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// classOf is the error class of another node's answer of status code.
func classOf(code int) *errdefs.Class {
	switch code {
	case http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		return errdefs.ErrAlreadyExists
	case http.StatusPreconditionFailed:
		return errdefs.ErrFailedPrecondition
	case http.StatusRequestEntityTooLarge:
		return errdefs.ErrTooLarge
	case http.StatusInsufficientStorage:
		return errdefs.ErrNoSpace
	}
	return errdefs.ErrUnavailable
}

// PreviewHeader names the preview a request one node forwards another
// (ForwardPreview) is for: the request's host is the other node's API's,
// not the preview's.
const PreviewHeader = "Kiln-Preview"

// ForwardPreview serves r, a request to preview id's host, by node to,
// which serves that preview: its API takes it with the cluster's token
// (in place of any Authorization the browser sent, which no preview's
// app is given) and serves it as the preview's host would. The rest of
// the request goes as it came, cookies and Origin included: they are the
// app's.
func (n *Node) ForwardPreview(w http.ResponseWriter, r *http.Request, to api.Node, id string) {
	base, err := url.Parse(to.APIURL)
	if err != nil || base.Host == "" || base.Scheme != "http" && base.Scheme != "https" {
		reply.Error(w, errdefs.New(errdefs.ErrUnavailable, "this preview's node has no address this node can reach"))
		return
	}
	p := &httputil.ReverseProxy{
		Transport: nodeTransport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			pr.Out.Host = base.Host
			pr.Out.Header.Set("Authorization", "Bearer "+n.Token())
			pr.Out.Header.Set(ForwardedHeader, n.cfg.Node)
			pr.Out.Header.Set(PreviewHeader, id)
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, perr error) {
			n.log.Warn("cluster: forwarding a preview's request failed", "to", to.Name, "err", perr)
			// Told to whoever has the preview's URL: no node's name.
			reply.Error(w, errdefs.Opaque(errdefs.ErrUnavailable, "this preview's node does not answer", perr))
		},
	}
	p.ServeHTTP(w, r)
}
