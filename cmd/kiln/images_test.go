package main

import "testing"

// TestFamiliarName: images are shown as docker images shows them.
func TestFamiliarName(t *testing.T) {
	for name, want := range map[string]string{
		"index.docker.io/library/busybox:latest":   "busybox:latest",
		"docker.io/library/python:3.12-slim":       "python:3.12-slim",
		"index.docker.io/grafana/grafana:11.0.0":   "grafana/grafana:11.0.0",
		"index.docker.io/library/a/b:1":            "library/a/b:1",
		"ghcr.io/library/busybox:latest":           "ghcr.io/library/busybox:latest",
		"127.0.0.1:5000/busybox:latest":            "127.0.0.1:5000/busybox:latest",
		"index.docker.io/library/alpine@sha256:ab": "alpine@sha256:ab",
	} {
		if got := familiarName(name); got != want {
			t.Errorf("familiarName(%q) = %q, want %q", name, got, want)
		}
	}
}
