package client

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// PortRequest makes an HTTP request to the server on port inside the
// sandbox, through kilnd (/sandboxes/{id}/ports/{port}/path): path is the
// app's, with its query. The app's answer comes back whatever its status;
// a redirect as it is, its location under kilnd's prefix, not followed.
// kilnd's own refusals are errors: IsBadGateway when nothing listens on
// the port. The caller closes the body.
func (s *Sandbox) PortRequest(ctx context.Context, method string, port int, path string, body io.Reader) (*http.Response, error) {
	p, query, _ := strings.Cut(strings.TrimPrefix(path, "/"), "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("client: %q: %w", path, err)
	}
	resp, _, err := s.c.requestAs(ctx, s.c.stream, method, s.path("/ports/"+strconv.Itoa(port)+"/"+p), q, body, "", nil,
		func(resp *http.Response) bool { return resp.Header.Get(api.ErrorHeader) != "" })
	return resp, err
}

// DialPort opens a TCP connection to port inside the sandbox, carried
// over one WebSocket through kilnd, as kubectl port-forward does.
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	c, err := s.c.dial(ctx, s.path("/tcp/"+strconv.Itoa(port)), nil, api.ProtocolTCP)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(-1) // a stream: its messages are whatever the server writes
	return portConn{websocket.NetConn(context.Background(), c, websocket.MessageBinary), c}, nil
}

// portConn closes with the close handshake on the WebSocket itself: the
// net.Conn's own Close cancels its read first, which may drop the
// connection before the close frame is out.
type portConn struct {
	net.Conn
	ws *websocket.Conn
}

func (c portConn) Close() error { return c.ws.Close(websocket.StatusNormalClosure, "") }

// Preview makes a URL that reaches port inside the sandbox without
// kilnd's token, for ttl (kilnd's default, an hour, when zero). Its URL
// and token are given this once.
func (s *Sandbox) Preview(ctx context.Context, port int, ttl time.Duration) (api.Preview, error) {
	var p api.Preview
	err := s.c.call(ctx, "POST", s.path("/previews"), nil, api.CreatePreview{Port: port, TTLSeconds: int64(ttl / time.Second)}, &p, false)
	return p, err
}

// Previews lists the sandbox's previews that have not expired (without
// their tokens).
func (s *Sandbox) Previews(ctx context.Context) ([]api.Preview, error) {
	var list []api.Preview
	err := s.c.call(ctx, "GET", s.path("/previews"), nil, nil, &list, true)
	return list, err
}

// RevokePreview ends the preview id at once.
func (s *Sandbox) RevokePreview(ctx context.Context, id string) error {
	return s.c.call(ctx, "DELETE", s.path("/previews/"+url.PathEscape(id)), nil, nil, nil, true)
}
