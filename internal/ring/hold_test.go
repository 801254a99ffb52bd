package ring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"testing/synctest"
	"time"
)

// pumpInto writes n bytes of the pattern to s from a goroutine of its own,
// as a pump does, and closes the stream; done is closed once it has.
func pumpInto(r *Ring, s Stream, n int) (done chan struct{}) {
	done = make(chan struct{})
	go func() {
		defer close(done)
		write(r, s, patterned(s, 0, n))
		r.CloseStream(s)
	}()
	return done
}

// readAll reads c to its end, checking every byte against the pattern,
// and returns how many bytes it got and how many it was told were lost.
func readAll(t *testing.T, c *Cursor, each func(Event)) (got, lost Offsets) {
	t.Helper()
	got = c.Position() // where c stands counts as got: it was read before
	for {
		e, err := c.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return got, lost
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e.Kind {
		case Data:
			if e.Offset != got[e.Stream]+lost[e.Stream] || !bytes.Equal(e.Data, patterned(e.Stream, e.Offset, len(e.Data))) {
				t.Fatalf("%v data at %d: wrong place or bytes", e.Stream, e.Offset)
			}
			got[e.Stream] += int64(len(e.Data))
		case Gap:
			lost[e.Stream] += e.Lost()
		}
		if each != nil {
			each(e)
		}
	}
}

// TestHolderGetsEveryByte: 1 MiB through a ring of 4 KiB, read by a holder
// that pauses after every event: it gets every byte, the ring never holds
// more than its capacity, and a reader that does not hold, reading only at
// the end, is told what it lost.
func TestHolderGetsEveryByte(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		defer h.Close()
		if !h.Hold(time.Minute, false) {
			t.Fatal("the ring took no hold")
		}
		late, _ := r.Cursor(Offsets{})
		defer late.Close()
		const size = 1 << 20
		done := pumpInto(r, Stdout, size)
		got, lost := readAll(t, h, func(Event) {
			if n := r.Retained(); n > r.Capacity() {
				t.Fatalf("the ring holds %d bytes, more than its %d", n, r.Capacity())
			}
			time.Sleep(time.Millisecond) // a slow reader: the pump waits for it
		})
		<-done
		if got[Stdout] != size || lost[Stdout] != 0 {
			t.Fatalf("the holder got %d bytes and lost %d of %d", got[Stdout], lost[Stdout], size)
		}
		got, lost = readAll(t, late, nil)
		if got[Stdout]+lost[Stdout] != size || lost[Stdout] == 0 {
			t.Fatalf("the late reader got %d and lost %d of %d", got[Stdout], lost[Stdout], size)
		}
	})
}

// TestPumpWaitsForTheHolder: a holder that does not read stops the pump
// once the ring is full of what it has not taken; one read lets it on.
func TestPumpWaitsForTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		defer h.Close()
		h.Hold(time.Minute, false)
		done := pumpInto(r, Stdout, 64<<10)
		synctest.Wait()
		if !r.Held() {
			t.Fatal("the pump did not wait for the holder")
		}
		totals, _ := r.Totals()
		if totals[Stdout] > int64(r.Capacity()) {
			t.Fatalf("%d bytes committed before the holder took any, more than the ring's %d", totals[Stdout], r.Capacity())
		}
		for range 3 {
			if _, err := h.Next(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if after, _ := r.Totals(); after[Stdout] <= totals[Stdout] {
			t.Fatalf("after the holder read, %d bytes committed, as before", after[Stdout])
		}
		readAll(t, h, nil)
		<-done
	})
}

// TestClosedHolderKeepsItsPlaceForGrace: a holder that goes away mid-stream
// leaves its hold for the grace period, so a reader that comes back in
// time gets every byte; past it, the ring drops its oldest bytes again and
// the pump runs on.
func TestClosedHolderKeepsItsPlaceForGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		h.Hold(10*time.Second, false)
		const size = 64 << 10
		done := pumpInto(r, Stdout, size)
		var pos Offsets
		for range 2 {
			e, err := h.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			pos[e.Stream] = e.Offset + int64(len(e.Data))
		}
		h.Close()
		synctest.Wait()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if !r.Held() {
			t.Fatal("within the grace period, the pump does not wait")
		}
		// Back in time: a new holder from where the last one stood.
		back, err := r.Cursor(pos)
		if err != nil {
			t.Fatal(err)
		}
		back.Hold(10*time.Second, false)
		got, lost := readAll(t, back, nil)
		back.Close()
		<-done
		if lost[Stdout] != 0 || got[Stdout] != size || pos[Stdout] == 0 {
			t.Fatalf("back at %d: got %d, lost %d of %d", pos[Stdout], got[Stdout], lost[Stdout], size)
		}

		// The same, with nobody coming back.
		r = New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		h, _ = r.Cursor(Offsets{})
		h.Hold(10*time.Second, false)
		done = pumpInto(r, Stdout, size)
		synctest.Wait()
		h.Close()
		synctest.Wait()
		if !r.Held() {
			t.Fatal("the pump does not wait for the closed holder's grace")
		}
		time.Sleep(10 * time.Second)
		<-done // the grace is over: the pump runs on, dropping what nobody reads
		if first := r.First(); first[Stdout] == 0 {
			t.Fatal("nothing was evicted after the grace period")
		}
	})
}

