package coarse

import (
	"net"
	"testing"
	"time"
)

// A rounded deadline is never early, at most a 64th of its time (and the
// coarsest step) late, and the same for deadlines close together.
func TestDeadlineBounds(t *testing.T) {
	now := time.Now()
	for _, left := range []time.Duration{64 * time.Microsecond, time.Millisecond, 50 * time.Millisecond,
		time.Second, 30 * time.Second, 2 * time.Minute, time.Hour} {
		for i := range 1000 {
			want := now.Add(left + time.Duration(i)*997*time.Nanosecond)
			got, ns := rounded(want, want.Sub(now))
			late := got.Sub(want)
			if late < 0 {
				t.Fatalf("%v ahead: rounded %v early", left, -late)
			}
			if limit := min(want.Sub(now)/64, maxStep); late >= limit && late > 0 {
				t.Fatalf("%v ahead: rounded %v late, more than %v", left, late, limit)
			}
			if ns != got.UnixNano() {
				t.Fatalf("%v ahead: nanoseconds %d, not the rounded time's %d", left, ns, got.UnixNano())
			}
		}
	}
	// Deadlines a request apart (2 ms) with a minute ahead mostly round
	// to the same: what the grid is for.
	same := 0
	_, last := rounded(now.Add(time.Minute), time.Minute)
	for i := 1; i <= 100; i++ {
		at := now.Add(time.Duration(i) * 2 * time.Millisecond)
		_, ns := rounded(at.Add(time.Minute), time.Minute)
		if ns == last {
			same++
		}
		last = ns
	}
	if same < 80 {
		t.Fatalf("%d of 100 deadlines 2 ms apart rounded to the last one's; want most", same)
	}
}

// A deadline that is zero, past or very close is kept exactly: a past
// one must still fail a call at once.
func TestDeadlineExact(t *testing.T) {
	now := time.Now()
	if got, ns := Deadline(time.Time{}); !got.IsZero() || ns != 0 {
		t.Fatalf("no deadline rounded to %v (%d)", got, ns)
	}
	for _, d := range []time.Time{time.Unix(1, 0), now, now.Add(-time.Second), now.Add(63 * time.Microsecond)} {
		got, ns := rounded(d, d.Sub(now))
		if !got.Equal(d) {
			t.Fatalf("%v rounded to %v", d, got)
		}
		if ns != d.UnixNano() {
			t.Fatalf("%v: nanoseconds %d", d, ns)
		}
	}
}

// Deadline on the real clock: a deadline a minute ahead is rounded up by
// at most the coarsest step.
func TestDeadlineNow(t *testing.T) {
	want := time.Now().Add(time.Minute)
	got, ns := Deadline(want)
	if late := got.Sub(want); late < 0 || late >= maxStep || ns != got.UnixNano() {
		t.Fatalf("a minute ahead rounded %v late (%d, %d)", late, ns, got.UnixNano())
	}
}

// A Socket sets a deadline only when it rounds to another than the one
// set, sets none and a past one when they change, and after Forget sets
// the next whatever it is.
func TestSocketSetsOnlyChanges(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	sets := 0
	set := func(nc net.Conn, t time.Time) error { sets++; return nc.SetDeadline(t) }
	var s Socket
	at := time.Now().Add(time.Minute)
	for i := range 10 {
		want := at.Add(time.Duration(i) * time.Microsecond)
		got, err := s.Set(a, set, want)
		if err != nil {
			t.Fatal(err)
		}
		// The deadline the socket has, whether set now or before: the
		// one Deadline rounds this one to, or one step of the grid below
		// it if the step shrank meanwhile, never before the one asked.
		if late := got.Sub(want); late < 0 || late >= time.Minute/64 {
			t.Fatalf("deadline %d: the socket has %v, %v after the one asked", i, got, late)
		}
		if d, ns := Deadline(want); ns == s.ns && !d.Equal(got) {
			t.Fatalf("deadline %d: Set says %v, Deadline %v", i, got, d)
		}
	}
	if sets > 2 {
		t.Fatalf("10 deadlines within 10 µs, a minute ahead: %d set; want 1 (2 across a step)", sets)
	}
	n := sets
	if got, _ := s.Set(a, set, time.Time{}); !got.IsZero() || sets != n+1 {
		t.Fatalf("no deadline: %v, %d sets", got, sets-n)
	}
	if _, _ = s.Set(a, set, time.Time{}); sets != n+1 {
		t.Fatal("no deadline twice: set again")
	}
	s.Forget()
	if _, _ = s.Set(a, set, time.Time{}); sets != n+2 {
		t.Fatal("after Forget, the next deadline was not set")
	}
	past := time.Unix(1, 0)
	if got, _ := s.Set(a, set, past); !got.Equal(past) || sets != n+3 {
		t.Fatalf("a past deadline: %v, %d sets", got, sets-n)
	}
}
