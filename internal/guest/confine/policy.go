package confine

import (
	"fmt"
	"runtime"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// allowed is every system call a sandboxed process may make whatever its
// arguments: those Docker's default profile allows a container with
// Caps, on this architecture. The calls it allows only with capabilities
// Caps leaves out (CAP_SYS_ADMIN's mount family and namespaces, bpf,
// perf_event_open, module loading, reboot, clock setting, kcmp and
// pidfd_getfd, open_by_handle_at, syslog, the NUMA policies) are not
// here, and nor are the ones it never allows (keyctl, add_key,
// request_key, userfaultfd, io_uring_*, kexec_*, the old uselib and
// nfsservctl, quotactl, …). A name the running architecture does not have
// is skipped (the 32-bit ones, socketcall, ipc).
var allowed = []string{
	// files and descriptors
	"access", "chdir", "chmod", "chown", "close", "close_range", "copy_file_range", "creat",
	"dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fallocate", "fanotify_mark",
	"fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchownat", "fcntl", "fdatasync",
	"fgetxattr", "flistxattr", "flock", "fremovexattr", "fsetxattr", "fstat", "fstatfs", "fsync",
	"ftruncate", "futimesat", "getcwd", "getdents", "getdents64", "getxattr", "getxattrat",
	"inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "lchown",
	"lgetxattr", "link", "linkat", "listxattr", "listxattrat", "llistxattr", "lremovexattr",
	"lseek", "lsetxattr", "lstat", "mkdir", "mkdirat", "mknod", "mknodat", "name_to_handle_at",
	"newfstatat", "open", "openat", "openat2", "pipe", "pipe2", "pread64", "preadv", "preadv2",
	"pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv",
	"removexattr", "removexattrat", "rename", "renameat", "renameat2", "rmdir", "sendfile",
	"setxattr", "setxattrat", "splice", "stat", "statfs", "statx", "symlink", "symlinkat", "sync",
	"sync_file_range", "syncfs", "tee", "truncate", "umask", "unlink", "unlinkat", "utime",
	"utimensat", "utimes", "vmsplice", "write", "writev", "ioctl",
	"listmount", "statmount",
	// polling, events, timers
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
	"epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "poll", "ppoll", "pselect6", "select",
	"signalfd", "signalfd4", "timerfd_create", "timerfd_gettime", "timerfd_settime",
	"timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime",
	"alarm", "getitimer", "setitimer", "nanosleep", "clock_nanosleep", "pause",
	"clock_getres", "clock_gettime", "gettimeofday", "time", "times", "adjtimex", "clock_adjtime",
	// the old asynchronous I/O (io_uring is not here)
	"io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_setup", "io_submit",
	"ioprio_get", "ioprio_set",
	// memory
	"brk", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mlock", "mlock2",
	"mlockall", "mmap", "mprotect", "mremap", "mseal", "msync", "munlock", "munlockall", "munmap",
	"pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages", "map_shadow_stack",
	"cachestat",
	// processes, threads, signals
	"execve", "execveat", "exit", "exit_group", "fork", "vfork", "wait4", "waitid", "kill",
	"tgkill", "tkill", "pidfd_open", "pidfd_send_signal", "process_mrelease", "rt_sigaction",
	"rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
	"rt_sigtimedwait", "rt_tgsigqueueinfo", "sigaltstack", "restart_syscall", "futex",
	"futex_requeue", "futex_wait", "futex_waitv", "futex_wake", "get_robust_list",
	"set_robust_list", "set_tid_address", "rseq", "arch_prctl", "modify_ldt", "prctl",
	"get_thread_area", "set_thread_area", "getcpu", "sched_getaffinity", "sched_getattr",
	"sched_getparam", "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler",
	"sched_rr_get_interval", "sched_setaffinity", "sched_setattr", "sched_setparam",
	"sched_setscheduler", "sched_yield", "getpriority", "setpriority", "seccomp", "uretprobe",
	"landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self",
	// debugging one's own processes (the kernel has checked ptrace's
	// access against seccomp since 4.8, which is why Docker allows it)
	"ptrace", "process_vm_readv", "process_vm_writev",
	"chroot", // CAP_SYS_CHROOT is in Caps
	// identity and limits
	"capget", "capset", "getegid", "geteuid", "getgid", "getgroups", "getpgid", "getpgrp",
	"getpid", "getppid", "getresgid", "getresuid", "getrlimit", "getrusage", "getsid", "gettid",
	"getuid", "prlimit64", "setfsgid", "setfsuid", "setgid", "setgroups", "setpgid", "setregid",
	"setresgid", "setresuid", "setreuid", "setrlimit", "setsid", "setuid", "sysinfo", "uname",
	"getrandom",
	// sockets (socket itself is by family, below)
	"accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen",
	"recvfrom", "recvmmsg", "recvmsg", "sendmmsg", "sendmsg", "sendto", "setsockopt", "shutdown",
	"socketpair",
	// System V IPC and POSIX queues, in the sandbox's own IPC namespace
	"msgctl", "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop", "shmat",
	"shmctl", "shmdt", "shmget", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
	"mq_timedsend", "mq_unlink",
}

// socketFamilies are the address families socket(2) may open: those
// Docker's default profile allows. AF_VSOCK (40) and AF_ALG (38) are
// among those it refuses; AF_PACKET (17) is allowed, and needs
// CAP_NET_RAW, which Caps leaves out.
var socketFamilies = []uint64{
	unix.AF_UNSPEC, unix.AF_UNIX, unix.AF_INET, unix.AF_BRIDGE, unix.AF_ATMPVC, unix.AF_X25,
	unix.AF_INET6, unix.AF_NETBEUI, unix.AF_SECURITY, unix.AF_KEY, unix.AF_NETLINK, unix.AF_PACKET,
	unix.AF_ASH, unix.AF_RDS, unix.AF_SNA, unix.AF_PPPOX, unix.AF_LLC, unix.AF_IB, unix.AF_MPLS,
	unix.AF_CAN, unix.AF_TIPC, unix.AF_BLUETOOTH, unix.AF_IUCV, unix.AF_RXRPC, unix.AF_PHONET,
	unix.AF_IEEE802154, unix.AF_NFC, unix.AF_KCM, unix.AF_QIPCRTR, unix.AF_SMC, unix.AF_XDP,
	unix.AF_MCTP,
}

// personalities are the values personality(2) may set or query: Linux's
// own, the 32-bit one, the 2.6-uname one and their mix, and the query
// (0xffffffff). ADDR_NO_RANDOMIZE and the rest are refused, as Docker's
// profile refuses them.
var personalities = []uint64{0, perLinux32, uname26, uname26 | perLinux32, 0xffffffff}

// personality(2)'s values, from linux/personality.h.
const (
	perLinux32 = 0x0008
	uname26    = 0x0020000
)

// namespaceFlags are clone's flags that make new namespaces: a clone with
// any of them is refused (CLONE_NEWTIME is only clone3's and unshare's).
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// Policy is the seccomp policy of every sandboxed process, with the
// semantics of Docker's default profile for a container with Caps: what
// is not allowed fails with EPERM, clone3 with ENOSYS (so that C
// libraries fall back to clone, whose flags a filter can see). One
// deviation is stricter: only this architecture's native calls are
// allowed, so a 32-bit x86 program does not run (its calls, the ground of
// several kernel bugs, fail with EPERM; x32's with ENOSYS).
func Policy() seccomp.Policy {
	info, err := arch.GetInfo("")
	if err != nil {
		panic(fmt.Sprintf("confine: no seccomp table for %s: %v", runtime.GOARCH, err))
	}
	var names []string
	for _, n := range allowed {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	var cond []seccomp.NameWithConditions
	for _, f := range socketFamilies {
		cond = append(cond, seccomp.NameWithConditions{Name: "socket", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.Equal, Value: f},
		}})
	}
	for _, p := range personalities {
		cond = append(cond, seccomp.NameWithConditions{Name: "personality", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.Equal, Value: p},
		}})
	}
	cond = append(cond, seccomp.NameWithConditions{Name: "clone", Conditions: seccomp.ArgumentConditions{
		{Argument: 0, // the flags, on amd64 and arm64
			Operation: seccomp.BitsNotSet, Value: namespaceFlags},
	}})
	return seccomp.Policy{
		DefaultAction: seccomp.ActionErrno, // EPERM
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionAllow, Names: names, NamesWithCondtions: cond},
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
		},
	}
}
