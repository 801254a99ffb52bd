package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// user is a process's user as the sandbox names it, resolved.
type user struct {
	cred *syscall.Credential
	home string // from /etc/passwd, if the user is there
}

// maxAccountFile bounds what is read of /etc/passwd and /etc/group.
const maxAccountFile = 4 << 20

// lookupUser resolves spec ("name", "uid", "name:group", "uid:gid"), as
// docker run --user does, in the sandbox's /etc/passwd and /etc/group: a
// user's primary group unless one is given, and the groups that list it.
// A number needs no entry.
func lookupUser(spec string) (user, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" || hasGroup && group == "" {
		return user{}, fmt.Errorf("%w: user %q: want NAME, UID, NAME:GROUP or UID:GID", errdefs.ErrInvalidArgument, api.Clip(spec))
	}
	passwd, err := readAccounts("/etc/passwd")
	if err != nil {
		return user{}, err
	}
	var u user
	cred := &syscall.Credential{Groups: []uint32{}}
	entry, found := findEntry(passwd, name, 2)
	switch {
	case found:
		uid, err1 := parseID(entry[2])
		gid, err2 := parseID(entry[3])
		if err1 != nil || err2 != nil {
			return user{}, fmt.Errorf("%w: user %q: its /etc/passwd entry is malformed", errdefs.ErrInvalidArgument, api.Clip(name))
		}
		cred.Uid, cred.Gid = uid, gid
		if len(entry) > 5 {
			u.home = entry[5]
		}
	default:
		uid, err := parseID(name)
		if err != nil {
			return user{}, fmt.Errorf("%w: user %q: no such user in the sandbox's /etc/passwd", errdefs.ErrInvalidArgument, api.Clip(name))
		}
		cred.Uid, cred.Gid = uid, uid
	}
	groups, err := readAccounts("/etc/group")
	if err != nil {
		return user{}, err
	}
	if hasGroup {
		if g, ok := findEntry(groups, group, 2); ok {
			gid, err := parseID(g[2])
			if err != nil {
				return user{}, fmt.Errorf("%w: group %q: its /etc/group entry is malformed", errdefs.ErrInvalidArgument, api.Clip(group))
			}
			cred.Gid = gid
		} else if gid, err := parseID(group); err == nil {
			cred.Gid = gid
		} else {
			return user{}, fmt.Errorf("%w: group %q: no such group in the sandbox's /etc/group", errdefs.ErrInvalidArgument, api.Clip(group))
		}
	}
	// The groups that name the user as a member, when it has a name.
	if found {
		for _, g := range groups {
			if len(g) < 4 {
				continue
			}
			for _, m := range strings.Split(g[3], ",") {
				if m == entry[0] {
					if gid, err := parseID(g[2]); err == nil && gid != cred.Gid {
						cred.Groups = append(cred.Groups, gid)
					}
				}
			}
		}
	}
	u.cred = cred
	return u, nil
}

// parseID reads a uid or gid below the sandbox's range of 65,536 ids.
func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n >= 65536 {
		return 0, fmt.Errorf("id %q", s)
	}
	return uint32(n), nil
}

// findEntry is the entry of accounts whose first field is name, or whose
// field idField (a uid or gid) is name when it is a number.
func findEntry(accounts [][]string, name string, idField int) ([]string, bool) {
	for _, e := range accounts {
		if len(e) > 3 && e[0] == name {
			return e, true
		}
	}
	if _, err := parseID(name); err == nil {
		for _, e := range accounts {
			if len(e) > 3 && e[idField] == name {
				return e, true
			}
		}
	}
	return nil, false
}

// readAccounts reads a passwd- or group-style file of the sandbox's (none
// if it has none), the sandbox's to write: it must be a regular file reached by no symbolic
// link, and not on a kernel filesystem (whose files could be the agent's
// own), and what is used of it is numbers and names only.
func readAccounts(path string) ([][]string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no names: numbers only
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errdefs.ErrInvalidArgument, path, err)
	}
	defer f.Close()
	var st unix.Stat_t
	var fs unix.Statfs_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		unix.Fstatfs(int(f.Fd()), &fs) != nil || fs.Type == unix.PROC_SUPER_MAGIC || fs.Type == unix.SYSFS_MAGIC {
		return nil, fmt.Errorf("%w: %s is not a regular file of the sandbox's", errdefs.ErrInvalidArgument, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxAccountFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errdefs.ErrInvalidArgument, path, err)
	}
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, maxAccountFile)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out, nil
}
