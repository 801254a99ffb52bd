package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/sandkiln/sandkiln/api"
)

// A cluster's nodes (kilnd --cluster) and whether kilnd is ready. Every
// node answers for the whole cluster; a kilnd in no cluster answers the
// node routes with an error IsFailedPrecondition reports.

// Nodes lists the cluster's nodes by name, each as its last heartbeat
// told: its state (api.NodeReady, api.NodeDraining, api.NodeUnreachable
// or api.NodeLost), labels, capacity and load. Self is set on the node
// that answered.
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var out []api.Node
	return out, c.call(ctx, "GET", "/nodes", nil, nil, &out, true)
}

// Node describes the cluster's node of that name; one the cluster does
// not have is an error IsNotFound reports.
func (c *Client) Node(ctx context.Context, name string) (api.Node, error) {
	var out api.Node
	return out, c.call(ctx, "GET", nodePath(name), nil, nil, &out, true)
}

// DrainNode stops placing new sandboxes on the node, as kubectl cordon
// does: its sandboxes run on and are served as before, creates go to the
// other nodes (one naming it is refused, IsFailedPrecondition). It
// returns the node, draining. Draining a drained node changes nothing,
// so a lost answer is ErrUnavailable, to be asked again.
func (c *Client) DrainNode(ctx context.Context, name string) (api.Node, error) {
	var out api.Node
	return out, c.call(ctx, "POST", nodePath(name)+"/drain", nil, nil, &out, true)
}

// DrainNodeMoving drains a node as DrainNode does and moves each of its
// stopped sandboxes to another ready node (api.DrainRequest.MoveStopped):
// the answer's Moved says where each went, or why not and which
// snapshot holds its files. It answers once every one was tried, which
// takes as long as copying their workspaces: ctx alone bounds it, not the
// client's Timeout.
func (c *Client) DrainNodeMoving(ctx context.Context, name string) (api.Node, error) {
	var out api.Node
	return out, c.callLong(ctx, "POST", nodePath(name)+"/drain", nil, api.DrainRequest{MoveStopped: true}, &out, false)
}

// UndrainNode places sandboxes on a drained node again (kubectl
// uncordon), and returns the node.
func (c *Client) UndrainNode(ctx context.Context, name string) (api.Node, error) {
	var out api.Node
	return out, c.call(ctx, "DELETE", nodePath(name)+"/drain", nil, nil, &out, true)
}

func nodePath(name string) string { return "/nodes/" + url.PathEscape(name) }

// Ready asks whether kilnd serves all it should (GET /readyz): its Status
// is "ok" when it does, else why not ("cluster down": a kilnd in a
// cluster that cannot reach it serves its own sandboxes, not the other
// nodes'), and Cluster says the node's name and the cluster's state. Not
// being ready is an answer, not an error: kilnd's 503 comes back as its
// Health, with a nil error. An error is kilnd not answering, or an answer
// that is not one of these.
func (c *Client) Ready(ctx context.Context) (api.Health, error) {
	const method, path = "GET", "/readyz"
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, sent, err := c.requestAs(ctx, c.hc, method, path, nil, nil, "", nil, func(resp *http.Response) bool {
		return resp.StatusCode >= 300 && resp.StatusCode != http.StatusServiceUnavailable
	})
	if err != nil {
		return api.Health{}, failed(ctx, method, path, sent, true, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil {
		return api.Health{}, fmt.Errorf("%w: %s %s: reading the answer: %w", ErrUnavailable, method, path, err)
	}
	var h api.Health
	if json.Unmarshal(b, &h) != nil || h.Status == "" {
		if resp.StatusCode == http.StatusServiceUnavailable {
			// Not kilnd's readiness: its error, or a proxy's.
			return api.Health{}, answerError(resp, b, method, path)
		}
		return api.Health{}, fmt.Errorf("client: %s %s: the answer is not a health report: %.100q", method, path, b)
	}
	return h, nil
}
