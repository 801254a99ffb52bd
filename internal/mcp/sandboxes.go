package mcp

import (
	"context"
	"fmt"
	"time"

	units "github.com/docker/go-units"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// CreateInput is sandbox_create's arguments.
type CreateInput struct {
	Image string `json:"image,omitempty" jsonschema:"an OCI image kilnd has pulled (such as python:3.12 or busybox); left out, the sandbox sees the host's /usr and /etc read-only"`
	Name  string `json:"name,omitempty" jsonschema:"a name to find the sandbox by instead of its id: a DNS label (a-z, 0-9, '-'), unique"`
	// Limits left out are kilnd's defaults.
	Limits *LimitsInput `json:"limits,omitempty" jsonschema:"resource limits; each one left out is kilnd's default"`
	Egress *EgressInput `json:"egress,omitempty" jsonschema:"network access beyond the sandbox's loopback; left out, none"`
	// IdleTimeoutSeconds deletes the sandbox after that long unused.
	IdleTimeoutSeconds int64 `json:"idle_timeout_seconds,omitempty" jsonschema:"delete the sandbox (keeping its captured logs) after this many seconds idle: no call, and no process running in it"`
	// TTLSeconds deletes it that long after its creation.
	TTLSeconds int64 `json:"ttl_seconds,omitempty" jsonschema:"delete the sandbox (keeping its captured logs) this many seconds after its creation, whatever it is doing"`
	// Labels are the caller's own.
	Labels map[string]string `json:"labels,omitempty" jsonschema:"labels, each a key and a value, to find the sandbox by later (sandbox_list's label); keys of a-z, A-Z, 0-9, '.', '_', '-', '/'"`
	// OnOOM is what happens past the memory limit.
	OnOOM string `json:"on_oom,omitempty" jsonschema:"past the memory limit: end_sandbox (the default: every process is killed and the sandbox stops) or kill_process (only the process using the most memory is killed and the sandbox runs on)"`
}

// LimitsInput is a sandbox's limits as a model writes them.
type LimitsInput struct {
	Memory string   `json:"memory,omitempty" jsonschema:"memory limit, such as 512MiB or 2GiB"`
	Disk   string   `json:"disk,omitempty" jsonschema:"disk limit for /workspace and the image's writable layer, such as 1GiB"`
	CPUs   *float64 `json:"cpus,omitempty" jsonschema:"CPU cores, such as 0.5 or 2"`
	Pids   *int64   `json:"pids,omitempty" jsonschema:"most processes at once"`
}

// EgressInput is a sandbox's network.
type EgressInput struct {
	Mode  string   `json:"mode,omitempty" jsonschema:"none (the default: only the allow list is reached) or allow (everything but the deny list and private ranges)"`
	Allow []string `json:"allow,omitempty" jsonschema:"IPv4 addresses or CIDRs the sandbox may reach"`
	Deny  []string `json:"deny,omitempty" jsonschema:"IPv4 addresses or CIDRs the sandbox may not reach"`
}

// SandboxOutput is a sandbox as a model reads it.
type SandboxOutput struct {
	ID      string            `json:"id"`
	Name    string            `json:"name,omitempty"`
	State   string            `json:"state"`
	Image   string            `json:"image,omitempty"`
	Created time.Time         `json:"created_at"`
	Limits  api.Limits        `json:"limits"`
	Network *api.Network      `json:"network,omitempty"`
	Reason  string            `json:"reason,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// ListInput is sandbox_list's arguments.
type ListInput struct {
	Label []string `json:"label,omitempty" jsonschema:"only sandboxes with each of these labels: KEY (it has the label) or KEY=VALUE"`
}

func sandboxOutput(s api.Sandbox) SandboxOutput {
	return SandboxOutput{ID: s.ID, Name: s.Name, State: s.State, Image: s.Image, Created: s.CreatedAt, Limits: s.Limits, Network: s.Network, Reason: s.Reason, Labels: s.Labels}
}

// ListOutput is sandbox_list's result.
type ListOutput struct {
	Sandboxes []SandboxOutput `json:"sandboxes"`
	// Omitted counts sandboxes past the bound, not listed.
	Omitted int    `json:"omitted"`
	Note    string `json:"note"`
}

// DeleteInput is sandbox_delete's arguments.
type DeleteInput struct {
	Sandbox    string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	RemoveLogs bool   `json:"remove_logs,omitempty" jsonschema:"remove its captured process logs too (kept by default)"`
}

// DeleteOutput is sandbox_delete's result.
type DeleteOutput struct {
	Deleted string `json:"deleted"`
}

// StopSandboxInput is sandbox_stop's arguments.
type StopSandboxInput struct {
	Sandbox        string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	TimeoutSeconds *int64 `json:"timeout_seconds,omitempty" jsonschema:"seconds its processes have after SIGTERM before what is left is killed: 0 (at once) to 600, default 10"`
}

// StartSandboxInput is sandbox_start's arguments.
type StartSandboxInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name"`
}

func (s *Server) addSandboxTools() {
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "sandbox_create",
		Description: "Create an isolated Linux sandbox to run commands and keep files in, and return its id, which every other tool " +
			"takes as `sandbox`. Give `image` to run from an OCI image kilnd has (python:3.12, node:22, busybox); without it the " +
			"sandbox sees the host's programs read-only. /workspace is writable and empty. `limits` bound memory, disk, CPUs and " +
			"processes; `egress` opens the network beyond the sandbox's own loopback, which is closed by default. Delete the " +
			"sandbox with sandbox_delete when done, or set idle_timeout_seconds.",
	}, s.createSandbox)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "sandbox_list",
		Description: "List the sandboxes that exist (running, paused or stopped, not deleted) with their ids, names, states, images and " +
			"limits, at most 500 (omitted counts the rest); `label` narrows it to those with each label. Use it to find a sandbox " +
			"created earlier instead of creating another.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.listSandboxes)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "sandbox_delete",
		Description: "Delete a sandbox: every process in it is killed and its files are gone. The output its processes captured " +
			"stays readable as resources unless remove_logs is true. Deleting cannot be undone.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.deleteSandbox)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "sandbox_stop",
		Description: "Stop a sandbox: every process in it gets SIGTERM, and what still runs after timeout_seconds is killed. " +
			"Its files (/workspace, and an image's root) and the output its processes captured stay; nothing runs in it, " +
			"and exec and process_start are refused, until sandbox_start. A sandbox stopped already is left as it is.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.stopSandbox)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "sandbox_start",
		Description: "Start a stopped sandbox again, whether sandbox_stop stopped it or it stopped by itself (its init command " +
			"ended, it ran out of memory): it keeps its id, name, limits and files, and its init command, if it has one, runs " +
			"again. A sandbox that runs already is left as it is.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), IdempotentHint: true},
	}, s.startSandbox)
}

