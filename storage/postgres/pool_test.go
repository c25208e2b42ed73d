package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// A pool whose every connection is in use is reported as busy, not as a
// store that cannot be reached.
func TestExhaustedPoolsSaySo(t *testing.T) {
	t.Parallel()
	s := pgtest.Open(t, pgtest.NewSchema(t), postgres.Options{MaxConns: 2, MaxLockConns: 1})
	ctx := t.Context()
	for range 2 {
		c, err := s.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := s.Resource(short, "r")
	if e := tokens.ErrorOf(err); !errors.Is(err, tokens.ErrStoreUnavailable) || e == nil || !e.Busy {
		t.Fatalf("query with the pool exhausted: %v; want ErrStoreUnavailable marked busy", err)
	}
	// Every kind of query says so, not only the lease queries: the write
	// counts and the idempotency records used to report an exhausted pool
	// as a database that cannot be reached.
	for what, query := range map[string]func(context.Context) error{
		"lookup idempotency key": func(ctx context.Context) error {
			_, err := s.LookupKey(ctx, tokens.KeyScope{Resource: "r", Upstream: "u", Key: "k"})
			return err
		},
		"add writes": func(ctx context.Context) error {
			return s.AddWrites(ctx, []tokens.TokenWrites{{Resource: "r", Token: 1, N: 1}})
		},
	} {
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := query(short)
		cancel()
		if e := tokens.ErrorOf(err); !errors.Is(err, tokens.ErrStoreUnavailable) || e == nil || !e.Busy {
			t.Fatalf("%s with the pool exhausted: %v; want ErrStoreUnavailable marked busy", what, err)
		}
	}

	held, err := s.ExclusiveFence(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock()
	short2, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	_, err = s.ExclusiveFence(short2, "b")
	if e := tokens.ErrorOf(err); !errors.Is(err, tokens.ErrStoreUnavailable) || e == nil || !e.Busy {
		t.Fatalf("lock with the lock pool exhausted: %v; want ErrStoreUnavailable marked busy", err)
	}
}
