package web

// A Source whose texts are made valid UTF-8 for the pages.

import (
	"context"
	"strings"

	"github.com/fencegw/fencegw/tokens"
)

// validUTF8 is a Source whose rejections and events hold only valid UTF-8.
// html/template passes invalid bytes through, and records written before
// the gateway's path rule refused invalid UTF-8 (or cut a long path inside
// a character) can hold them: the dashboard shows U+FFFD instead and never
// emits invalid UTF-8.
type validUTF8 struct{ Source }

func (v validUTF8) Rejections(ctx context.Context, q tokens.RejectionQuery) ([]tokens.Rejection, error) {
	rs, err := v.Source.Rejections(ctx, q)
	for i := range rs {
		r := &rs[i]
		for _, s := range []*string{&r.Resource, &r.Code, &r.Holder, &r.LeaseHint, &r.Method, &r.Upstream, &r.Path, &r.Principal} {
			*s = strings.ToValidUTF8(*s, "\uFFFD")
		}
	}
	return rs, err
}

func (v validUTF8) History(ctx context.Context, resource string, limit int) ([]tokens.Event, error) {
	evs, err := v.Source.History(ctx, resource, limit)
	for i := range evs {
		evs[i].Holder = strings.ToValidUTF8(evs[i].Holder, "\uFFFD")
		evs[i].Actor = strings.ToValidUTF8(evs[i].Actor, "\uFFFD")
		if k := evs[i].Key; k != nil {
			for _, s := range []*string{&k.Upstream, &k.Key, &k.Principal, &k.Code} {
				*s = strings.ToValidUTF8(*s, "\uFFFD")
			}
		}
	}
	return evs, err
}

func (v validUTF8) CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error) {
	ls, err := v.Source.CurrentLeases(ctx, limit)
	for i := range ls {
		ls[i].Holder = strings.ToValidUTF8(ls[i].Holder, "\uFFFD")
	}
	return ls, err
}
