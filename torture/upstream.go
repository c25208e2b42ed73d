package torture

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// HeaderReplica carries, from worker to upstream through the gateway, the
// index of the replica a write was sent to, so that the nemesis can stop
// that replica inside the write.
const HeaderReplica = "X-Torture-Replica"

// Misbehaviour is what the upstream does to a share of the writes while a
// fault is on.
type Misbehaviour struct {
	// SlowPermille of the writes are applied and answered after a delay
	// drawn from [DelayMin, DelayMax] (past the gateway's forward timeout:
	// the gateway gives up, the write lands anyway).
	SlowPermille       int
	DelayMin, DelayMax time.Duration
	// DropPermille of the writes get their connection closed instead of an
	// answer; half of them are applied first.
	DropPermille int
}

// Upstream is the recording upstream: it logs every write that reaches it
// (resource, Fencing-Token, write id, arrival and application time) and
// misbehaves on demand. It listens on 127.0.0.1 only.
type Upstream struct {
	URL string

	srv      *http.Server
	inflight atomic.Int64
	mis      atomic.Pointer[Misbehaviour]
	// inWrite, if set, is called once with the next write's replica index
	// before it is applied (the nemesis stops that replica).
	inWrite atomic.Pointer[func(replica int)]
	// delayNext, if set, is called once with the next write as it arrives
	// and returns how long to hold it before applying it (DelayNext).
	delayNext atomic.Pointer[func(Arrival) time.Duration]

	mu       sync.Mutex
	seq      int64
	arrivals []Arrival
}

// NewUpstream starts a recording upstream.
func NewUpstream() (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{URL: "http://" + ln.Addr().String()}
	u.mis.Store(&Misbehaviour{})
	u.srv = &http.Server{Handler: http.HandlerFunc(u.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

// ListenAlso serves on a second address too, host's port chosen by the
// system, and returns its URL: the partitioned replica's namespace
// reaches the host only by its veth address.
func (u *Upstream) ListenAlso(host string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	go func() { _ = u.srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// Misbehave sets what the upstream does from now on; the zero value is
// normal service.
func (u *Upstream) Misbehave(m Misbehaviour) { u.mis.Store(&m) }

// StopInWrite arms fn to run inside the next write, after it arrived and
// before it is applied.
// StopInWrite(nil) disarms it.
func (u *Upstream) StopInWrite(fn func(replica int)) {
	if fn == nil {
		u.inWrite.Store(nil)
		return
	}
	u.inWrite.Store(&fn)
}

// DelayNext arms fn to be called with the next write as it arrives (not
// yet applied); the write is applied and answered after the delay fn
// returns. DelayNext(nil) disarms it.
func (u *Upstream) DelayNext(fn func(Arrival) time.Duration) {
	if fn == nil {
		u.delayNext.Store(nil)
		return
	}
	u.delayNext.Store(&fn)
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.inflight.Add(1)
	defer u.inflight.Add(-1)
	body, err := io.ReadAll(io.LimitReader(r.Body, 4096))
	if err != nil {
		return // the gateway died mid-request: nothing complete arrived
	}
	token, _ := strconv.ParseInt(r.Header.Get("Fencing-Token"), 10, 64)
	u.mu.Lock()
	u.seq++
	i := len(u.arrivals)
	u.arrivals = append(u.arrivals, Arrival{Seq: u.seq, Resource: r.Header.Get("Fencing-Resource"), Token: token, ID: string(body), Arrived: now()})
	u.mu.Unlock()

	if fn := u.inWrite.Swap(nil); fn != nil {
		replica, _ := strconv.Atoi(r.Header.Get(HeaderReplica))
		(*fn)(replica)
	}
	if fn := u.delayNext.Swap(nil); fn != nil {
		u.mu.Lock()
		a := u.arrivals[i]
		u.mu.Unlock()
		time.Sleep((*fn)(a))
	}
	m := u.mis.Load()
	dice := rand.IntN(1000)
	switch {
	case dice < m.DropPermille:
		if dice%2 == 0 {
			u.apply(i)
		}
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	case dice < m.DropPermille+m.SlowPermille:
		d := m.DelayMin
		if m.DelayMax > m.DelayMin {
			d += rand.N(m.DelayMax - m.DelayMin)
		}
		// The gateway gives up meanwhile; the write lands anyway.
		time.Sleep(d)
	}
	u.apply(i)
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "applied "+string(body)+"\n")
}

func (u *Upstream) apply(i int) {
	u.mu.Lock()
	u.arrivals[i].Applied = now()
	u.mu.Unlock()
}

// Arrivals returns a copy of what arrived so far.
func (u *Upstream) Arrivals() []Arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Arrival(nil), u.arrivals...)
}

// Close waits up to wait for delayed writes to land, then stops.
func (u *Upstream) Close(wait time.Duration) {
	for end := time.Now().Add(wait); u.inflight.Load() > 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = u.srv.Shutdown(ctx)
}

// now is the wall clock without its monotonic reading, so that times taken
// in different processes compare the same way as times taken here.
func now() time.Time { return time.Now().Round(0) }
