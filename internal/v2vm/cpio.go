package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"syscall"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks an
// initramfs from. The first error sticks and is Close's.
type cpioWriter struct {
	w   *bufio.Writer
	ino uint32
	err error
}

func newCPIO(w *bufio.Writer) *cpioWriter { return &cpioWriter{w: w} }

func (c *cpioWriter) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// header writes an entry's header and name, padded to four bytes.
func (c *cpioWriter) header(name string, mode uint32, size int, major, minor uint32) {
	c.ino++
	nlink := uint32(1)
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		nlink = 2
	}
	h := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, major, minor, len(name)+1, 0)
	c.write([]byte(h))
	c.write([]byte(name + "\x00"))
	c.pad(len(h) + len(name) + 1)
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string, perm uint32) { c.header(name, syscall.S_IFDIR|perm, 0, 0, 0) }

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) {
	c.header(name, syscall.S_IFCHR|perm, 0, major, minor)
}

// File adds a regular file with r's content.
func (c *cpioWriter) File(name string, perm uint32, r io.Reader) {
	var b bytes.Buffer
	if _, err := io.Copy(&b, r); err != nil {
		c.fail(fmt.Errorf("%s: %w", name, err))
		return
	}
	c.header(name, syscall.S_IFREG|perm, b.Len(), 0, 0)
	c.write(b.Bytes())
	c.pad(b.Len())
}

// Close writes the trailer and flushes.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.err
}
