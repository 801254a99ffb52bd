package main

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// suite is a test binary the guest runs, and which of its tests.
type suite struct {
	Name, Package, Run string
	Timeout            time.Duration
}

// suites are the v2 set: what depends on how a sandbox's cgroups are made
// (kilnd's refusal without delegated controllers, limits, out-of-memory
// kills, the cgroup namespace its processes see, a spawner killed and
// started again) and the daemon's lifecycle (create,
// delete, restart, an agent killed, leftovers ended, limits per sandbox).
// Only the namespace backend's subtests: gVisor's runsc, which the host
// may share with the guest, takes half a minute per sandbox under TCG and
// puts itself in the groups kilnd makes, which these tests cover already.
// Bounded so that the run stays within a few minutes of TCG.
var suites = []suite{
	{Name: "sandbox", Package: "./internal/sandbox", Timeout: 5 * time.Minute,
		Run: "^(TestMissingControllers|TestRefusedWithoutDelegation|TestLimits|TestCPULimit|TestOutOfMemoryNeverKillsTheAgent|TestOutOfMemoryEndsTheSandbox|TestPidsLimitCountsTheSandboxsOwn|TestStatsThisHost|TestTmpfsWithinTheMemoryLimit|TestSpawnerKilled|TestSpawnerStopsWhenIdle|TestProbes|TestIsolation|TestPause)$/^(namespaces|watched|unwatched)$"},
	{Name: "daemon", Package: "./internal/daemon", Timeout: 6 * time.Minute,
		Run: "^(TestDeleteKeepsCapturedLogs|TestInitCommandEndsTheSandbox|TestAgentKilled|TestUnrecordedSandboxIsEnded|TestRestartWithoutLoss|TestKill9MidStream|TestLimitsSpareOtherSandboxes)$"},
}

// modules are the kernel modules the guest loads, in order (Debian's
// kernel has them as modules: virtio_ring before virtio): the virtio-mmio
// transport of QEMU's microvm, the serial port the results go out on, and
// 9p for the host's system directories.
var modules = []string{
	"drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_mmio",
	"drivers/char/virtio_console", "fs/netfs/netfs", "fs/fscache/fscache", "net/9p/9pnet", "net/9p/9pnet_virtio", "fs/9p/9p",
}

// resultsPort names the virtio-serial port the guest writes its report to.
const resultsPort = "kiln.results"

// initScript is the guest's /init: it loads the modules, builds a tmpfs
// root (pivot_root, which every sandbox does, refuses the initramfs) with
// the host's system directories bound read-only from 9p, and switches to
// it to run stage2.
const initScript = `#!/v2vm/busybox sh
B=/v2vm/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in $(cat /v2vm/modules.list); do
	$B insmod /v2vm/modules/$m.ko || echo "v2vm: insmod $m failed"
done
$B mount -t tmpfs -o mode=0755 root /newroot
$B mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run /newroot/host /newroot/v2vm
$B cp -a /v2vm/. /newroot/v2vm/
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose host /newroot/host || echo "v2vm: no host directories"
for d in usr etc bin sbin lib lib32 lib64 libx32; do
	if [ -L /newroot/host/$d ]; then
		$B ln -s "$($B readlink /newroot/host/$d)" /newroot/$d
	elif [ -d /newroot/host/$d ]; then
		$B mkdir /newroot/$d && $B mount --bind /newroot/host/$d /newroot/$d
	fi
done
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount --move /dev /newroot/dev
exec $B switch_root /newroot /v2vm/busybox sh /v2vm/stage2
`

// stage2Script mounts what a host has (cgroup2 alone at /sys/fs/cgroup,
// as systemd does, with nsdelegate), runs each suite with its output on
// the results port, one "v2vm-exit NAME STATUS" line after each and
// "v2vm-end" last, and powers off.
const stage2Script = `B=/v2vm/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8
$B mount -t tmpfs -o mode=1777 tmp /tmp
$B mount -t tmpfs -o mode=0755 run /run
$B mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
$B mount -t tmpfs -o mode=1777 shm /dev/shm
$B ip link set lo up
out=/dev/console
for p in /sys/class/virtio-ports/*; do
	[ "$($B cat $p/name 2>/dev/null)" = "` + resultsPort + `" ] && out=/dev/$($B basename $p)
done
{
	echo "v2vm-up $($B cut -d' ' -f1 /proc/uptime)"
	echo "v2vm: kernel $($B uname -r), $($B cat /proc/cmdline)"
	echo "v2vm: cgroup controllers: $($B cat /sys/fs/cgroup/cgroup.controllers)"
	echo "v2vm: mounted cgroup hierarchies: $($B grep -c cgroup /proc/mounts)"
	while read name timeout run; do
		echo "v2vm-run $name"
		cd /tmp
		/v2vm/$name.test -test.v -test.count=1 -test.timeout=$timeout -test.run "$run" </dev/null 2>&1
		echo "v2vm-exit $name $?"
	done </v2vm/suites.list
	echo "v2vm-end $($B cut -d' ' -f1 /proc/uptime)"
} >$out 2>&1
$B sync
$B poweroff -f
`

// buildInitramfs writes the guest's initramfs to path: busybox, the
// modules, the test binaries (built static), the scripts. run, when set,
// replaces each suite's test selection.
func buildInitramfs(ctx context.Context, k kernel, path, run string) error {
	bb, err := staticBusybox()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(path), "tests-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var list strings.Builder
	for _, s := range suites {
		out := filepath.Join(tmp, s.Name+".test")
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", out, s.Package)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build %s's tests: %w", s.Package, err)
		}
		sel := s.Run
		if run != "" {
			sel = run
		}
		fmt.Fprintf(&list, "%s %s %s\n", s.Name, s.Timeout, sel)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := newCPIO(bufio.NewWriterSize(f, 1<<20))
	for _, d := range []string{"dev", "proc", "sys", "tmp", "newroot", "v2vm", "v2vm/modules"} {
		w.Dir(d, 0o755)
	}
	w.CharDev("dev/console", 0o600, 5, 1)
	w.File("init", 0o755, strings.NewReader(initScript))
	w.File("v2vm/stage2", 0o644, strings.NewReader(stage2Script))
	w.File("v2vm/suites.list", 0o644, strings.NewReader(list.String()))
	var names []string
	for _, m := range modules {
		names = append(names, filepath.Base(m))
	}
	w.File("v2vm/modules.list", 0o644, strings.NewReader(strings.Join(names, "\n")+"\n"))
	add := func(name, src string, mode uint32) {
		in, err := os.Open(src)
		if err != nil {
			w.fail(err)
			return
		}
		defer in.Close()
		w.File(name, mode, in)
	}
	add("v2vm/busybox", bb, 0o755)
	for _, m := range modules {
		add("v2vm/modules/"+filepath.Base(m)+".ko", filepath.Join(k.Modules, "kernel", m+".ko"), 0o644)
	}
	for _, s := range suites {
		add("v2vm/"+s.Name+".test", filepath.Join(tmp, s.Name+".test"), 0o755)
	}
	if err := w.Close(); err != nil {
		f.Close()
		return fmt.Errorf("initramfs: %w", err)
	}
	return f.Close()
}

// staticBusybox finds a busybox linked statically (Debian's
// busybox-static), which runs before any library is there.
func staticBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return p, nil
		}
	}
	return "", fmt.Errorf("no static busybox (Debian's busybox-static) in /bin or /usr/bin")
}
