package confine

import (
	"slices"
	"strings"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	profiles "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// capNames are Caps as Docker's profile names them.
func capNames(t *testing.T) []string {
	names := map[uintptr]string{
		unix.CAP_CHOWN: "CAP_CHOWN", unix.CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", unix.CAP_FOWNER: "CAP_FOWNER",
		unix.CAP_FSETID: "CAP_FSETID", unix.CAP_KILL: "CAP_KILL", unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE",
		unix.CAP_SETFCAP: "CAP_SETFCAP", unix.CAP_SETGID: "CAP_SETGID", unix.CAP_SETPCAP: "CAP_SETPCAP",
		unix.CAP_SETUID: "CAP_SETUID", unix.CAP_SYS_CHROOT: "CAP_SYS_CHROOT",
	}
	var out []string
	for _, c := range Caps {
		n, ok := names[c]
		if !ok {
			t.Fatalf("capability %d has no name here", c)
		}
		out = append(out, n)
	}
	return out
}

// docker is Docker's default profile as it applies to a container with
// Caps on this machine: the calls it allows whatever their arguments, and
// the argument values it allows for the others, by call.
func docker(t *testing.T) (allowed map[string]bool, byValue map[string][]specs.LinuxSeccompArg) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: capNames(t)}}}
	p, err := profiles.GetDefaultProfile(spec)
	if err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != specs.ActErrno {
		t.Fatalf("Docker's default action is %s", p.DefaultAction)
	}
	allowed, byValue = map[string]bool{}, map[string][]specs.LinuxSeccompArg{}
	for _, s := range p.Syscalls {
		if s.Action != specs.ActAllow {
			continue
		}
		for _, n := range s.Names {
			if len(s.Args) == 0 {
				allowed[n] = true
			} else {
				byValue[n] = append(byValue[n], s.Args...)
			}
		}
	}
	return allowed, byValue
}

// TestPolicyWithinDockers: every call the policy allows, Docker's default
// profile allows a container with the same capabilities, with the same
// argument values or fewer; and what Docker allows that the policy does
// not is only what this architecture does not have.
func TestPolicyWithinDockers(t *testing.T) {
	allowedByDocker, byValue := docker(t)
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	p := Policy()
	ours := map[string]bool{}
	for _, g := range p.Syscalls {
		if g.Action != seccomp.ActionAllow {
			continue
		}
		for _, n := range g.Names {
			ours[n] = true
			if !allowedByDocker[n] {
				t.Errorf("%s is allowed here, not by Docker's profile", n)
			}
		}
		for _, nc := range g.NamesWithCondtions {
			docker := byValue[nc.Name]
			if len(docker) == 0 {
				t.Errorf("%s is allowed here with conditions, never by Docker's profile", nc.Name)
				continue
			}
			for _, c := range nc.Conditions {
				ok := slices.ContainsFunc(docker, func(a specs.LinuxSeccompArg) bool {
					switch c.Operation {
					case seccomp.Equal:
						return a.Index == uint(c.Argument) && a.Op == specs.OpEqualTo && a.Value == c.Value
					case seccomp.BitsNotSet: // masked equal to zero
						return a.Index == uint(c.Argument) && a.Op == specs.OpMaskedEqual && a.Value == c.Value && a.ValueTwo == 0
					}
					return false
				})
				// socket(2)'s AF_UNIX and AF_INET are under Docker's "less
				// than AF_INET6-ish" rule.
				if !ok && nc.Name == "socket" && c.Operation == seccomp.Equal {
					ok = slices.ContainsFunc(docker, func(a specs.LinuxSeccompArg) bool {
						return a.Index == 0 && a.Op == specs.OpLessThan && c.Value < a.Value
					})
				}
				if !ok {
					t.Errorf("%s with %+v is allowed here, not by Docker's profile", nc.Name, c)
				}
			}
		}
	}
	var missing []string
	for n := range allowedByDocker {
		if _, onArch := info.SyscallNames[n]; onArch && !ours[n] {
			missing = append(missing, n)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("Docker's profile allows these, the policy does not (a program using them would fail): %s", strings.Join(missing, " "))
	}
	if _, err := p.Assemble(); err != nil {
		t.Errorf("the policy does not assemble: %v", err)
	}
}
