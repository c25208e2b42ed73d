package redis

import (
	"context"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/tokens"
)

// Live fan-out of rejections over Redis pub/sub: every replica publishes the
// rejections it records and every replica subscribes, so each dashboard's
// live stream shows all of them. Pub/sub is best effort (a subscriber that
// is reconnecting misses messages); the Ledger's rejection log is the record.

func (s *Store) channel() string { return s.prefix + "rejections" }

// maxPublishPayload bounds one pub/sub message.
const maxPublishPayload = 64 << 10

var _ feed.Transport = (*Store)(nil)

// PublishRejections sends rs to every replica's ListenRejections, packed
// into as few messages as fit, in one pipeline (so in order).
func (s *Store) PublishRejections(ctx context.Context, rs []tokens.Rejection) error {
	payloads, err := feed.EncodeRejections(rs, maxPublishPayload)
	if err != nil {
		return unavailable("encode rejection", err)
	}
	_, err = s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, b := range payloads {
			p.Publish(ctx, s.channel(), b)
		}
		return nil
	})
	if err != nil {
		return unavailable("publish", err)
	}
	return nil
}

// ListenRejections calls fn for every published rejection, from every
// replica, and ready (if set) each time the subscription is (again) in
// effect. The subscription reconnects by itself (go-redis resubscribes
// after a broken connection; what is published meanwhile is missed) until
// ctx is done; it then returns ctx.Err(). fn runs on the listening
// goroutine: it must not block (feed.Transport).
func (s *Store) ListenRejections(ctx context.Context, fn func(tokens.Rejection), ready func()) error {
	sub := s.rdb.Subscribe(ctx, s.channel())
	defer sub.Close()
	// Receive blocks in a network read that ignores ctx: closing the
	// subscription is what ends it.
	stop := context.AfterFunc(ctx, func() { _ = sub.Close() })
	defer stop()
	for {
		msg, err := sub.Receive(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			// go-redis reconnects on the next Receive; don't spin.
			s.log.Error("rejection subscriber: reconnecting", "err", err)
			t := time.NewTimer(200 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		switch m := msg.(type) {
		case *goredis.Subscription:
			if ready != nil && m.Kind == "subscribe" {
				ready() // (again) subscribed: publishes from now on arrive
			}
		case *goredis.Message:
			rs, err := feed.DecodeRejections([]byte(m.Payload))
			if err != nil {
				s.log.Error("rejection subscriber: bad payload", "err", err)
			}
			for _, r := range rs {
				fn(r)
			}
		}
	}
}
