package storagetest

// The live feed suite (RunFeed): what is published reaches every replica's
// subscribers in order and once, through bursts, a feed that closes,
// stalled transports and subscribers, and reconnects.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/tokens"
)

// FeedHarness tells RunFeed which live feed to test: the in-process one
// (Deploy nil) or feed.Replicated over a backend's transport.
type FeedHarness struct {
	// Deploy returns n transports of one deployment: n replicas on one
	// database (or Redis), each with its own connections. Cleanup is
	// registered with t. Nil: test feed.Local, one process, one replica.
	Deploy func(t *testing.T, n int) FeedDeployment
}

// FeedDeployment is the storage side of n replicas' live feed.
type FeedDeployment struct {
	Transports []feed.Transport
	// KillListeners ends, on the server side, every session that listens
	// for the deployment's rejections (as a partition or an operator
	// would); the listeners must reconnect by themselves. Nil if the
	// backend cannot.
	KillListeners func(t *testing.T)
}

// RunFeed runs the live feed's conformance suite (feed.Feed): every
// rejection published after a subscriber joined reaches it whole, once, in
// the order its replica published it, from every replica; Close sends what
// is queued; and, as the feed is best effort, a stalled transport never
// holds Publish up (what does not fit the queue is left out and counted), a
// stalled subscriber loses nothing the transport can buffer, and a
// listener whose session dies reconnects by itself.
func RunFeed(t *testing.T, h FeedHarness) {
	tests := []struct {
		name       string
		fn         func(*testing.T, FeedHarness)
		replicated bool // needs a transport
	}{
		{"Delivers", testFeedDelivers, false},
		{"InOrderOnce", testFeedInOrderOnce, false},
		{"Burst", testFeedBurst, false},
		{"AcrossReplicas", testFeedAcrossReplicas, true},
		{"CloseSendsQueued", testFeedCloseSendsQueued, false},
		{"StalledTransport", testFeedStalledTransport, true},
		{"StalledSubscriber", testFeedStalledSubscriber, true},
		{"Reconnect", testFeedReconnect, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.replicated && h.Deploy == nil {
				t.Skip("one process: no transport between replicas")
			}
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

// feeds returns n feeds of one deployment, not yet subscribed.
func (h FeedHarness) feeds(t *testing.T, n int, opts feed.Options) ([]feed.Feed, FeedDeployment) {
	t.Helper()
	if h.Deploy == nil {
		if n != 1 {
			t.Fatalf("storagetest: %d replicas of an in-process feed", n)
		}
		f := feed.NewLocal()
		t.Cleanup(f.Close)
		return []feed.Feed{f}, FeedDeployment{}
	}
	d := h.Deploy(t, n)
	if len(d.Transports) != n {
		t.Fatalf("storagetest: Deploy(%d) returned %d transports", n, len(d.Transports))
	}
	var out []feed.Feed
	for _, tr := range d.Transports {
		f := feed.NewReplicated(tr, opts)
		t.Cleanup(f.Close)
		out = append(out, f)
	}
	return out, d
}

// received collects what a subscriber was delivered.
type received struct {
	mu   sync.Mutex
	got  []tokens.Rejection
	more chan struct{} // closed and replaced at each delivery
	hold chan struct{} // if set, each delivery first waits for it to close
}

func newReceived() *received { return &received{more: make(chan struct{})} }

func (r *received) deliver(rej tokens.Rejection) {
	if r.hold != nil {
		<-r.hold
	}
	r.mu.Lock()
	r.got = append(r.got, rej)
	close(r.more)
	r.more = make(chan struct{})
	r.mu.Unlock()
}

// until waits for cond over what was delivered so far.
func (r *received) until(t *testing.T, what string, cond func([]tokens.Rejection) bool) []tokens.Rejection {
	t.Helper()
	got, ok := r.by(time.Now().Add(2*waitLimit), cond)
	if !ok {
		t.Fatalf("%s: not within %v (%d delivered)", what, 2*waitLimit, len(got))
	}
	return got
}

// by waits until cond holds over what was delivered, or deadline has
// passed; it returns what was delivered and whether cond held.
func (r *received) by(deadline time.Time, cond func([]tokens.Rejection) bool) ([]tokens.Rejection, bool) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		r.mu.Lock()
		got, more := append([]tokens.Rejection(nil), r.got...), r.more
		r.mu.Unlock()
		if cond(got) {
			return got, true
		}
		select {
		case <-more:
		case <-timer.C:
			return got, false
		}
	}
}

// has reports whether a rejection with id is among rs.
func has(id int64) func([]tokens.Rejection) bool {
	return func(rs []tokens.Rejection) bool {
		for _, r := range rs {
			if r.ID == id {
				return true
			}
		}
		return false
	}
}

func subscribe(t *testing.T, f feed.Feed) *received {
	t.Helper()
	return subscribeWith(t, f, newReceived())
}

// subscribeWith subscribes r to f for the rest of the test.
func subscribeWith(t *testing.T, f feed.Feed, r *received) *received {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f.Subscribe(t.Context(), r.deliver) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
	case <-time.After(2 * waitLimit):
		t.Fatalf("Subscribe did not return within %v", 2*waitLimit)
	}
	return r
}

