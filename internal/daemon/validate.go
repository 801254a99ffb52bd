package daemon

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// A create request is checked whole, against the ranges the API documents
// (package api's constants and this host's CPUs and memory), before
// anything is made: a value out of its range is refused with 400
// invalid_argument naming the field (as the JSON spells it), the range and
// the value, and never reaches a cgroup file whose write would refuse it
// in the kernel's words.

// host is what this host has: the upper ends of the ranges that are the
// host's. Read once; neither changes under a running kilnd but by a
// hot-plug, which a restart takes in.
var host = sync.OnceValue(func() hostLimits {
	h := hostLimits{cpus: runtime.NumCPU()}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		h.memory = int64(si.Totalram) * int64(si.Unit)
	}
	return h
})

type hostLimits struct {
	cpus   int   // the CPUs kilnd may run on (its affinity)
	memory int64 // bytes of RAM; 0 if unknown
}

// ValidateLimits checks limits: each zero (none) or within its range,
// cpus and memory within this host's. Errors are invalid arguments naming
// the field, after prefix ("limits." in a create request).
func ValidateLimits(l api.Limits, prefix string) error {
	h := host()
	// Each test is written so that NaN, which a flag may parse, fails it.
	if l.CPUs != 0 && !(l.CPUs >= api.MinCPUs && l.CPUs <= float64(h.cpus)) {
		return fmt.Errorf("%w: %scpus %g: want %g to %d (this host's CPUs), or 0 for none", errdefs.ErrInvalidArgument, prefix, l.CPUs, api.MinCPUs, h.cpus)
	}
	if maxMem := h.memory; l.MemoryBytes != 0 && (l.MemoryBytes < api.MinMemoryBytes || maxMem > 0 && l.MemoryBytes > maxMem) {
		return fmt.Errorf("%w: %smemory_bytes %d: want %d (4 MiB) to %d (this host's memory), or 0 for none", errdefs.ErrInvalidArgument, prefix, l.MemoryBytes, int64(api.MinMemoryBytes), maxMem)
	}
	if l.Pids != 0 && (l.Pids < api.MinPids || l.Pids > api.MaxPids) {
		return fmt.Errorf("%w: %spids %d: want %d to %d, or 0 for none", errdefs.ErrInvalidArgument, prefix, l.Pids, api.MinPids, api.MaxPids)
	}
	if l.DiskBytes != 0 && (l.DiskBytes < api.MinDiskBytes || l.DiskBytes > api.MaxDiskBytes) {
		return fmt.Errorf("%w: %sdisk_bytes %d: want %d (64 MiB) to %d (16 TiB), or 0 for none", errdefs.ErrInvalidArgument, prefix, l.DiskBytes, int64(api.MinDiskBytes), int64(api.MaxDiskBytes))
	}
	return nil
}

