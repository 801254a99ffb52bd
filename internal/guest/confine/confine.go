// Package confine is what stands between a sandbox's agent and every
// process it starts. Each sandbox has a spawner: kilnd's own binary, run in
// a spawn mode from a descriptor (so that nothing of it is in the
// sandbox's filesystem), in the sandbox's user namespace. Its forking
// thread is taken down, once, to a Docker container's privileges, and
// every process it forks inherits them through fork and exec:
//   - a cgroup namespace rooted at the sandbox's groups;
//   - it drops every supplementary group (and refuses to run if one stays);
//   - the rlimits: open files, processes, no core dumps;
//   - an oom_score_adj of OOMScoreAdj, set by the agent, so the kernel
//     kills sandboxed processes before kilnd and the agents, and so that
//     they cannot lower it;
//   - every capability not in Caps is dropped from the bounding, ambient,
//     inheritable, permitted and effective sets;
//   - no_new_privs, and the seccomp filter of Policy.
//
// The spawner forks with CLONE_PARENT, so every process is the agent's
// child, whose exit the agent waits for as for any other. The agent side is
// Spawner; a spawner is started on the sandbox's first process and started
// again if it dies.
//
// A resident spawner instead of a shim executed for each process: the Go
// runtime and kilnd's packages take about 4 ms to start on a 2-core
// machine, which a shim would add to every process's start.
package confine

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Env names the environment variable that makes kilnd's binary a
// sandbox's spawner; it holds the Config, as JSON.
const Env = "KILN_SPAWNER"

// The spawner's descriptors: its end of the agent's socket, then the
// tasks files of the cgroups its forking thread joins.
const (
	connFD   = 3
	groupsFD = 4
)

// Config is what a spawner applies.
type Config struct {
	// NoFile is RLIMIT_NOFILE's soft and hard limits (zero: unchanged).
	NoFile [2]uint64 `json:"nofile"`
	// NProc is RLIMIT_NPROC, soft and hard (zero: unchanged).
	NProc uint64 `json:"nproc,omitempty"`
	// Groups is how many tasks files follow the socket.
	Groups int `json:"groups,omitempty"`
}

// Caps are the capabilities a sandboxed process keeps, in the sandbox's
// user namespace: Docker's default set without CAP_NET_RAW (no raw or
// packet sockets), CAP_MKNOD and CAP_AUDIT_WRITE (neither does anything in
// a user namespace).
var Caps = []uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL,
	unix.CAP_NET_BIND_SERVICE, unix.CAP_SETFCAP, unix.CAP_SETGID, unix.CAP_SETPCAP,
	unix.CAP_SETUID, unix.CAP_SYS_CHROOT,
}

// OOMScoreAdj is every sandboxed process's oom_score_adj. The agent, which
// may, writes it for the spawner, which makes it the floor too: without
// CAP_SYS_RESOURCE in the host's user namespace no process may go below
// the value a privileged writer set.
const OOMScoreAdj = 500

// Is reports whether this process was started as a spawner.
func Is() bool { return os.Getenv(Env) != "" }

// confine joins the cgroups' tasks files with this thread and takes it
// down to a sandboxed process's privileges. The caller has locked it.
func confine(cfg Config) error {
	for i := range cfg.Groups {
		f := os.NewFile(uintptr(groupsFD+i), "tasks")
		_, err := f.Write([]byte(strconv.Itoa(unix.Gettid())))
		f.Close()
		if err != nil {
			return fmt.Errorf("confine: join the processes' cgroup: %w", err)
		}
	}
	// Its processes see the groups they are in as their cgroups' roots,
	// not the paths to them: the host's, or those of gVisor's kernel,
	// which has cgroup namespaces once its cgroup2 is mounted, as the
	// agent's is.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("confine: a cgroup namespace: %w", err)
	}
	// Nothing of the spawner is to be read through /proc by the sandbox's
	// processes; an exec makes each of them dumpable again.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: dumpable: %w", err)
	}
	// A group the agent held would be a host group, in force: drop them
	// all, and refuse to run if any stays.
	if err := unix.Setgroups(nil); err != nil {
		return fmt.Errorf("confine: drop supplementary groups: %w", err)
	}
	if gs, err := unix.Getgroups(); err != nil || len(gs) > 0 {
		return fmt.Errorf("confine: the spawner holds supplementary groups %v (%w)", gs, err)
	}
	if cfg.NoFile[1] > 0 {
		// syscall's Setrlimit, so that a fork does not restore the limit
		// the Go runtime found at start.
		if err := syscall.Setrlimit(unix.RLIMIT_NOFILE, &syscall.Rlimit{Cur: cfg.NoFile[0], Max: cfg.NoFile[1]}); err != nil {
			return fmt.Errorf("confine: open files limit: %w", err)
		}
	}
	if cfg.NProc > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: cfg.NProc, Max: cfg.NProc}); err != nil {
			return fmt.Errorf("confine: processes limit: %w", err)
		}
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("confine: core limit: %w", err)
	}
	if err := dropCaps(); err != nil {
		return err
	}
	// Both are this thread's, the one that forks.
	prog := <-assembled
	if prog.err != nil {
		return prog.err
	}
	return loadProgram(prog.insts)
}