func (s *Server) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, SandboxOutput, error) {
	o := api.CreateSandbox{Image: in.Image, Name: in.Name, IdleTimeoutSeconds: in.IdleTimeoutSeconds, TTLSeconds: in.TTLSeconds, OnOOM: in.OnOOM, Labels: in.Labels}
	if in.IdleTimeoutSeconds < 0 {
		return nil, SandboxOutput{}, fmt.Errorf("idle_timeout_seconds %d: want 0 (none) or more", in.IdleTimeoutSeconds)
	}
	if l := in.Limits; l != nil {
		for _, size := range []struct {
			name, value string
			to          **int64
		}{{"memory", l.Memory, &o.Limits.MemoryBytes}, {"disk", l.Disk, &o.Limits.DiskBytes}} {
			if size.value == "" {
				continue
			}
			n, err := units.RAMInBytes(size.value)
			if err != nil || n < 0 {
				return nil, SandboxOutput{}, fmt.Errorf("limits.%s %q: want a size such as 512MiB or 2GiB", size.name, size.value)
			}
			*size.to = &n
		}
		o.Limits.CPUs, o.Limits.Pids = l.CPUs, l.Pids
	}
	if e := in.Egress; e != nil {
		switch e.Mode {
		case "", api.EgressNone, api.EgressAllow:
		default:
			return nil, SandboxOutput{}, fmt.Errorf("egress.mode %q: want none or allow", e.Mode)
		}
		o.Network = &api.Network{Egress: e.Mode, Allow: e.Allow, Deny: e.Deny}
	}
	sb, err := s.c.CreateSandbox(ctx, o)
	if err != nil {
		return nil, SandboxOutput{}, fmt.Errorf("sandbox_create: %w", err)
	}
	return nil, sandboxOutput(sb.Described), nil
}

