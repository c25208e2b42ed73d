package gateway

// Holders' clocks: the Fencing-Client-Time header, its estimate of a
// holder's clock offset, and the metric that exports it.

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/tokens"
)

// HeaderClientTime carries a caller's wall-clock time on acquire and
// renew: an RFC 3339 time, optionally followed by ";rtt=" and the round
// trip of its previous call in milliseconds. See tokens.Clocks.
const HeaderClientTime = "Fencing-Client-Time"

// maxReportedRTT bounds the round trip a client may report: past it the
// estimate would say nothing.
const maxReportedRTT = time.Minute

// parseClientTime reads a Fencing-Client-Time value.
func parseClientTime(v string) (sent time.Time, rtt time.Duration, err error) {
	ts, params, _ := strings.Cut(v, ";")
	sent, err = time.Parse(time.RFC3339Nano, strings.TrimSpace(ts))
	if err != nil {
		return time.Time{}, 0, tokens.Invalid(HeaderClientTime, "must be an RFC 3339 time, optionally followed by ;rtt=MILLISECONDS")
	}
	if params = strings.TrimSpace(params); params != "" {
		ms, ok := strings.CutPrefix(params, "rtt=")
		f, perr := strconv.ParseFloat(ms, 64)
		if !ok || perr != nil || f < 0 || time.Duration(f*float64(time.Millisecond)) > maxReportedRTT {
			return time.Time{}, 0, tokens.Invalid(HeaderClientTime, "rtt must be a round trip in milliseconds, 0 to 60000")
		}
		rtt = time.Duration(f * float64(time.Millisecond))
	}
	return sent, rtt, nil
}

// observeClock records holder's clock from a Fencing-Client-Time value
// (nil: none sent) on a request that arrived at arrived.
func (c *control) observeClock(v *string, holder string, arrived time.Time) error {
	if v == nil {
		return nil
	}
	// An acquire without a holder is labelled by the gateway; its clock is
	// checked but not kept (it would not say whose it is).
	sent, rtt, err := parseClientTime(*v)
	if err != nil {
		return err
	}
	if holder != "" {
		c.clocks.Observe(holder, sent, rtt, arrived)
	}
	return nil
}

// clockCollector exports the holders' clock offsets at scrape time: one
// series per holder heard from in the last tokens.ClockMaxAge, at most
// tokens.MaxClockHolders of them.
type clockCollector struct {
	clocks *tokens.Clocks
	now    func() time.Time
	desc   *prometheus.Desc
}

func newClockCollector(clocks *tokens.Clocks, now func() time.Time) *clockCollector {
	return &clockCollector{clocks: clocks, now: now, desc: prometheus.NewDesc("fencegw_holder_clock_offset_seconds",
		"Each holder's wall clock minus the gateway's, estimated from the Fencing-Client-Time of its acquires and renewals (corrected by half the round trip it reports); holders heard from in the last 15 min, at most 256.",
		[]string{"holder"}, nil)}
}

func (c *clockCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *clockCollector) Collect(ch chan<- prometheus.Metric) {
	for _, o := range c.clocks.All(c.now()) {
		holder := o.Holder
		if !utf8.ValidString(holder) {
			holder = strings.ToValidUTF8(holder, "\uFFFD")
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, o.Offset.Seconds(), holder)
	}
}