// feedRejection is the i-th rejection a replica publishes: ID encodes both
// (replica*1e6 + i), so order and origin can be checked.
func feedRejection(replica, i int) tokens.Rejection {
	return tokens.Rejection{ID: int64(replica*1_000_000 + i), At: time.Now().UTC().Truncate(time.Microsecond),
		Resource: fmt.Sprintf("feed/r%d", replica), Code: tokens.CodeStaleToken, Token: int64(i), CurrentToken: int64(i + 1),
		Holder: "h", LeaseHint: "fl_abcdef…", Method: "PUT", Upstream: "u", Path: "/x"}
}

// sentinel is a rejection no test publishes otherwise: published last, its
// arrival means every earlier one from its replica has arrived (the feed
// keeps a replica's order), and any duplicate with it.
func sentinel(replica int) tokens.Rejection { return feedRejection(replica, 999_999) }

// checkOrderOnce checks that rs holds, from each replica in from, exactly
// ids 1..n[replica] in order (ignoring sentinels).
func checkOrderOnce(t *testing.T, rs []tokens.Rejection, n map[int]int) {
	t.Helper()
	next := map[int]int{}
	for _, r := range rs {
		replica, i := int(r.ID/1_000_000), int(r.ID%1_000_000)
		if i == 999_999 {
			continue
		}
		if _, ok := n[replica]; !ok {
			t.Fatalf("rejection %d from replica %d, which published none", r.ID, replica)
		}
		if i != next[replica]+1 {
			t.Fatalf("from replica %d: rejection %d arrived after %d (want each once, in order)", replica, i, next[replica])
		}
		next[replica] = i
	}
	for replica, want := range n {
		if next[replica] != want {
			t.Fatalf("from replica %d: %d of %d rejections arrived", replica, next[replica], want)
		}
	}
}

// A rejection crosses whole: every field, the time to the microsecond.
func testFeedDelivers(t *testing.T, h FeedHarness) {
	fs, _ := h.feeds(t, 1, feed.Options{})
	got := subscribe(t, fs[0])
	want := tokens.Rejection{ID: 7, At: time.Now().UTC().Truncate(time.Microsecond), Resource: "r", Code: tokens.CodeLeaseNotOwned,
		Token: 1, CurrentToken: 2, Holder: "h", LeaseHint: "fl_abcdef…", Method: "PUT", Upstream: "u", Path: "/x?y=1",
		Principal: "mallory", LeaseEndedAt: time.Now().UTC().Add(-time.Second).Truncate(time.Microsecond),
		Repeats: 3, FirstAt: time.Now().UTC().Add(-2 * time.Second).Truncate(time.Microsecond)}
	fs[0].Publish(want)
	r := got.until(t, "the rejection", has(7))[0]
	if !r.At.Equal(want.At) || !r.LeaseEndedAt.Equal(want.LeaseEndedAt) || !r.FirstAt.Equal(want.FirstAt) {
		t.Fatalf("times %v, %v, %v; want %v, %v, %v", r.At, r.LeaseEndedAt, r.FirstAt, want.At, want.LeaseEndedAt, want.FirstAt)
	}
	r.At, r.LeaseEndedAt, r.FirstAt = want.At, want.LeaseEndedAt, want.FirstAt
	if r != want {
		t.Fatalf("got %+v, want %+v", r, want)
	}
}

