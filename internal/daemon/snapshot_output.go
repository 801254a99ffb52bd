// The output of a snapshot's processes: a memory snapshot holds their
// captured runs at its offsets, which the sandbox taken goes on with and
// each sandbox made from it continues in runs of its own.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// runsRetry bounds how long kilnd tries to tell an agent whose memory was
// just saved to release its runs: the save closed its connections, which
// it makes again at once.
const runsRetry = 10 * time.Second

// holdRuns has the agent behind t hold its processes' captured runs where
// their output stands (see capture.Writer.Hold), before their memory is
// saved, and returns its processes, each captured one at where its run is
// held: the snapshot's offsets of it. held is false for an agent older
// than held runs, which is asked for its processes alone.
func holdRuns(ctx context.Context, t http.RoundTripper) (procs []api.Process, held bool, err error) {
	hctx, cancel := context.WithTimeout(ctx, agentListTimeout)
	defer cancel()
	err = agentJSON(hctx, t, "POST", "/capture/hold", &procs)
	if errors.Is(err, errdefs.ErrNotFound) {
		return procs, false, askAgent(ctx, t, "/exec-stream", &procs)
	}
	return procs, err == nil, err
}

// releaseRuns lets the runs holdRuns held go on in sandbox id, whose
// memory has been saved (or not: the snapshot failed), trying again while
// its agent makes its connections again after the save. A release that
// never gets through costs the runs their hold's time (capture's
// HoldTimeout), not their capture.
func (d *Daemon) releaseRuns(t http.RoundTripper, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), runsRetry)
	defer cancel()
	for {
		err := agentJSON(ctx, t, "POST", "/capture/release", nil)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			d.log.Warn("a memory snapshot's held capture runs were not released: they go on once their hold runs out", "sandbox", id, "err", err)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// continueRuns has the agent behind t, of a sandbox restored from a memory
// snapshot, continue each run its snapshot held in a new run whose begin
// names it, and returns once every begin is durable. An agent older than
// held runs held none.
func continueRuns(ctx context.Context, t http.RoundTripper) error {
	err := agentJSON(ctx, t, "POST", "/capture/continue", nil)
	if err == nil || errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return fmt.Errorf("%w: its processes' captured runs could not be continued: %w", errdefs.ErrUnavailable, err)
}