func (s *Server) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in ListInput) (*mcp.CallToolResult, ListOutput, error) {
	list, err := s.c.SandboxesWhere(ctx, client.SandboxFilter{Labels: in.Label})
	if err != nil {
		return nil, ListOutput{}, fmt.Errorf("sandbox_list: %w", err)
	}
	out := ListOutput{Sandboxes: []SandboxOutput{}}
	for i, sb := range list {
		if i == MaxEntries {
			out.Omitted = len(list) - i
			break
		}
		out.Sandboxes = append(out.Sandboxes, sandboxOutput(sb))
	}
	out.Note = fmt.Sprintf("%d sandboxes; at most %d per call.", len(list), MaxEntries)
	if out.Omitted > 0 {
		out.Note += fmt.Sprintf(" %d not listed: delete those no longer needed.", out.Omitted)
	}
	return nil, out, nil
}

func (s *Server) deleteSandbox(ctx context.Context, _ *mcp.CallToolRequest, in DeleteInput) (*mcp.CallToolResult, DeleteOutput, error) {
	if in.Sandbox == "" {
		return nil, DeleteOutput{}, errNoSandbox
	}
	sb, err := s.c.Sandbox(ctx, in.Sandbox)
	if err == nil {
		err = sb.Delete(ctx, in.RemoveLogs)
	}
	if err != nil {
		return nil, DeleteOutput{}, fmt.Errorf("sandbox_delete %s: %w", in.Sandbox, err)
	}
	return nil, DeleteOutput{Deleted: sb.ID}, nil
}

func (s *Server) stopSandbox(ctx context.Context, _ *mcp.CallToolRequest, in StopSandboxInput) (*mcp.CallToolResult, SandboxOutput, error) {
	if in.Sandbox == "" {
		return nil, SandboxOutput{}, errNoSandbox
	}
	var o client.StopOptions
	if t := in.TimeoutSeconds; t != nil {
		if *t < 0 || *t > 600 {
			return nil, SandboxOutput{}, fmt.Errorf("timeout_seconds %d: want 0 to 600", *t)
		}
		d := time.Duration(*t) * time.Second
		o.Timeout = &d
	}
	info, err := s.c.Handle(in.Sandbox).Stop(ctx, o)
	if err != nil {
		return nil, SandboxOutput{}, fmt.Errorf("sandbox_stop %s: %w", in.Sandbox, err)
	}
	return nil, sandboxOutput(info), nil
}

func (s *Server) startSandbox(ctx context.Context, _ *mcp.CallToolRequest, in StartSandboxInput) (*mcp.CallToolResult, SandboxOutput, error) {
	if in.Sandbox == "" {
		return nil, SandboxOutput{}, errNoSandbox
	}
	info, err := s.c.Handle(in.Sandbox).StartAgain(ctx)
	if err != nil {
		return nil, SandboxOutput{}, fmt.Errorf("sandbox_start %s: %w", in.Sandbox, err)
	}
	return nil, sandboxOutput(info), nil
}

func ptr[T any](v T) *T { return &v }