// A replica's own rejections reach its subscriber once (not also locally),
// in the order published.
func testFeedInOrderOnce(t *testing.T, h FeedHarness) {
	fs, _ := h.feeds(t, 1, feed.Options{})
	got := subscribe(t, fs[0])
	const n = 200
	for i := 1; i <= n; i++ {
		fs[0].Publish(feedRejection(0, i))
	}
	fs[0].Publish(sentinel(0))
	checkOrderOnce(t, got.until(t, "the sentinel", has(sentinel(0).ID)), map[int]int{0: n})
}

// A storm's worth, with long paths: more than one message of any
// transport, whole and in order.
func testFeedBurst(t *testing.T, h FeedHarness) {
	fs, _ := h.feeds(t, 1, feed.Options{})
	got := subscribe(t, fs[0])
	const n = 3000
	for i := 1; i <= n; i++ {
		r := feedRejection(0, i)
		r.Path = "/" + strings.Repeat("p", 100)
		fs[0].Publish(r)
	}
	fs[0].Publish(sentinel(0))
	rs := got.until(t, "the sentinel", has(sentinel(0).ID))
	checkOrderOnce(t, rs, map[int]int{0: n})
	if rs[0].Path != "/"+strings.Repeat("p", 100) {
		t.Fatalf("path came back as %q", rs[0].Path)
	}
}

// Every replica's subscriber gets every replica's rejections, each once
// and in its publisher's order, while all publish at once. (Between
// replicas there is no order: each publishes on its own.)
func testFeedAcrossReplicas(t *testing.T, h FeedHarness) {
	const replicas, n = 3, 100
	fs, _ := h.feeds(t, replicas, feed.Options{})
	var subs []*received
	for _, f := range fs {
		subs = append(subs, subscribe(t, f))
	}
	var wg sync.WaitGroup
	for p, f := range fs {
		wg.Go(func() {
			for i := 1; i <= n; i++ {
				f.Publish(feedRejection(p, i))
			}
			f.Publish(sentinel(p))
		})
	}
	wg.Wait()
	want := map[int]int{}
	for p := range fs {
		want[p] = n
	}
	for s, sub := range subs {
		rs := sub.until(t, fmt.Sprintf("replica %d: every sentinel", s), func(rs []tokens.Rejection) bool {
			for p := range fs {
				if !has(sentinel(p).ID)(rs) {
					return false
				}
			}
			return true
		})
		checkOrderOnce(t, rs, want)
	}
}

// Close sends what was published before it: a replica shutting down
// leaves nothing of its queue out of the others' feeds. Publish after
// Close does nothing.
func testFeedCloseSendsQueued(t *testing.T, h FeedHarness) {
	n := 1
	if h.Deploy != nil {
		n = 2
	}
	fs, _ := h.feeds(t, n, feed.Options{})
	got := subscribe(t, fs[n-1])
	const count = 500
	for i := 1; i <= count; i++ {
		fs[0].Publish(feedRejection(0, i))
	}
	fs[0].Publish(sentinel(0))
	fs[0].Close()
	fs[0].Publish(feedRejection(0, count+1))
	if n == 1 {
		// In one process Close ends the feed: what was published before
		// has been delivered, nothing after.
		got.mu.Lock()
		rs := append([]tokens.Rejection(nil), got.got...)
		got.mu.Unlock()
		checkOrderOnce(t, rs, map[int]int{0: count})
		return
	}
	checkOrderOnce(t, got.until(t, "the sentinel from the closed replica", has(sentinel(0).ID)), map[int]int{0: count})
	// Nothing published after Close arrives: a later rejection from the
	// other replica comes next.
	fs[1].Publish(sentinel(1))
	rs := got.until(t, "the other replica's sentinel", has(sentinel(1).ID))
	checkOrderOnce(t, rs, map[int]int{0: count, 1: 0})
}

// stalledTransport holds every send until released.
type stalledTransport struct {
	feed.Transport
	release chan struct{}
	started chan struct{} // gets a value as each send starts
}

func (s *stalledTransport) PublishRejections(ctx context.Context, rs []tokens.Rejection) error {
	select {
	case s.started <- struct{}{}:
	default:
	}
	<-s.release
	return s.Transport.PublishRejections(ctx, rs)
}