// TestComeBackBeforeGoing: a holder's reader comes back (a new holding
// cursor, from where it had got) before its old connection is seen to
// break. The old cursor's close then leaves no hold: the new one holds the
// output, and the pump never waits for the bytes the reader already had,
// not even for the grace period.
func TestComeBackBeforeGoing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		old, _ := r.Cursor(Offsets{})
		old.Hold(time.Hour, false)
		const size = 64 << 10
		done := pumpInto(r, Stdout, size)
		var pos Offsets
		for range 2 {
			e, err := old.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			pos[e.Stream] = e.Offset + int64(len(e.Data))
		}
		back, err := r.Cursor(pos)
		if err != nil {
			t.Fatal(err)
		}
		back.Hold(time.Hour, false)
		start := time.Now() // the bubble's clock: a grace waited out shows in it
		old.Close()         // seen to go only now
		got, lost := readAll(t, back, nil)
		back.Close()
		<-done
		if waited := time.Since(start); waited >= time.Hour {
			t.Errorf("the pump waited %v for a reader that had come back", waited)
		}
		if lost[Stdout] != 0 || got[Stdout] != size {
			t.Fatalf("back at %d: got %d, lost %d of %d", pos[Stdout], got[Stdout], lost[Stdout], size)
		}
	})
}

// TestHoldBeforeAnyCursor: a ring held from its start keeps everything for
// the reader that comes to hold it, within the grace.
func TestHoldBeforeAnyCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout, Stderr}})
		r.Hold(time.Second)
		const size = 32 << 10
		done := pumpInto(r, Stdout, size)
		errs := pumpInto(r, Stderr, size)
		synctest.Wait()
		if !r.Held() {
			t.Fatal("the pumps do not wait for the reader to come")
		}
		time.Sleep(500 * time.Millisecond)
		c, _ := r.Cursor(Offsets{})
		defer c.Close()
		c.Hold(time.Second, false)
		got, lost := readAll(t, c, nil)
		<-done
		<-errs
		if got != (Offsets{Stdout: size, Stderr: size}) || lost != (Offsets{}) {
			t.Fatalf("got %v, lost %v", got, lost)
		}
	})
}

// TestUnholdFreesThePump: Unhold drops the holds for good; the waiting
// pump runs on, and later holds are refused.
func TestUnholdFreesThePump(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		defer h.Close()
		h.Hold(time.Hour, false)
		done := pumpInto(r, Stdout, 64<<10)
		synctest.Wait()
		if !r.Held() {
			t.Fatal("the pump does not wait")
		}
		r.Unhold()
		<-done
		c, _ := r.Cursor(Offsets{})
		defer c.Close()
		if c.Hold(time.Hour, false) {
			t.Error("a hold taken after Unhold")
		}
		_, lost := readAll(t, h, nil)
		if lost[Stdout] == 0 {
			t.Error("nothing lost to the unheld reader: the ring kept everything")
		}
	})
}

// TestAckKeepsWhatWasInFlight: a holder's reader acknowledges less than
// the cursor delivered (the rest was on its way when the connection
// broke); coming back from where it had got to, within the grace, it finds
// those bytes still kept, and loses nothing.
func TestAckKeepsWhatWasInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 64 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		h.Hold(10*time.Second, true)
		const size = 1 << 20
		done := pumpInto(r, Stdout, size)
		for h.Position()[Stdout] < 48<<10 {
			if _, err := h.Next(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		h.Ack(Offsets{Stdout: 16 << 10})
		h.Close()
		synctest.Wait()
		back, err := r.Cursor(Offsets{Stdout: 16 << 10})
		if err != nil {
			t.Fatal(err)
		}
		defer back.Close()
		back.Hold(10*time.Second, false)
		got, lost := readAll(t, back, nil)
		<-done
		if lost != (Offsets{}) || got[Stdout] != size {
			t.Fatalf("back from 16 KiB: got to %d of %d, lost %d", got[Stdout], size, lost[Stdout])
		}
	})
}

