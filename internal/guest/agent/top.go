package agent

import (
	"bytes"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/procfs"
)

// top answers GET /top: every process of the sandbox, read from its
// /proc, by pid.
func (s *Server) top(w http.ResponseWriter, _ *http.Request) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		writeError(w, err)
		return
	}
	out := []api.TopProcess{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := topProcess(pid); ok {
			out = append(out, p)
		}
		if len(out) == api.MaxTopProcesses {
			break
		}
	}
	slices.SortFunc(out, func(a, b api.TopProcess) int { return a.PID - b.PID })
	writeJSON(w, http.StatusOK, out)
}

// clockTicks is the unit of /proc's times (USER_HZ, 100 on Linux).
const clockTicks = 100

// topProcess reads process pid's row; false once it is gone.
func topProcess(pid int) (api.TopProcess, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	name, f, err := procfs.Stat(pid)
	if err != nil || len(f) < 22 {
		return api.TopProcess{}, false
	}
	p := api.TopProcess{PID: pid, State: f[0]}
	p.PPID, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	p.CPUSeconds = (utime + stime) / clockTicks
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	p.RSSBytes = rss * int64(unix.Getpagesize())
	// /proc/PID is owned by the process's effective user.
	if st, err := os.Stat(dir); err == nil {
		if sys, ok := st.Sys().(*unix.Stat_t); ok {
			p.UID = int(sys.Uid)
		}
	}
	cmdline, _ := os.ReadFile(dir + "/cmdline")
	cmdline = bytes.TrimRight(cmdline, "\x00")
	if len(cmdline) == 0 {
		p.Command = "[" + name + "]"
	} else {
		p.Command = string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
	}
	if len(p.Command) > api.MaxTopCommand {
		p.Command = strings.ToValidUTF8(p.Command[:api.MaxTopCommand], "") + "…"
	}
	return p, true
}