// A transport that does not answer never holds Publish up: what fits the
// queue waits and is sent, in order, once the transport answers; the rest
// is left out and counted (the log has it).
func testFeedStalledTransport(t *testing.T, h FeedHarness) {
	d := h.Deploy(t, 2)
	stalled := &stalledTransport{Transport: d.Transports[0], release: make(chan struct{}), started: make(chan struct{}, 1)}
	const queue = 10
	pub := feed.NewReplicated(stalled, feed.Options{Queue: queue, Batch: 1, SendTimeout: time.Minute})
	t.Cleanup(pub.Close)
	sub := feed.NewReplicated(d.Transports[1], feed.Options{})
	t.Cleanup(sub.Close)
	got := subscribe(t, sub)
	const n = 100
	pub.Publish(feedRejection(0, 1))
	<-stalled.started // the loop holds rejection 1; the queue is empty
	for i := 2; i <= n; i++ {
		pub.Publish(feedRejection(0, i)) // returns although nothing is sent
	}
	if d := pub.Dropped(); d != n-1-queue {
		t.Fatalf("%d rejections left out, want %d (queue %d, one in the send)", d, n-1-queue, queue)
	}
	close(stalled.release)
	got.until(t, "what the queue held", func(rs []tokens.Rejection) bool { return len(rs) >= 1+queue })
	pub.Publish(sentinel(0)) // after the queue emptied: not left out
	rs := got.until(t, "the sentinel", has(sentinel(0).ID))
	checkOrderOnce(t, rs, map[int]int{0: 1 + queue})
}

// A subscriber that stalls for a while loses nothing that the transport
// buffers (a few hundred rejections): they arrive afterwards, in order.
func testFeedStalledSubscriber(t *testing.T, h FeedHarness) {
	fs, _ := h.feeds(t, 2, feed.Options{})
	hold := make(chan struct{})
	got := newReceived()
	got.hold = hold
	subscribeWith(t, fs[1], got)
	const n = 500
	for i := 1; i <= n; i++ {
		fs[0].Publish(feedRejection(0, i))
	}
	fs[0].Publish(sentinel(0))
	// fs[0] sends all of it while the subscriber is stuck in deliver.
	fs[0].Close()
	close(hold)
	checkOrderOnce(t, got.until(t, "the sentinel", has(sentinel(0).ID)), map[int]int{0: n})
}

// A listener whose session is killed reconnects by itself; what was
// published while it was away is missed (the feed is best effort), what is
// published after arrives, in order, once.
func testFeedReconnect(t *testing.T, h FeedHarness) {
	fs, d := h.feeds(t, 2, feed.Options{})
	if d.KillListeners == nil {
		t.Skip("the backend cannot kill its listeners")
	}
	subs := []*received{subscribe(t, fs[0]), subscribe(t, fs[1])}
	fs[0].Publish(feedRejection(0, 1))
	for _, s := range subs {
		s.until(t, "the first rejection", has(feedRejection(0, 1).ID))
	}
	d.KillListeners(t)
	// Probe until both listeners are back: ids 1, 2, ... from replica 1. A
	// probe published while a listener is still away never reaches it, so
	// each is given 100 ms before the next is sent.
	probe := 0
	waitSucceeds(t, 4*waitLimit, 0, "the listeners coming back", func() error {
		probe++
		fs[1].Publish(feedRejection(1, probe))
		missed := time.Now().Add(100 * time.Millisecond)
		for i, s := range subs {
			if _, ok := s.by(missed, has(feedRejection(1, probe).ID)); !ok {
				return fmt.Errorf("subscriber %d missed probe %d", i, probe)
			}
		}
		return nil
	})
	const n = 50
	for i := 2; i <= n+1; i++ {
		fs[0].Publish(feedRejection(0, i))
	}
	fs[0].Publish(sentinel(0))
	for _, s := range subs {
		rs := s.until(t, "the sentinel after the reconnect", has(sentinel(0).ID))
		var after []tokens.Rejection
		for _, r := range rs {
			if r.ID/1_000_000 == 0 { // replica 0's: 1 before the kill, 2..n+1 after
				after = append(after, r)
			}
		}
		checkOrderOnce(t, after, map[int]int{0: n + 1})
	}
}
