package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/url"
	"strconv"
	"time"

	"github.com/sandkiln/sandkiln/api"
)

// EventOptions choose the events Events gives; the zero value is every
// event kilnd holds, then each as it happens.
type EventOptions struct {
	// After is the Seq of the last event read: Events gives those after
	// it.
	After int64
	// Sandbox keeps one sandbox's events (by its id), Type one type's,
	// Node, in a cluster, one node's (by its name).
	Sandbox, Type, Node string
	// NoFollow ends with the events kilnd holds.
	NoFollow bool
}

// eventRetry is how long Events waits before asking again after its
// connection broke.
const eventRetry = 500 * time.Millisecond

// maxEventLine bounds one event's line.
const maxEventLine = 64 << 10

// Events gives what happens to kilnd's sandboxes, in order, each once:
// those kilnd holds after o.After, then each as it happens, until ctx
// ends (or, with o.NoFollow, the end of those held). A connection that
// breaks is opened again from the last event given, so nothing is missed
// or given twice; events kilnd no longer held come as one of type
// api.EventGap whose Lost counts them. A refusal (a bad option) ends it
// with the error; so does ctx.
func (c *Client) Events(ctx context.Context, o EventOptions) iter.Seq2[api.Event, error] {
	return func(yield func(api.Event, error) bool) {
		after, epoch := o.After, ""
		for {
			q := url.Values{"after": {strconv.FormatInt(after, 10)}}
			if epoch != "" {
				q.Set("epoch", epoch) // a kilnd started since gives its own from the first
			}
			if o.Sandbox != "" {
				q.Set("sandbox", o.Sandbox)
			}
			if o.Type != "" {
				q.Set("type", o.Type)
			}
			if o.Node != "" {
				q.Set("node", o.Node)
			}
			if o.NoFollow {
				q.Set("follow", "false")
			}
			resp, _, err := c.request(ctx, c.stream, "GET", "/events", q, nil, "")
			if err != nil {
				var e *Error
				if errors.As(err, &e) || ctx.Err() != nil {
					yield(api.Event{}, err)
					return
				}
			} else {
				lines := bufio.NewScanner(resp.Body)
				lines.Buffer(make([]byte, 4096), maxEventLine)
				for lines.Scan() {
					var e api.Event
					if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
						resp.Body.Close()
						yield(api.Event{}, fmt.Errorf("client: an event kilnd sent: %w", err))
						return
					}
					epoch, after = e.Epoch, e.Seq
					if !yield(e, nil) {
						resp.Body.Close()
						return
					}
				}
				resp.Body.Close()
				if o.NoFollow && lines.Err() == nil {
					return
				}
			}
			select {
			case <-ctx.Done():
				yield(api.Event{}, ctx.Err())
				return
			case <-time.After(eventRetry):
			}
		}
	}
}
