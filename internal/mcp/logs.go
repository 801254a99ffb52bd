package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkiln/sandkiln/client"
)

// A captured log's resource URI: kiln://sandboxes/{sandbox}/logs/{pid}.
const (
	logScheme   = "kiln"
	logTemplate = "kiln://sandboxes/{sandbox}/logs/{pid}"
)

func logURI(sandbox, pid string) string {
	return "kiln://sandboxes/" + url.PathEscape(sandbox) + "/logs/" + url.PathEscape(pid)
}

// parseLogURI is logURI's inverse.
func parseLogURI(uri string) (sandbox, pid string, _ error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != logScheme || u.Host != "sandboxes" {
		return "", "", fmt.Errorf("resource %q: want kiln://sandboxes/SANDBOX/logs/PID", uri)
	}
	parts := strings.Split(strings.TrimPrefix(u.EscapedPath(), "/"), "/")
	if len(parts) != 3 || parts[1] != "logs" || parts[0] == "" || parts[2] == "" {
		return "", "", fmt.Errorf("resource %q: want kiln://sandboxes/SANDBOX/logs/PID", uri)
	}
	if sandbox, err = url.PathUnescape(parts[0]); err == nil {
		pid, err = url.PathUnescape(parts[2])
	}
	if err != nil {
		return "", "", fmt.Errorf("resource %q: %w", uri, err)
	}
	return sandbox, pid, nil
}

// addLogs makes every captured log a resource: the template reads any of
// them, and resources/list names those of the sandboxes there are now
// (the SDK lists only resources added one by one, so a middleware adds
// them to the list's last page).
func (s *Server) addLogs() {
	s.s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "process-log",
		Title:       "A process's captured output",
		URITemplate: logTemplate,
		MIMEType:    "text/plain",
		Description: fmt.Sprintf("The output a process in a sandbox wrote, stdout and stderr as they came, kept on disk "+
			"after it ended: its last %d bytes. process_output reads any part of it by offsets.", LogBytes),
	}, s.readLog)
	s.s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if list, ok := res.(*mcp.ListResourcesResult); ok && err == nil && list.NextCursor == "" {
				logs, err := s.logResources(ctx)
				if err != nil {
					return nil, err
				}
				list.Resources = append(list.Resources, logs...)
			}
			return res, err
		}
	})
}

// logResources are the captured logs of every sandbox not deleted.
func (s *Server) logResources(ctx context.Context) ([]*mcp.Resource, error) {
	sandboxes, err := s.c.Sandboxes(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing captured logs: %w", err)
	}
	var out []*mcp.Resource
	for _, sb := range sandboxes {
		logs, err := s.c.Handle(sb.ID).CapturedLogs(ctx)
		if err != nil {
			continue // a sandbox deleted meanwhile has nothing to list
		}
		for _, l := range logs {
			out = append(out, &mcp.Resource{
				URI:         logURI(sb.ID, l.Process),
				Name:        "log " + sb.ID + "/" + l.Process,
				Title:       fmt.Sprintf("output of process %s in sandbox %s", l.Process, sb.ID),
				MIMEType:    "text/plain",
				Description: fmt.Sprintf("captured output, complete: %v; read gives its last %d bytes", l.Complete, LogBytes),
			})
		}
	}
	return out, nil
}

func (s *Server) readLog(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	sandbox, pid, err := parseLogURI(uri)
	if err != nil {
		return nil, err
	}
	sb := s.c.Handle(sandbox)
	// The log's writer may be a little behind the process: for one that
	// has exited, read on to the log's own end record, so that what is
	// read is all of it (a running one's is what is written so far).
	out, err := sb.CapturedLog(ctx, pid, client.LogOptions{Follow: s.exited(ctx, sb, pid)})
	if client.IsNotFound(err) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", uri, err)
	}
	defer out.Close()
	tail, total, err := lastBytes(out, LogBytes)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", uri, err)
	}
	t := text(tail[partialStart(tail):])
	if skipped := total - int64(len(tail)); skipped > 0 {
		t = fmt.Sprintf("[the log's first %d bytes are not shown: a resource holds its last %d; process_output reads any part by offsets]\n", skipped, LogBytes) + t
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: t}}}, nil
}

// exited reports whether the process pid is known to have exited.
func (s *Server) exited(ctx context.Context, sb *client.Sandbox, pid string) bool {
	p, err := sb.Process(ctx, pid, client.ProcessOptions{})
	if err != nil {
		return false // gone from memory: its log is all there is
	}
	defer p.Detach()
	st, err := p.Status(ctx)
	return err == nil && st.State == client.Exited
}

// lastBytes reads r to its end and returns its last n bytes and how many
// it read, holding at most 2n at a time.
func lastBytes(r io.Reader, n int) ([]byte, int64, error) {
	buf := make([]byte, 0, 2*n)
	var total int64
	for {
		if len(buf) == cap(buf) {
			buf = append(buf[:0], buf[len(buf)-n:]...)
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		total += int64(m)
		if errors.Is(err, io.EOF) {
			return buf[max(0, len(buf)-n):], total, nil
		}
		if err != nil {
			return nil, total, err
		}
	}
}

// partialStart is how many bytes b starts with that continue a UTF-8
// character begun before it (at most three).
func partialStart(b []byte) int {
	n := 0
	for n < len(b) && n < 3 && b[n]&0xC0 == 0x80 {
		n++
	}
	return n
}
