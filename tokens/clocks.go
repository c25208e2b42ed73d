package tokens

// Holders' clock offsets, as estimated from the times they report.

import (
	"sort"
	"sync"
	"time"
)

// Clocks keeps each holder's clock offset as estimated from the
// Fencing-Client-Time its acquires and renewals carry. Lease time is the
// gateway's, so a skewed worker clock cannot break the fence; but a worker
// whose clock is seconds off plans its renewals wrong and is fenced again
// and again, and nothing else would tell. Safe for concurrent use.
//
// At most MaxClockHolders holders are kept (the least recently heard from
// is forgotten first), and an estimate older than ClockMaxAge is dropped,
// so that the metric's label cardinality stays bounded.
type Clocks struct {
	mu      sync.Mutex
	holders map[string]ClockOffset
}

// Bounds of Clocks.
const (
	MaxClockHolders = 256
	ClockMaxAge     = 15 * time.Minute
)

// ClockOffset is one holder's latest estimate.
type ClockOffset struct {
	Holder string
	// Offset is the holder's clock minus the gateway's: positive when
	// the holder's clock is ahead.
	Offset time.Duration
	// Uncertainty is half the round trip the estimate was corrected for
	// (the one-way delay is somewhere between 0 and the round trip); 0
	// when the client sent none, and then Offset is low by up to the
	// request's one-way delay.
	Uncertainty time.Duration
	At          time.Time // gateway time of the estimate
}

// NewClocks returns an empty Clocks.
func NewClocks() *Clocks { return &Clocks{holders: map[string]ClockOffset{}} }

// Observe records that holder's request, sent at clientSent by its clock
// after a previous round trip of rtt (0: unknown), arrived at arrived by
// the gateway's clock; it returns the estimate. The request took between 0
// and rtt to arrive; half of rtt is the estimate of its one-way delay.
// Nil-safe.
func (c *Clocks) Observe(holder string, clientSent time.Time, rtt time.Duration, arrived time.Time) ClockOffset {
	o := ClockOffset{Holder: holder, Offset: clientSent.Add(rtt / 2).Sub(arrived), Uncertainty: rtt / 2, At: arrived}
	if c == nil {
		return o
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.holders[holder]; !ok && len(c.holders) >= MaxClockHolders {
		oldest := ""
		for h, e := range c.holders {
			if oldest == "" || e.At.Before(c.holders[oldest].At) {
				oldest = h
			}
		}
		delete(c.holders, oldest)
	}
	c.holders[holder] = o
	return o
}

// Offset returns holder's estimate, if one younger than ClockMaxAge (at
// now) is known. Nil-safe.
func (c *Clocks) Offset(holder string, now time.Time) (ClockOffset, bool) {
	if c == nil {
		return ClockOffset{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.holders[holder]
	if !ok || now.Sub(o.At) > ClockMaxAge {
		return ClockOffset{}, false
	}
	return o, true
}

// All returns the estimates younger than ClockMaxAge at now, by holder,
// and forgets the older ones. Nil-safe.
func (c *Clocks) All(now time.Time) []ClockOffset {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ClockOffset, 0, len(c.holders))
	for h, o := range c.holders {
		if now.Sub(o.At) > ClockMaxAge {
			delete(c.holders, h)
			continue
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Holder < out[j].Holder })
	return out
}
