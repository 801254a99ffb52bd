package sandbox

// RunscPauses is how many of a gVisor sandbox's pauses and resumes runsc
// made, kilnd's own way not taken; -1 for another sandbox.
func RunscPauses(i Instance) int {
	if s, ok := i.(*guestSandbox); ok {
		return int(s.viaRunsc.Load())
	}
	return -1
}
