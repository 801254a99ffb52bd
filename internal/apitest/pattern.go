package apitest

import (
	"fmt"
	"strings"
)

// Pattern is output made of one line repeated: the byte at offset n of a
// stream is the line's byte n modulo its length, so a watcher can check
// every byte it is given against where it says the byte belongs. The line
// ends in a newline and holds nothing a shell would interpret.
type Pattern string

// Line is the 32-byte pattern the scenarios write.
const Line Pattern = "0123456789abcdefghijklmnopqrstu\n"

// Shell is a shell command writing the pattern's first n bytes to its
// standard output.
func (p Pattern) Shell(n int64) string {
	return fmt.Sprintf("yes %s | head -c %d", strings.TrimSuffix(string(p), "\n"), n)
}

// Bytes are the n bytes of the pattern from offset off.
func (p Pattern) Bytes(off, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = p[(off+int64(i))%int64(len(p))]
	}
	return b
}

// Check checks data, said to be stream's at offset, against the pattern;
// it is a Checker's Check.
func (p Pattern) Check(stream string, offset int64, data []byte) error {
	for i, b := range data {
		if want := p[(offset+int64(i))%int64(len(p))]; b != want {
			return fmt.Errorf("%s byte at offset %d is %q, want %q", stream, offset+int64(i), b, want)
		}
	}
	return nil
}
