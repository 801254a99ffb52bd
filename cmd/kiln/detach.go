package main

import (
	"bytes"
	"fmt"
	"strings"
)

// defaultDetachKeys end an attached session and leave the process running,
// as Docker's do.
const defaultDetachKeys = "ctrl-p,ctrl-q"

// parseDetachKeys reads Docker's form: keys separated by commas, each a
// single character or ctrl-<key> with <key> one of a-z, @, [, \, ], ^, _.
func parseDetachKeys(s string) ([]byte, error) {
	var seq []byte
	for k := range strings.SplitSeq(s, ",") {
		switch name, ctrl := strings.CutPrefix(strings.ToLower(k), "ctrl-"); {
		case !ctrl && len(k) == 1:
			seq = append(seq, k[0])
		case ctrl && len(name) == 1 && name[0] >= 'a' && name[0] <= 'z':
			seq = append(seq, name[0]-'a'+1)
		case ctrl && len(name) == 1 && strings.Contains("@[\\]^_", name):
			seq = append(seq, name[0]-'@')
		default:
			return nil, fmt.Errorf("--detach-keys %q: %q is not a key; want a character or ctrl-<a-z, @, [, \\, ], ^ or _>, separated by commas", s, k)
		}
	}
	return seq, nil
}

// detacher watches input for the detach sequence. Bytes that may begin it
// are held back until the next bytes tell: sent on when they do not
// complete it, never sent when they do.
type detacher struct {
	seq  []byte
	held int // how much of seq the input ended with
}

// feed returns what of in (after what was held) goes to the process, and
// whether the sequence was typed; after it, nothing more is to be sent.
func (d *detacher) feed(in []byte) (out []byte, detach bool) {
	if len(d.seq) == 0 {
		return in, false
	}
	for _, b := range in {
		switch {
		case b == d.seq[d.held]:
			d.held++
			if d.held == len(d.seq) {
				return out, true
			}
		default:
			out = append(out, d.seq[:d.held]...)
			d.held = 0
			if b == d.seq[0] {
				d.held = 1
				if len(d.seq) == 1 {
					return out, true
				}
				continue
			}
			out = append(out, b)
		}
	}
	return out, false
}

// heldBytes is what was held back when the input ends: sent, it was not
// the sequence.
func (d *detacher) heldBytes() []byte { return bytes.Clone(d.seq[:d.held]) }
