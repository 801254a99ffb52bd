// Package guest is what runs inside a sandbox as its first process, the
// agent, before it serves: it builds the sandbox's root and moves into it
// (or, in a runtime's container, takes what the runtime built), names the
// host, brings the loopback up, hides itself from the sandbox's processes,
// and starts the spawner that confines each of them. It knows kilnd only
// through package handoff.
package guest