// TestLateFirstAckNeverOverfillsTheRing: a holder that acks only after
// it has read all the ring holds moves its hold back to what it acked; the
// pump then waits for it, and the ring never retains more than its
// capacity.
func TestLateFirstAckNeverOverfillsTheRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 16 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		defer h.Close()
		h.Hold(time.Minute, false)
		for i := range 4 {
			write(r, Stdout, patterned(Stdout, int64(i)<<12, 4<<10))
			if _, err := h.Next(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		// All 16 KiB delivered, none acked: all of it is held now.
		h.Ack(Offsets{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			write(r, Stdout, patterned(Stdout, 16<<10, 4<<10))
		}()
		synctest.Wait()
		if !r.Held() || r.Retained() > r.Capacity() {
			t.Fatalf("held %v, %d bytes retained of %d: the pump did not wait for the ack", r.Held(), r.Retained(), r.Capacity())
		}
		h.Ack(Offsets{Stdout: 16 << 10})
		<-done
	})
}

// TestPumpWakesTheHolderBeforeItWaits: bytes committed with more set are
// not yet announced; a pump that then waits for room announces them
// first, so a holder that needs them to ack (and free the room) gets them
// instead of both waiting for ever.
func TestPumpWakesTheHolderBeforeItWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		defer h.Close()
		h.Hold(time.Minute, true)
		write(r, Stdout, patterned(Stdout, 0, 2500))
		for h.Position()[Stdout] < 2500 {
			if _, err := h.Next(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		// The holder waits for more; 700 more come, unannounced: 3200 of
		// 4096 bytes are now held unacked.
		got := make(chan Event, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			e, err := h.Next(ctx)
			if err != nil {
				t.Errorf("the holder was not given the bytes the pump waits on it for: %v", err)
			}
			got <- e
		}()
		synctest.Wait()
		n := copy(r.Buffer(Stdout), patterned(Stdout, 2500, 700))
		r.Commit(Stdout, n, true).Release()
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.Buffer(Stdout) // less than a quarter of room: waits
		}()
		synctest.Wait()
		if !r.Held() {
			t.Fatal("the pump did not wait for room")
		}
		if e := <-got; e.Offset != 2500 || len(e.Data) != n {
			t.Fatalf("got %d bytes at %d, want %d at 2500", len(e.Data), e.Offset, n)
		}
		h.Ack(h.Position())
		<-done
	})
}

// TestStalledHolderIsLetGo: a holder that neither reads nor acks while the
// pump waits on it keeps the pump waiting for twice its grace period, not
// longer; the pump then runs on and the holder is told what it missed.
// One that reads, however slowly, within that, misses nothing.
func TestStalledHolderIsLetGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		h, _ := r.Cursor(Offsets{})
		defer h.Close()
		h.Hold(10*time.Second, false)
		const size = 64 << 10
		start := time.Now()
		done := pumpInto(r, Stdout, size)
		time.Sleep(19 * time.Second)
		if !r.Held() {
			t.Fatal("the pump let the holder go before twice its grace")
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("the pump still waits on a holder of 10s grace after a minute")
		}
		if waited := time.Since(start); waited > 21*time.Second {
			t.Fatalf("the pump waited %v on a holder of 10s grace", waited)
		}
		got, lost := readAll(t, h, nil)
		if lost[Stdout] == 0 || got[Stdout]+lost[Stdout] != size {
			t.Fatalf("the stalled holder got %d and lost %d of %d", got[Stdout], lost[Stdout], size)
		}

		r = New(Config{Capacity: 4 << 10, Streams: []Stream{Stdout}})
		slow, _ := r.Cursor(Offsets{})
		defer slow.Close()
		slow.Hold(10*time.Second, false)
		done = pumpInto(r, Stdout, size)
		got, lost = readAll(t, slow, func(Event) { time.Sleep(19 * time.Second) })
		<-done
		if lost[Stdout] != 0 || got[Stdout] != size {
			t.Fatalf("a holder reading every 19s, of a 10s grace, got %d and lost %d of %d", got[Stdout], lost[Stdout], size)
		}
	})
}
