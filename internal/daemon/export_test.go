package daemon

// SettleDisks waits for the spare disks kilnd makes in the background to
// be made, so that a test counting descriptors starts from what stays.
func (d *Daemon) SettleDisks() {
	if d.disks != nil {
		d.disks.Settle()
	}
}

// Unfinished is closed once sandbox id's deletion, handed to the finisher
// after its delete could not finish it, is finished; nil when no deletion
// of it is handed to the finisher.
func (d *Daemon) Unfinished(id string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if del := d.unfinished[id]; del != nil {
		return del.done
	}
	return nil
}

// MadeAhead are the sandboxes of runtime made ahead: their ids to their
// agents' pids.
func (d *Daemon) MadeAhead(runtime string) map[string]int {
	d.warm.mu.Lock()
	defer d.warm.mu.Unlock()
	out := map[string]int{}
	for _, w := range d.warm.ready[runtime] {
		out[w.rec.ID] = w.sb.AgentPID()
	}
	return out
}
