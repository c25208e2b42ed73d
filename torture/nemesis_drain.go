package torture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
)

// FaultStoreRefusesDrain is a double fault: a write is held at the upstream
// past the forward timeout (it lands within the drain period, as with
// slow-upstream), and at the moment the gateway gives up on it the store
// refuses to record the drain, then takes writes again a moment later.
// In the PostgreSQL modes a session of its own holds the resource's fences
// row FOR UPDATE (a long transaction, a migration) and the drain's UPDATE,
// waiting on it, is cancelled as its statement timeout would cancel it
// (sooner, to fit the torture's short drain period); in the embedded mode
// the store's file refuses every write (it is made immutable on an ext4
// file system the torture mounts, as root: each write fails with EPERM).
// A gateway that gives the fence up when the record fails lets a grant
// through as soon as the store is back, before the old write lands.
const FaultStoreRefusesDrain = "store-refuses-drain"

// mountRefusingDisk mounts a small ext4 file system (a loop device on an
// image beside dir) on dir; the returned function unmounts it and removes
// the image.
func mountRefusingDisk(ctx context.Context, dir string) (func() error, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the store-refuses-drain fault mounts an ext4 image: run as root")
	}
	if _, err := exec.LookPath("chattr"); err != nil {
		return nil, fmt.Errorf("the store-refuses-drain fault makes the store's file immutable: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	img := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+".ext4")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		return nil, err
	}
	if _, err := run(ctx, time.Minute, "mkfs.ext4", "-q", "-F", img); err != nil {
		return nil, err
	}
	if _, err := run(ctx, time.Minute, "mount", "-o", "loop", img, dir); err != nil {
		return nil, err
	}
	return func() error {
		_, err := run(context.Background(), time.Minute, "umount", dir)
		return errors.Join(err, os.Remove(img))
	}, nil
}

// storeRefusesDrain holds the next write past the forward timeout and has
// the store refuse every drain from its arrival until a moment after its
// timeout.
func (n *nemesis) storeRefusesDrain(ctx context.Context) error {
	var refuse func(resource string) (heal func(), err error)
	switch {
	case n.refusing != "":
		refuse = func(string) (func(), error) { return n.refuseFile(ctx) }
	case n.pg != nil:
		refuse = func(resource string) (func(), error) { return n.holdFencesRow(ctx, resource) }
	default:
		return errNotApplicable
	}
	// The write lands within the drain period its timeout starts, with
	// slow-upstream's margin; the store refuses until a moment after the
	// timeout, leaving the rest of the period for a grant to slip in.
	hold := n.cfg.DrainPeriod - 300*time.Millisecond
	refused := n.cfg.ForwardTimeout + 150*time.Millisecond
	type armed struct {
		at   time.Time
		heal func()
		err  error
	}
	got := make(chan armed, 1)
	n.up.DelayNext(func(a Arrival) time.Duration {
		heal, err := refuse(a.Resource)
		got <- armed{time.Now(), heal, err}
		return hold
	})
	var a armed
	select {
	case a = <-got:
	case <-time.After(5 * time.Second):
		n.up.DelayNext(nil)
		select { // armed a moment too late
		case a = <-got:
		case <-time.After(100 * time.Millisecond):
			return errNotApplicable
		}
	}
	if a.err != nil {
		return a.err
	}
	sleep(ctx, time.Until(a.at.Add(refused)))
	a.heal()
	sleep(ctx, time.Until(a.at.Add(hold))) // the held write lands
	return nil
}

// refuseFile makes the embedded store's file refuse writes until heal.
func (n *nemesis) refuseFile(ctx context.Context) (func(), error) {
	if _, err := run(ctx, 10*time.Second, "chattr", "+i", n.refusing); err != nil {
		return nil, err
	}
	return func() {
		if _, err := run(context.Background(), 10*time.Second, "chattr", "-i", n.refusing); err != nil {
			n.logf("store-refuses-drain: the store's file still refuses writes: %v", err)
		}
	}, nil
}

// holdFencesRow takes resource's fences row FOR UPDATE on a session of its
// own and, until heal, cancels every drain statement waiting on it.
func (n *nemesis) holdFencesRow(ctx context.Context, resource string) (func(), error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, n.pg.URL)
	if err != nil {
		return nil, fmt.Errorf("store-refuses-drain: %w", err)
	}
	tx, err := conn.Begin(cctx)
	if err == nil {
		_, err = tx.Exec(cctx, `SELECT 1 FROM fences WHERE resource = $1 FOR UPDATE`, resource)
	}
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("store-refuses-drain: lock the fences row: %w", err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			qctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := tx.Exec(qctx, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'
				AND ltrim(query, E' \t\n') LIKE 'UPDATE fences%drain_until%'`)
			cancel()
			if err != nil {
				n.logf("store-refuses-drain: cancel the waiting drains: %v", err)
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		_ = tx.Rollback(context.Background())
		_ = conn.Close(context.Background())
	}, nil
}
