package client_test

import (
	"testing"

	"github.com/sandkiln/sandkiln/client"
)

// TestSandboxByName: a sandbox created with a name is found by it, and by
// a prefix of its id, the handle holding the full id; a name taken is
// IsAlreadyExists, one that is not a DNS label IsInvalid.
func TestSandboxByName(t *testing.T) {
	t.Parallel()
	c, _ := kilnd(t)
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, client.SandboxOptions{Name: "sdk"})
	if err != nil {
		t.Fatal(err)
	}
	info := sb.Described
	if info.Name != "sdk" || info.Hostname != "sdk" {
		t.Errorf("created %+v, want name and hostname sdk", info)
	}
	for _, ref := range []string{"sdk", sb.ID, sb.ID[:len(sb.ID)-1]} {
		got, err := c.Sandbox(ctx, ref)
		if err != nil || got.ID != sb.ID {
			t.Errorf("Sandbox(%q): %v, %v; want the handle of %s", ref, got, err, sb.ID)
		}
	}
	if _, err := c.CreateSandbox(ctx, client.SandboxOptions{Name: "sdk"}); !client.IsAlreadyExists(err) {
		t.Errorf("a name taken: %v, want already exists", err)
	}
	if _, err := c.CreateSandbox(ctx, client.SandboxOptions{Name: "SDK"}); !client.IsInvalid(err) {
		t.Errorf("an upper-case name: %v, want invalid", err)
	}
	// Through a handle by name, a process call reaches the sandbox.
	res, err := c.Handle("sdk").Exec(ctx, client.ExecOptions{Command: "cat", Args: []string{"/proc/sys/kernel/hostname"}})
	if err != nil || string(res.Stdout) != "sdk\n" {
		t.Errorf("exec hostname by name: %+v, %v", res, err)
	}
	if err := c.Handle("sdk").Delete(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sandbox(ctx, "sdk"); !client.IsNotFound(err) {
		t.Errorf("after delete: %v, want not found", err)
	}
}
