// Package procfs reads what the kernel's /proc says of a process, for the
// host's side and the guest's alike.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat reads /proc/PID/stat: the process's name (its comm) and the fields
// that follow it, from its state (the stat's third field, Fields[0]) on.
// The name is in parentheses and may hold anything, spaces and ')' too:
// the fields start after the last ')'.
func Stat(pid int) (name string, fields []string, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", nil, err
	}
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", nil, fmt.Errorf("procfs: malformed stat of %d", pid)
	}
	return string(b[open+1 : end]), strings.Fields(string(b[end+1:])), nil
}
