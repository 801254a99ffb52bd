package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// kernel is an unpacked Debian kernel package.
type kernel struct {
	Version string // its uname -r, as its modules directory is named
	Image   string // the vmlinuz
	Modules string // lib/modules/<version>
}

// fetchKernel downloads and unpacks the kernel package pkg (default: the
// one linux-image-amd64 depends on) under cache, unless it is there
// already. apt-get download and dpkg-deb take seconds; installing the
// package would build an initramfs, which is not needed.
func fetchKernel(ctx context.Context, cache, pkg string) (kernel, error) {
	if pkg == "" {
		out, err := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-amd64").Output()
		if err != nil {
			return kernel{}, fmt.Errorf("resolve linux-image-amd64 (needs Debian's apt): %w", err)
		}
		m := regexp.MustCompile(`(?m)^\s*Depends:\s*(linux-image-[0-9][^\s]*)`).FindSubmatch(out)
		if m == nil {
			return kernel{}, fmt.Errorf("linux-image-amd64 depends on no kernel package: %s", out)
		}
		pkg = string(m[1])
	}
	dir := filepath.Join(cache, pkg)
	if _, err := os.Stat(filepath.Join(dir, ".unpacked")); err != nil {
		if err := unpack(ctx, cache, pkg, dir); err != nil {
			return kernel{}, err
		}
	}
	images, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return kernel{}, fmt.Errorf("%s holds %d kernel images, want 1", pkg, len(images))
	}
	version := strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")
	k := kernel{Version: version, Image: images[0], Modules: filepath.Join(dir, "lib", "modules", version)}
	if _, err := os.Stat(k.Modules); err != nil {
		return kernel{}, fmt.Errorf("%s has no modules: %w", pkg, err)
	}
	return k, nil
}

func unpack(ctx context.Context, cache, pkg, dir string) error {
	debs := filepath.Join(cache, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	get := exec.CommandContext(ctx, "apt-get", "download", "-qq", pkg)
	get.Dir = debs
	if out, err := get.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %w: %s", pkg, err, out)
	}
	found, _ := filepath.Glob(filepath.Join(debs, pkg+"_*.deb"))
	if len(found) == 0 {
		return fmt.Errorf("apt-get download %s left no package in %s", pkg, debs)
	}
	os.RemoveAll(dir)
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", found[len(found)-1], dir).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %w: %s", found[len(found)-1], err, out)
	}
	return os.WriteFile(filepath.Join(dir, ".unpacked"), nil, 0o644)
}
