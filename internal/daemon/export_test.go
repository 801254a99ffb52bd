package daemon

// SettleDisks waits for the spare disks kilnd makes in the background to
// be made, so that a test counting descriptors starts from what stays.
func (d *Daemon) SettleDisks() {
	if d.disks != nil {
		d.disks.Settle()
	}
}
