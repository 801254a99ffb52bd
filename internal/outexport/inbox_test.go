package outexport

import (
	"testing"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
)

func TestMerge(t *testing.T) {
	frame := func(s byte, off, seq uint64, data string) inItem {
		return inItem{websocket.MessageBinary, api.AppendFrame(nil, api.Frame{Stream: s, Offset: off, Seq: seq, Data: []byte(data)})}
	}
	text := inItem{websocket.MessageText, []byte(`{"type":"end"}`)}
	type op struct {
		Stream      byte
		Offset, Seq uint64
		Data, Text  string
	}
	for _, tc := range []struct {
		name  string
		items []inItem
		max   int
		want  []op
	}{
		{"continuing frames join", []inItem{frame(1, 0, 0, "ab"), frame(1, 2, 2, "cd"), frame(1, 4, 4, "e")}, 10,
			[]op{{Stream: 1, Data: "abcde"}}},
		{"up to max", []inItem{frame(1, 0, 0, "ab"), frame(1, 2, 2, "cd"), frame(1, 4, 4, "e")}, 4,
			[]op{{Stream: 1, Data: "abcd"}, {Stream: 1, Offset: 4, Seq: 4, Data: "e"}}},
		{"another stream between", []inItem{frame(1, 0, 0, "ab"), frame(2, 0, 2, "x"), frame(1, 2, 3, "cd")}, 10,
			[]op{{Stream: 1, Data: "ab"}, {Stream: 2, Seq: 2, Data: "x"}, {Stream: 1, Offset: 2, Seq: 3, Data: "cd"}}},
		{"a seq that jumps", []inItem{frame(1, 0, 0, "ab"), frame(1, 2, 5, "cd")}, 10,
			[]op{{Stream: 1, Data: "ab"}, {Stream: 1, Offset: 2, Seq: 5, Data: "cd"}}},
		{"an offset that jumps", []inItem{frame(1, 0, 0, "ab"), frame(1, 7, 2, "cd")}, 10,
			[]op{{Stream: 1, Data: "ab"}, {Stream: 1, Offset: 7, Seq: 2, Data: "cd"}}},
		{"a control message between", []inItem{frame(1, 0, 0, "ab"), text, frame(1, 2, 2, "cd")}, 10,
			[]op{{Stream: 1, Data: "ab"}, {Text: `{"type":"end"}`}, {Stream: 1, Offset: 2, Seq: 2, Data: "cd"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := merge(tc.items, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			var got []op
			for _, o := range ops {
				if o.frame != nil {
					got = append(got, op{Stream: o.frame.Stream, Offset: o.frame.Offset, Seq: o.frame.Seq, Data: string(o.frame.Data)})
				} else {
					got = append(got, op{Text: string(o.text)})
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Error(d)
			}
		})
	}
	// A run's copy is as large as what may join it, not as the limit.
	items := []inItem{frame(1, 0, 0, "ab"), frame(1, 2, 2, "cd"), text, frame(1, 4, 4, "e")}
	if ops, err := merge(items, 1<<20); err != nil || len(ops) != 3 || cap(ops[0].frame.Data) > 5 {
		t.Errorf("merged into %+v (%v), want 3 ops, the first's copy of capacity 5 at most", ops, err)
	}
	if _, err := merge([]inItem{{websocket.MessageBinary, []byte{9}}}, 10); err == nil {
		t.Error("a malformed frame merged")
	}
}
