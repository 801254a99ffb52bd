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