// validateCreate checks a create request, with the limits it comes to,
// before anything is made.
func validateCreate(req CreateRequest, limits api.Limits) error {
	if err := ValidateLimits(limits, "limits."); err != nil {
		return err
	}
	if req.Name != "" && !isLabel(req.Name) {
		return fmt.Errorf("%w: sandbox name %q: want a DNS label (RFC 1123): a-z, 0-9 and '-', 1 to 63 characters, not beginning or ending with '-'", errdefs.ErrInvalidArgument, api.Clip(req.Name))
	}
	if len(req.Hostname) > 63 || strings.ContainsFunc(req.Hostname, func(r rune) bool {
		return !(r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) {
		return fmt.Errorf("%w: hostname %q: want at most 63 of a-z, A-Z, 0-9, '-' and '.'", errdefs.ErrInvalidArgument, api.Clip(req.Hostname))
	}
	if req.IdleTimeoutSeconds < 0 || req.IdleTimeoutSeconds > api.MaxIdleTimeoutSeconds {
		return fmt.Errorf("%w: idle_timeout_seconds %d: want 0 (none) to %d (a year)", errdefs.ErrInvalidArgument, req.IdleTimeoutSeconds, api.MaxIdleTimeoutSeconds)
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > api.MaxIdleTimeoutSeconds {
		return fmt.Errorf("%w: ttl_seconds %d: want 0 (none) to %d (a year)", errdefs.ErrInvalidArgument, req.TTLSeconds, api.MaxIdleTimeoutSeconds)
	}
	// An init without a command takes its image's: Create checks it once
	// it has it.
	if req.Init != nil && (req.Init.Command != "" || req.Image == "") {
		if err := req.Init.Check(false); err != nil {
			return fmt.Errorf("%w: init: %w", errdefs.ErrInvalidArgument, err)
		}
	}
	switch req.OnOOM {
	case "", api.OnOOMEndSandbox:
	case api.OnOOMKillProcess:
		if req.Runtime == sandbox.RuntimeGVisor {
			return fmt.Errorf("%w: on_oom %s: a gvisor sandbox can only end as a whole out of memory (its processes, its kernel and the agent share one host memory group); want %s", errdefs.ErrInvalidArgument, req.OnOOM, api.OnOOMEndSandbox)
		}
	default:
		return fmt.Errorf("%w: on_oom %q: want %s (the default) or %s", errdefs.ErrInvalidArgument, api.Clip(req.OnOOM), api.OnOOMEndSandbox, api.OnOOMKillProcess)
	}
	if req.Logs != nil {
		if err := ValidateLogs(*req.Logs, "logs."); err != nil {
			return err
		}
	}
	if err := validateLabels(req.Labels); err != nil {
		return err
	}
	if err := validateMounts(req.Mounts, req.Image == "" && req.Rootfs == ""); err != nil {
		return err
	}
	return egress.Validate(req.Network)
}

// validateLabels checks a create's labels against api.MaxLabels and the
// lengths and characters the API documents.
func validateLabels(labels map[string]string) error {
	if len(labels) > api.MaxLabels {
		return fmt.Errorf("%w: labels: %d of them: want at most %d", errdefs.ErrInvalidArgument, len(labels), api.MaxLabels)
	}
	for k, v := range labels {
		if !isLabelKey(k) {
			return fmt.Errorf("%w: labels: key %q: want 1 to %d of a-z, A-Z, 0-9, '.', '_', '-' and '/', a letter or digit first", errdefs.ErrInvalidArgument, api.Clip(k), api.MaxLabelKeyLen)
		}
		if len(v) > api.MaxLabelValueLen || !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
			return fmt.Errorf("%w: labels: the value of %s (%d bytes): want at most %d bytes of UTF-8 without control characters", errdefs.ErrInvalidArgument, k, len(v), api.MaxLabelValueLen)
		}
	}
	return nil
}

// isLabelKey reports whether s may be a label's key: one a filter
// (label=KEY=VALUE) and a metric's label can carry as it is.
func isLabelKey(s string) bool {
	if len(s) < 1 || len(s) > api.MaxLabelKeyLen || !isAlnum(rune(s[0])) {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return !(isAlnum(r) || r == '.' || r == '_' || r == '-' || r == '/')
	})
}

func isAlnum(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}

// ValidateLogs checks a log rotation: each field zero (the default) or
// within its bounds. Errors name the field, after prefix.
func ValidateLogs(r api.LogRotation, prefix string) error {
	if r.MaxSizeBytes != 0 && (r.MaxSizeBytes < api.MinLogFileSize || r.MaxSizeBytes > api.MaxLogFileSize) {
		return fmt.Errorf("%w: %smax_size_bytes %d: want %d (64 KiB) to %d (1 GiB)", errdefs.ErrInvalidArgument, prefix, r.MaxSizeBytes, api.MinLogFileSize, api.MaxLogFileSize)
	}
	if r.MaxFiles != 0 && (r.MaxFiles < api.MinLogFiles || r.MaxFiles > api.MaxLogFiles) {
		return fmt.Errorf("%w: %smax_files %d: want %d to %d", errdefs.ErrInvalidArgument, prefix, r.MaxFiles, api.MinLogFiles, api.MaxLogFiles)
	}
	return nil
}

// isLabel reports whether s is a DNS label as RFC 1123 has it, in lower
// case: what a sandbox's name must be, since it becomes its hostname.
func isLabel(s string) bool {
	if len(s) < 1 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z')
	})
}
