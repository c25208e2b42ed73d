package web

// The templates' helpers and the overview's chart.

import (
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"time"
)

var funcs = template.FuncMap{
	"clock":       clock,
	"stamp":       func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"day":         func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"pathEscape":  url.PathEscape,
	"ago":         func(from, to time.Time) string { return human(to.Sub(from)) },
	"human":       human,
	"rangeURL":    rangeURL,
	"resourceURL": func(name string) string { return "/ui/resources/" + url.PathEscape(name) },
	"axisY":       func(h int) int { return h - chartFoot },
	"labelY":      func(h int) int { return h - 4 },
	"plural":      plural,
	"offset":      offset,
	"inc":         func(n int) int { return n + 1 },
	"dec":         func(n int) int { return n - 1 },
	"rowFrom":     func(page int) int { return (page-1)*timelineRows + 1 },
	"rowTo":       func(page, rows int) int { return min(page*timelineRows, rows) },
}

// plural picks the singular for exactly one: "1 write", "2 writes", "0 writes".
func plural(n any, one, many string) string {
	switch v := n.(type) {
	case int:
		if v == 1 {
			return one
		}
	case int64:
		if v == 1 {
			return one
		}
	case uint64:
		if v == 1 {
			return one
		}
	case *uint64:
		if v != nil && *v == 1 {
			return one
		}
	}
	return many
}

func queryEscape(s string) string { return url.QueryEscape(s) }

// clock shows a time as UTC wall-clock seconds, with milliseconds only when
// two events in the same second must be told apart.
func clock(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("15:04:05.000")
}

// human formats a duration for people: 850 ms, 15.2 s, 3 min 4 s, 2 h 5 min.
func human(d time.Duration) string {
	if d < 0 {
		return "-" + human(-d)
	}
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
	case d < time.Minute && d%time.Second == 0:
		return strconv.Itoa(int(d.Seconds())) + " s"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	case d < time.Hour && d%time.Minute == 0:
		return strconv.Itoa(int(d.Minutes())) + " min"
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d%time.Hour == 0:
		return strconv.Itoa(int(d.Hours())) + " h"
	}
	return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
}

// rangeURL is the overview with the same filters over another range.
func rangeURL(f Filter, key string) string {
	v := url.Values{}
	v.Set("range", key)
	for k, s := range map[string]string{"resource": f.Resource, "holder": f.Holder, "code": f.Code} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return "/ui/?" + v.Encode()
}

// chart is the rejections-over-time bar chart, laid out on the server and
// drawn as inline SVG (no script, no inline style).
type chart struct {
	W, H   int
	Bars   []bar
	Max    int
	Sum    int // the bars' total: the range's total, always
	From   string
	To     string
	Bucket string
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

const (
	chartW    = 720
	chartH    = 160
	chartTop  = 14
	chartFoot = 18
)

func drawChart(ov Overview, r Range) chart {
	c := chart{W: chartW, H: chartH, Bucket: human(r.Bucket)}
	for _, b := range ov.Buckets {
		c.Max = max(c.Max, b.Count)
		c.Sum += b.Count
	}
	if len(ov.Buckets) == 0 {
		return c
	}
	c.From = clock(ov.Buckets[0].Start)[:5]
	c.To = clock(ov.Buckets[len(ov.Buckets)-1].Start.Add(r.Bucket))[:5]
	plot := float64(chartH - chartTop - chartFoot)
	w := float64(chartW) / float64(len(ov.Buckets))
	for i, b := range ov.Buckets {
		h := 0.0
		if c.Max > 0 {
			h = plot * float64(b.Count) / float64(c.Max)
		}
		if b.Count > 0 && h < 2 {
			h = 2
		}
		c.Bars = append(c.Bars, bar{
			X: float64(i)*w + 1, W: max(w-2, 1), Y: float64(chartTop) + plot - h, H: h,
			Title: fmt.Sprintf("%s–%s UTC: %d rejected", clock(b.Start)[:8], clock(b.Start.Add(r.Bucket))[:8], b.Count),
		})
	}
	return c
}

// offset shows a clock offset with its sign: "+9.0 s ahead", "-850 ms behind".
func offset(d *time.Duration) string {
	switch {
	case *d > 0:
		return "+" + human(*d) + " ahead"
	case *d < 0:
		return "-" + human(-*d) + " behind"
	}
	return "in step"
}
