package client

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
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

// FuzzFrameInChunks: a message of kilnd's is given out in chunks of at
// most MaxChunkBytes whose bytes are the message's, in order, each at its
// own offset and seq, the last leaving the stream where the message
// ended; decoded as text, the same text as the message decoded whole, the
// handle standing before a character not yet complete.
func FuzzFrameInChunks(f *testing.F) {
	f.Add(40000, uint64(7), int64(3), byte(0xe2))
	f.Add(MaxChunkBytes, uint64(0), int64(0), byte('a'))
	f.Add(1, uint64(9), int64(1<<40), byte(0xff))
	f.Fuzz(func(t *testing.T, n int, seq uint64, offset int64, fill byte) {
		n = abs(n) % (3 * MaxChunkBytes)
		if offset < 0 || offset > 1<<50 || seq > 1<<60 || n == 0 {
			return
		}
		// A repeating text with characters of 1 to 4 bytes, so that the
		// cuts fall inside some, or bytes of fill.
		data := bytes.Repeat([]byte("a€é𝄞"), n/10+1)[:n]
		if fill >= 0x80 {
			data[n/2] = fill
		}
		msg := api.AppendFrame(nil, api.Frame{Stream: api.StreamStdout, Offset: uint64(offset), Seq: seq, Data: data})
		for _, format := range []Format{Bytes, Text} {
			p := &Process{format: format, offsets: map[string]int64{"stdout": offset}}
			var dec decoders
			chunks, exited := p.handle(websocket.MessageBinary, msg, &dec)
			if exited {
				t.Fatal("a frame taken for the exit")
			}
			var got []byte
			var text string
			at := offset
			for _, ch := range chunks {
				if ch.Stream != "stdout" || ch.Offset != at || ch.Seq != seq+uint64(at-offset) || ch.Lost != 0 {
					t.Fatalf("%v: chunk at %d seq %d after %d bytes", format, ch.Offset, ch.Seq, at-offset)
				}
				// A piece's text is its bytes, with those of a character
				// the piece before began, each invalid one a U+FFFD.
				if len(ch.Bytes) > MaxChunkBytes || len(ch.Text) > 3*(MaxChunkBytes+utf8.UTFMax-1) {
					t.Fatalf("%v: a chunk of %d bytes, %d of text", format, len(ch.Bytes), len(ch.Text))
				}
				at += MaxChunkBytes
				got = append(got, ch.Bytes...)
				text += ch.Text
			}
			last := chunks[len(chunks)-1].next
			switch format {
			case Bytes:
				if !bytes.Equal(got, data) || last != offset+int64(n) {
					t.Fatalf("bytes: %d of %d, standing at %d", len(got), n, last)
				}
			case Text:
				var whole decoders
				if want := whole.decode("s", data); text != want || last != offset+int64(n)-int64(len(dec.carry["stdout"])) {
					t.Fatalf("text %q, want %q; standing at %d", text, want, last)
				}
			}
		}
	})
}
