package client

// What the conformance suite watches of a handle's state, to know when
// concurrent calls have reached the point it tests (a bounded poll of
// real state, never a sleep).

// InputQueued is how many Write calls wait for their turn or send.
func InputQueued(p *Process) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queued
}

// Reading reports whether an Output of p reads.
func Reading(p *Process) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reading && p.conn != nil
}

// PendingCalls is how many calls of p are in progress.
func PendingCalls(p *Process) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// TerminateWaiters is how many Terminate calls wait for the request on
// its way.
func TerminateWaiters(p *Process) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiters
}
