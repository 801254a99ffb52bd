package files

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// The test binary is also the helper: the server starts /proc/self/exe.
func TestMain(m *testing.M) {
	if Is() {
		Main()
	}
	goleak.VerifyTestMain(m)
}

// agent is a Server as a sandbox's agent runs it, its helpers this test
// binary (host root here, on the test's directories), served two ways on
// loopback: directly (the agent writes an upload's body itself, as for a
// gVisor sandbox), and as kilnd serves it, through a handover from the
// agent on a unix socket (kilnd writes the body). Both servers time a
// request out after readTimeout, as kilnd does.
type agent struct {
	direct, handover *httptest.Server
}

// readTimeout is the test servers' read timeout: short, for the tests of
// a client that stops sending.
const readTimeout = 2 * time.Second

// ways are the two ways of an agent, for table tests.
var ways = []string{"direct", "handover"}

func newAgent(t *testing.T) *agent {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the helper keeps a file's owner: needs root")
	}
	s := &Server{Launch: func(cmd *exec.Cmd) (*os.Process, error) {
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return cmd.Process, nil
	}}
	m := http.NewServeMux()
	s.Register(m)
	// Every handler is waited for, a hijacked one (a handover) too.
	var handlers sync.WaitGroup
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		m.ServeHTTP(w, r)
	})
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	onSocket := &http.Server{Handler: h}
	served := make(chan struct{})
	go func() {
		defer close(served)
		onSocket.Serve(l)
	}()
	a := &agent{
		direct:   httptest.NewUnstartedServer(h),
		handover: httptest.NewUnstartedServer(kilndOf(sock)),
	}
	for _, srv := range []*httptest.Server{a.direct, a.handover} {
		srv.Config.ReadTimeout = readTimeout
		srv.Start()
	}
	t.Cleanup(func() {
		a.direct.Close()
		a.handover.Close()
		onSocket.Close()
		<-served
		handlers.Wait()
	})
	return a
}

// kilndOf serves PUT and GET /files/{path...} as kilnd does, with the
// file the agent on sock hands over.
func kilndOf(sock string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/files/")
		if !ok || (r.Method != http.MethodPut && r.Method != http.MethodGet) {
			http.Error(w, "not routed in this test", http.StatusNotFound)
			return
		}
		conn, err := net.Dial("unix", sock)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		h, resp, err := Handover(conn.(*net.UnixConn), r, rest, "")
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if resp != nil {
			defer resp.Body.Close()
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
			return
		}
		defer h.Close()
		if r.Method == http.MethodGet {
			Serve(w, r, h.File(), h.Entry)
			return
		}
		Write(w, r.Body, "/"+rest, h)
	})
}

// url is the way's URL of route (which starts with a slash).
func (a *agent) url(way, route string) string {
	if way == "handover" {
		return a.handover.URL + route
	}
	return a.direct.URL + route
}

// addr is the way's server's address.
func (a *agent) addr(way string) string {
	if way == "handover" {
		return a.handover.Listener.Addr().String()
	}
	return a.direct.Listener.Addr().String()
}

// do sends a request and returns the answer's status and body.
func do(t *testing.T, method, url string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rawPut starts a PUT of route on addr that announces length bytes of
// body and sends the first part of it, and returns the connection.
func rawPut(t *testing.T, addr, route string, length int, part []byte) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := "PUT " + route + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Length: " + strconv.Itoa(length) + "\r\n\r\n"
	if _, err := c.Write(append([]byte(head), part...)); err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// readAnswer reads the answer to a request sent on c.
func readAnswer(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// message is the message of an error's JSON body, or the body.
func message(body string) string {
	var e api.Error
	if json.Unmarshal([]byte(body), &e) != nil || e.Error.Message == "" {
		return body
	}
	return e.Error.Message
}

// names lists dir's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, e := range ents {
		ns = append(ns, e.Name())
	}
	slices.Sort(ns)
	return ns
}

// dirEvents are the inotify events of a directory's entries: the test's
// own view of what the helper does there, so that it waits on events
// and not on time.
type dirEvents struct {
	f  *os.File
	ch chan dirEvent
}

type dirEvent struct {
	mask uint32
	name string
}

// watchDir starts reporting dir's events, until the test ends.
func watchDir(t *testing.T, dir string) *dirEvents {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MODIFY|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	d := &dirEvents{f: os.NewFile(uintptr(fd), "inotify"), ch: make(chan dirEvent, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(d.ch)
		buf := make([]byte, 64<<10)
		for {
			n, err := d.f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				l := int(ev.Len)
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+l]), "\x00")
				off += unix.SizeofInotifyEvent + l
				select {
				case d.ch <- dirEvent{ev.Mask, name}:
				default: // the test stopped listening
				}
			}
		}
	}()
	t.Cleanup(func() {
		d.f.Close()
		<-done
	})
	return d
}

// waitFor waits for an event with a bit of mask whose name matches, and
// returns the name.
func (d *dirEvents) waitFor(t *testing.T, mask uint32, match func(string) bool) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-d.ch:
			if !ok {
				t.Fatal("the directory's events ended")
			}
			if ev.mask&mask != 0 && match(ev.name) {
				return ev.name
			}
		case <-timeout:
			t.Fatalf("no event %#x came in 30 s", mask)
		}
	}
}

func isTemp(name string) bool { return strings.HasPrefix(name, tempPrefix) }

// owner is a file's owner, group and permission, as stat prints them.
func owner(t *testing.T, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d %04o", st.Uid, st.Gid, st.Mode&0o7777)
}

// mountSmall mounts a tmpfs of size bytes on a new directory, for a
// full disk, until the test ends.
func mountSmall(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.Itoa(size)); err != nil {
		t.Skipf("a small file system for a full disk: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
