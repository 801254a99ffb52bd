// Package handoff is the contract between kilnd and a sandbox's first
// process, its agent: the configuration the agent is started with, the
// descriptors (or, in a runtime's container, the paths) it finds its
// handles at, and what it leaves behind for kilnd to read (the init
// command's exit). kilnd's side is package sandbox, the agent's package
// guest; neither imports the other, both import this.
package handoff

import (
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandkiln/sandkiln/api"
)

// AgentConfig is what the re-executed binary needs to become a sandbox's
// agent. It travels in the environment variable AgentEnv, as JSON.
type AgentConfig struct {
	ID       string `json:"id"`
	Hostname string `json:"hostname"`
	// Root is an empty host directory the sandbox's root is built on (in
	// the agent's own mount namespace; the host never sees the mounts).
	Root string `json:"root"`
	// Workspace is the host directory mounted writable at /workspace.
	Workspace string `json:"workspace"`
	// Disk, when set, is where the agent mounts FDDisk, in its own mount
	// namespace, before it reads Workspace, Upper and Work, which are on it.
	Disk string `json:"disk,omitempty"`
	// Rootfs, when set, is a root filesystem directory used (read-only,
	// with a writable layer in Upper and Work) instead of the host's.
	Rootfs string `json:"rootfs,omitempty"`
	// Layers are its layers' host directories, the top one first, and
	// Lowers where the agent mounts each, id-mapped by the sandbox's user
	// namespace (its spawner's).
	Layers []string `json:"layers,omitempty"`
	Lowers []string `json:"lowers,omitempty"`
	Upper  string   `json:"upper,omitempty"`
	Work   string   `json:"work,omitempty"`
	// UIDBase is the host uid (and gid) the sandbox's root maps to.
	UIDBase int `json:"uid_base"`
	// Env is the processes' base environment; Dir their default working
	// directory (empty: /workspace); Entrypoint and Cmd what one of no
	// command of its own runs (api.ImageConfig.Command).
	Env        []string `json:"env"`
	Dir        string   `json:"dir,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	User       string   `json:"user,omitempty"` // who a process of no user runs as
	// PidsLimited says FDTasks is passed: the processes' pids group.
	PidsLimited bool `json:"pids_limited,omitempty"`
	// MemoryLimited says FDMemoryTasks is passed: their memory group.
	MemoryLimited bool `json:"memory_limited,omitempty"`
	// ProcsCgroup says FDProcsCgroup is passed: the sandbox's v2 procs
	// group's cgroup.procs, which its spawner joins.
	ProcsCgroup bool `json:"procs_cgroup,omitempty"`
	// PidsThreads says FDPidsThreads is passed: the cgroup.threads of the
	// threaded group below the v2 procs group that holds the pids limit
	// on a pure v2 host, which its spawner's forking thread joins.
	PidsThreads bool `json:"pids_threads,omitempty"`
	// OOMEvents says FDOOMEvents is passed.
	OOMEvents bool `json:"oom_events,omitempty"`
	// CPULimited says FDCPUTasks and FDCPUProcs are passed: the sandbox's
	// v1 cpu group, which the agent joins, and the one below it, of the
	// processes' limit, which its spawner's forking thread joins.
	CPULimited bool `json:"cpu_limited,omitempty"`
	// Init, when set, is the sandbox's init command: the agent starts it
	// (captured) first, and its exit ends the sandbox.
	Init *api.ExecRequest `json:"init,omitempty"`
	// CaptureQueue bounds each captured process's queue to its log writer,
	// in bytes (zero: the default).
	CaptureQueue int64 `json:"capture_queue,omitempty"`
	// CaptureMaxSize and CaptureMaxFiles rotate each captured process's
	// log (zero: the defaults).
	CaptureMaxSize  int64 `json:"capture_max_size,omitempty"`
	CaptureMaxFiles int   `json:"capture_max_files,omitempty"`
	// FlowGrace is how long a flow block process's output waits for its
	// holding watcher (zero: the default).
	FlowGrace time.Duration `json:"flow_grace,omitempty"`
	// SpawnerIdle is how long the sandbox's spawner stays once it has
	// started nothing and nothing of the sandbox runs (zero:
	// DefaultSpawnerIdle; negative: it stays).
	SpawnerIdle time.Duration `json:"spawner_idle,omitempty"`
	// MadeAhead says the sandbox is made ahead of its create: its
	// spawner's idle time counts from the first process it starts, so
	// that the create that takes it finds it ready.
	MadeAhead bool `json:"made_ahead,omitempty"`
	// PidsMax is the sandbox's pids limit, zero without one; each process
	// also gets it as its RLIMIT_NPROC.
	PidsMax int64 `json:"pids_max,omitempty"`
	// TmpfsBytes sizes /tmp and /root, the sandbox's memory limit: what is
	// written there is memory (zero: the kernel's default, half the RAM).
	TmpfsBytes int64 `json:"tmpfs_bytes,omitempty"`
	// Network says FDNetwork is passed: the sandbox has a network beyond
	// its loopback, which kilnd connects while the agent starts; Resolvers
	// are the name servers of its resolv.conf.
	Network   bool     `json:"network,omitempty"`
	Resolvers []string `json:"resolvers,omitempty"`
	// Mounts are the caller's host directories, in the order kilnd hands
	// their detached mounts over (FDMounts on, one each), with the
	// attributes they keep (read-only, nosuid, nodev) set already.
	Mounts []Mount `json:"mounts,omitempty"`
	// Guest, when set, names the runtime that made the agent its
	// container's init and built its root (RuntimeGVisor): the agent then
	// finds its handles in GuestDir instead of inherited descriptors.
	Guest string `json:"guest,omitempty"`
}

// Mount is one of a sandbox's bind mounts, as its agent makes it: the
// directory kilnd handed over, at Target in the sandbox's root (an
// absolute, clean path kilnd checked; symbolic links on the way resolve
// within the root, and what is missing of it is made, the sandbox's
// root's).
type Mount struct {
	Target string `json:"target"`
}

// InitExitName is the file in a sandbox's logs directory where the agent
// records its init command's exit, durably, before the sandbox ends.
const InitExitName = "init.json"

// InitExit is the content of InitExitName.
type InitExit struct {
	Process  string    `json:"process"`
	ExitedAt time.Time `json:"exited_at"`
	api.Exit
}

// AgentEnv names the environment variable that makes kilnd's binary run as
// a sandbox's agent.
const AgentEnv = "KILN_AGENT_CONFIG"

// The agent's inherited descriptors, in order after stdio.
const (
	FDListener = 3 // the unix socket kilnd serves the agent's API through
	FDLogs     = 4 // the sandbox's capture directory on the host
	FDTasks    = 5 // the v1 pids group's tasks file, when pids are limited
	// (Descriptor 6 was once the rootfs as a detached, id-mapped mount:
	// the agent now makes that mount itself.)
	// FDMemoryTasks is the v1 memory group's tasks file, when memory is
	// limited.
	FDMemoryTasks = 7
	// FDCPUTasks is the tasks file of the v1 cpu group that holds the
	// processes' limit, when CPU is limited.
	// (Descriptor 8 was once a pipe kilnd wrote to once it had moved the
	// agent into its v1 groups: an agent reads it as the tasks file only
	// when its config says CPULimited, which such a kilnd never does.)
	FDCPUTasks = 8
	// FDOOMEvents is the file counting out-of-memory kills in the limited
	// memory group, when memory is limited.
	FDOOMEvents = 9
	// FDDisk is the detached mount of the sandbox's disk, when it has one.
	FDDisk = 10
	// FDCPUProcs is the v1 cpu group's cgroup.procs file, when CPU is
	// limited.
	FDCPUProcs = 11
	// FDNetwork is the pipe the agent waits on for kilnd to connect its
	// network, when it has one: a byte, or nothing if that failed.
	FDNetwork = 12
	// FDProcsCgroup is the sandbox's v2 procs group's cgroup.procs: the
	// spawner moves into it, and every process it starts is born there.
	FDProcsCgroup = 13
	// FDPidsThreads is the cgroup.threads file of the v2 pids group below
	// procs, when pids are limited on a pure v2 host.
	FDPidsThreads = 14
	FDLast        = FDPidsThreads
	// FDMounts is the first of the detached mounts of the caller's
	// directories (AgentConfig.Mounts), one descriptor each, in order,
	// after FDLast.
	FDMounts = FDLast + 1
)

// IDRange is how many uids a sandbox maps.
const IDRange = 65536

// DefaultSpawnerIdle is how long a sandbox's spawner outlasts its last
// process: an idle sandbox then costs its agent alone, about half as much
// memory and threads, and the process that wakes it waits for a new
// spawner, a few milliseconds.
const DefaultSpawnerIdle = 5 * time.Second

// GuestDir is where, in a container a runtime built, the agent finds its
// handles: its binary, the capture directory and the directory of kilnd's
// socket it connects to, each mounted there from the host. The agent
// takes them and hides them before any sandboxed process starts.
const GuestDir = "/.kiln"

// Names in GuestDir (and guestAgentName).
const (
	GuestLogs = "logs"
	GuestSock = "sock"
)

// GuestUsage is what a runtime's own kernel (gVisor's) counts of a
// sandbox's processes, the agent apart: the figures the namespace
// backend's procs groups keep on the host, where a gVisor sandbox's
// groups hold its kernel, its file server and their threads as well.
type GuestUsage struct {
	// Pids counts the tasks (threads included) of the sandbox's
	// processes, its spawner's among them.
	Pids int64 `json:"pids"`
	// MemoryBytes is the memory they use: their own, their files in
	// memory (/tmp, /dev/shm) and the page cache they caused.
	MemoryBytes int64 `json:"memory_bytes"`
}

// UsagePath is the agent's route (GET) answering GuestUsage, kilnd's
// alone: it is not forwarded from kilnd's API.
const UsagePath = "/usage"

// RetainedPath is the agent's route (GET RetainedPath + a process id or
// its prefix) answering Retained, kilnd's alone: it is not forwarded from
// kilnd's API.
const RetainedPath = "/retained/"

// Retained is what of a process's output its agent holds now: each
// stream's retained span (its ring's, or its captured log's where that
// holds older bytes), as a watcher attaching now would be told in its
// hello. Process is the process's whole id; Exited says it had exited
// (a watcher is then sent its streams' ends and exit after its output).
type Retained struct {
	Process string                   `json:"process"`
	Streams map[string]api.HelloSpan `json:"streams"`
	Exited  bool                     `json:"exited,omitempty"`
}

// EventIn reads the counter key from an events file's content.
func EventIn(b []byte, key string) int64 {
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// SocketName is the name of the socket of the agent's API: in the
// sandbox's directory on the host, the one the agent serves on; in a
// runtime's container, in GuestSock, the one kilnd listens on, which the
// agent connects to, keeping a few connections open for kilnd's requests
// and making them again whenever they end (kilnd restarted, or the
// sandbox saved: a bound socket would keep gVisor from saving it).
const SocketName = "agent.sock"

// ReconnectSignal, sent to the agent of a runtime's container, has it
// make again those of its connections to kilnd that are closed. kilnd
// sends it once gVisor has saved a sandbox that goes on running: the save
// closes them, and gVisor wakes nothing that waits on them (it does, in a
// sandbox restored from the image).
const ReconnectSignal = syscall.SIGUSR2
