package daemon

import "github.com/sandkiln/sandkiln/internal/sandbox"

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

// FreezeDisk freezes sandbox id's disk as a snapshot does, and leaves it
// frozen: a kilnd that stops then has left it so.
func (d *Daemon) FreezeDisk(id string) error {
	d.mu.Lock()
	e := d.sandboxes[id]
	d.mu.Unlock()
	_, err := sandbox.FreezeDisk(e.sb, e.rec.Disk)
	return err
}
