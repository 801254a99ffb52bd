// Package forward holds what kilnd's and the agent's forwarding proxies
// share: a request's body as they hand it on.
package forward

import (
	"io"
	"net/http"
)

// Body has r's body end, for the proxy's transport, once the bytes its
// Content-Length declared have been read, without asking the server for
// more.
//
// Go's HTTP/1 server drains and closes a request's body when the answer's
// header is written, and the transport, having sent the declared length,
// reads the body once more to check that nothing follows. When the
// upstream (the agent, an app) answers the moment the last byte is in,
// that read can meet the closed body: the transport then takes the
// failed read for a failed request, tears down its connection, and the
// answer on its way back is cut, to a call that took effect. Read from
// here, the body ends where it said it would, and no read comes after.
func Body(r *http.Request) *http.Request {
	if r.Body == nil || r.Body == http.NoBody {
		return r
	}
	r.Body = &declared{ReadCloser: r.Body, left: r.ContentLength}
	return r
}

// declared is a body of left bytes still to come (-1: as many as come
// before its end), which, once ended, stays ended.
type declared struct {
	io.ReadCloser
	left  int64
	ended bool
}

func (b *declared) Read(p []byte) (int, error) {
	if b.ended || b.left == 0 {
		b.ended = true
		return 0, io.EOF
	}
	if b.left > 0 && int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	if b.left > 0 {
		b.left -= int64(n)
		if b.left == 0 && err == nil {
			err = io.EOF
		}
	}
	if err == io.EOF {
		b.ended = true
	}
	return n, err
}
