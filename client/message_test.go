package client

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/coder/websocket"
)

// TestReadMessage: messages larger than the buffer's first size, and
// smaller ones after them, come whole through the one buffer.
func TestReadMessage(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KiB
	sent := [][]byte{[]byte("first"), big, []byte(`{"type":"exit"}`), big[:100], {}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for _, m := range sent {
			if err := c.Write(r.Context(), websocket.MessageBinary, m); err != nil {
				return
			}
		}
		c.Close(websocket.StatusNormalClosure, "")
	}))
	defer srv.Close()
	ctx := t.Context()
	c, _, err := websocket.Dial(ctx, "ws"+srv.URL[len("http"):], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(maxFrame)
	var buf []byte
	for i, want := range sent {
		typ, got, err := readMessage(ctx, c, &buf)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if typ != websocket.MessageBinary || !bytes.Equal(got, want) {
			t.Fatalf("message %d: %d bytes of type %v, want %d", i, len(got), typ, len(want))
		}
	}
	if _, _, err := readMessage(context.Background(), c, &buf); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Errorf("after the last message: %v, want the normal close", err)
	}
}