// LoadFilter sets no_new_privs and installs Policy's filter on the calling
// thread, which the caller has locked.
func LoadFilter() error {
	insts, err := assemble()
	if err != nil {
		return err
	}
	return loadProgram(insts)
}

// assembled is Policy's program, which a spawner assembles while its
// forking thread joins its groups: that can wait for the kernel, and the
// assembly takes a good half millisecond.
var assembled = make(chan program, 1)

type program struct {
	insts []unix.SockFilter
	err   error
}

// assemble compiles Policy into a BPF program.
func assemble() ([]unix.SockFilter, error) {
	p := Policy()
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("confine: assemble the filter: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("confine: assemble the filter: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// loadProgram sets no_new_privs and installs insts as the calling
// thread's seccomp filter.
func loadProgram(insts []unix.SockFilter) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: no_new_privs: %w", err)
	}
	prog := unix.SockFprog{Len: uint16(len(insts)), Filter: &insts[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		return fmt.Errorf("confine: load the seccomp filter: %w", errno)
	}
	return nil
}

// dropCaps keeps Caps and nothing else in every capability set.
func dropCaps() error {
	var keep [2]uint32
	for _, c := range Caps {
		keep[c/32] |= 1 << (c % 32)
	}
	for c := uintptr(0); c < 64; c++ {
		if keep[c/32]&(1<<(c%32)) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			return fmt.Errorf("confine: drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: clear the ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		data[i] = unix.CapUserData{Effective: keep[i], Permitted: keep[i]}
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("confine: set capabilities: %w", err)
	}
	return nil
}

// The spawner's main goroutine keeps the main thread, so that the forking
// thread, which moves into the sandbox's groups, is never that thread: a
// v1 memory group holding the main thread would charge the spawner, and
// kill it, with the sandbox's processes.
func init() {
	if Is() {
		runtime.LockOSThread()
	}
}

// Main runs this process as a sandbox's spawner, until the agent closes
// its socket. It never returns.
func Main() {
	go func() {
		insts, err := assemble()
		assembled <- program{insts, err}
	}()
	unix.Prctl(unix.PR_SET_NAME, uintptr(unsafePointer("kiln-spawner")), 0, 0, 0) // the main thread's, as ps shows
	// Its loader is done: the agent may take the root from under it.
	if writeReply(connFD, reply{Running: true}) != nil {
		os.Exit(1)
	}
	go serve()
	select {}
}

// serve confines its thread and forks from it what the agent asks for.
func serve() {
	// Privileges are a thread's: the one confined is the one that forks,
	// and it ends with the process.
	runtime.LockOSThread()
	conn := connFD
	unix.CloseOnExec(conn)
	cfg, err := readConfig()
	if err == nil {
		err = confine(cfg)
	}
	if err != nil {
		writeReply(conn, reply{Error: err.Error()})
		os.Exit(1)
	}
	if writeReply(conn, reply{Ready: true}) != nil {
		os.Exit(1)
	}
	for {
		req, files, err := readRequest(conn)
		if err != nil {
			os.Exit(0) // the agent is gone, or spoke out of turn
		}
		writeReply(conn, spawn(req, files))
		for _, f := range files {
			unix.Close(f)
		}
	}
}

// spawn forks and executes one process as the agent's child.
func spawn(req request, files []int) reply {
	if len(files) != 3 {
		return reply{Error: fmt.Sprintf("confine: %d descriptors for a process, not 3", len(files))}
	}
	attr := &syscall.ProcAttr{
		Dir: req.Dir, Env: req.Env,
		Files: []uintptr{uintptr(files[0]), uintptr(files[1]), uintptr(files[2])},
		Sys: &syscall.SysProcAttr{
			Setsid: req.Setsid, Setctty: req.Setctty, Setpgid: req.Setpgid,
			Cloneflags: unix.CLONE_PARENT,
		},
	}
	if u := req.User; u != nil {
		// Its groups set too: none but its own unless it has more.
		attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: append([]uint32{}, u.Groups...)}
	}
	pid, err := syscall.ForkExec(req.Path, req.Args, attr)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return reply{Errno: int(errno)}
		}
		return reply{Error: err.Error()}
	}
	return reply{PID: pid}
}
