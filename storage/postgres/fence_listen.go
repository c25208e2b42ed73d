package postgres

// The fence's listener: the session on which a replica hears requests to
// give its fences up (see the comment at the top of fence.go).

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// listenLoop hears yield requests from every replica; after each
// (re)connect it gives up every fence, since requests may have been missed.
func (f *Fence) listenLoop(ready chan struct{}) {
	defer f.wg.Done()
	backoff := 50 * time.Millisecond
	first := true
	for {
		err := f.listenOnce(func() {
			backoff = 50 * time.Millisecond
			if first {
				first = false
				close(ready)
			} else {
				f.yieldAll()
			}
		})
		select {
		case <-f.stop:
			return
		default:
		}
		f.log.Warn("fence listener: reconnecting; every fence is given up", "err", err, "in", backoff)
		f.yieldAll()
		select {
		case <-f.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func (f *Fence) listenOnce(listening func()) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-f.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := pgx.ConnectConfig(cctx, f.store.sessionConfig(f.opts.Replica))
	ccancel()
	if err != nil {
		return err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(c)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{f.channel}.Sanitize()); err != nil {
		return err
	}
	f.listenerPID.Store(conn.PgConn().PID())
	listening()
	for {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		n, err := conn.WaitForNotification(wctx)
		wcancel()
		switch {
		case err == nil:
			if resource, ok := strings.CutPrefix(n.Payload, notifyFree); ok {
				if fn := f.onFree.Load(); fn != nil {
					(*fn)(resource)
				}
				continue
			}
			f.yield(n.Payload)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// Quiet: make sure the connection is still alive.
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, err = conn.Exec(pctx, "SELECT 1")
			pcancel()
			if err != nil {
				return err
			}
		default:
			return err
		}
	}
}
