package sandbox_test

import (
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestShmBoundedAndCounted: /dev/shm is a tmpfs of 64 MiB on both
// runtimes (gVisor's kernel honours the size its spec asks): writing past
// it is ENOSPC inside, and what it holds is the sandbox's memory, in its
// stats, and so within its limit, until the file goes. (Its mount options
// are TestWritableMountsAreNosuidNodev's.)
func TestShmBoundedAndCounted(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testShmBoundedAndCounted)
}

func testShmBoundedAndCounted(t *testing.T, runtime string) {
	const bound = 64 << 20
	sb := newBox(t, runtime, sandbox.Options{Limits: sandbox.Limits{MemoryBytes: 512 << 20}})
	memory := func() int64 {
		t.Helper()
		st, err := sb.Stats()
		if err != nil || st.MemoryBytes == nil {
			t.Fatalf("stats: %+v, %v", st, err)
		}
		return *st.MemoryBytes
	}
	before := memory()
	r := run(t, sb, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=80 2>&1; echo dd=$?; stat -c %s /dev/shm/fill")
	if !strings.Contains(r.Stdout, "No space left on device") || !strings.Contains(r.Stdout, "dd=1") || !strings.HasSuffix(r.Stdout, "\n67108864\n") {
		t.Errorf("80 MiB to /dev/shm: %q, want ENOSPC after 64 MiB", r.Stdout)
	}
	after := memory()
	t.Logf("%s: memory %d before, %d after", runtime, before, after)
	if after-before < bound*15/16 {
		t.Errorf("memory %d before, %d with /dev/shm full: want it %d more", before, after, bound)
	}
	// And given back once the file goes.
	run(t, sb, "rm /dev/shm/fill")
	if got := memory(); got > after-bound*15/16 {
		t.Errorf("memory %d after the file went, %d with it", got, after)
	}
}
