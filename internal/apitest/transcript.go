package apitest

import (
	"context"
	"fmt"
	"strings"

	"github.com/coder/websocket"
)

// ReadAll reads a kiln.v1 connection to its close, resumed from the
// offsets from, with a Checker that keeps every stream's data: the
// connection's transcript.
func ReadAll(ctx context.Context, conn *websocket.Conn, from map[string]int64) (*Checker, error) {
	c := &Checker{From: from, Keep: true}
	return c, c.Read(ctx, conn)
}

// ReadRaw reads a connection of the raw shape (kiln.raw, or no
// subprotocol) to its close and returns its transcript: the output as
// binary messages and, as text lines in brackets, what was lost, then the
// exit ("[process exited with code N]"), last, then a normal close.
func ReadRaw(ctx context.Context, conn *websocket.Conn) (string, error) {
	var b strings.Builder
	exited := false
	for n := 1; ; n++ {
		typ, data, err := conn.Read(ctx)
		if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
			if !exited {
				return b.String(), fmt.Errorf("closed normally before the exit line, after %q", clipTail(b.String()))
			}
			return b.String(), nil
		}
		if err != nil {
			return b.String(), fmt.Errorf("message %d: %w, after %q", n, err, clipTail(b.String()))
		}
		if exited {
			return b.String(), fmt.Errorf("message %d, %.200q, after the exit line", n, data)
		}
		if typ == websocket.MessageText {
			line := string(data)
			if !strings.HasPrefix(line, "[") || !strings.HasSuffix(line, "]\n") || strings.Count(line, "\n") != 1 {
				return b.String(), fmt.Errorf("message %d is text %.200q, not a line in brackets", n, data)
			}
			exited = strings.HasPrefix(line, "[process ")
		}
		b.Write(data)
	}
}

// clipTail keeps the end of a transcript for an error.
func clipTail(s string) string {
	if len(s) > 200 {
		return "…" + s[len(s)-200:]
	}
	return s
}
