package torture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// FaultDiskFull fills the embedded store's --data file system (a small
// tmpfs the torture mounts, as root) with a filler file and frees it a
// moment later: while it is full, grants fail closed and nothing is
// forwarded without its record; afterwards the same process serves again.
const FaultDiskFull = "disk-full"

// diskFullSize is the tmpfs's size: room for the store file, little more.
const diskFullSize = "8m"

// mountSmallDisk mounts a tmpfs of diskFullSize on dir; the returned
// function unmounts it.
func mountSmallDisk(dir string) (func() error, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the disk-full fault mounts a tmpfs: run as root")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+diskFullSize, "tmpfs", dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount tmpfs on %s: %w: %s", dir, err, out)
	}
	return func() error {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			return fmt.Errorf("umount %s: %w: %s", dir, err, out)
		}
		return nil
	}, nil
}

// fillDisk writes to path until the file system is full, down to its last
// bytes.
func fillDisk(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for n := len(buf); n > 0; n /= 2 {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					return err
				}
				break
			}
		}
	}
	return nil
}

// diskFull fills the store's disk past the TTL (leases must be granted
// anew while it is full) and frees it.
func (n *nemesis) diskFull(ctx context.Context) error {
	if n.dataDisk == "" {
		return errNotApplicable
	}
	filler := filepath.Join(n.dataDisk, "filler")
	defer os.Remove(filler)
	if err := fillDisk(filler); err != nil {
		return err
	}
	sleep(ctx, n.between(2*n.cfg.TTL, 2*n.cfg.TTL+time.Second))
	return os.Remove(filler)
}

// FaultStallDisk stalls every write of the embedded store's disk (a
// SlowDisk, slowdisk.go, that the torture mounts on --dir/data, as root)
// for longer than the grant wait, then lets the held writes go: while it
// lasts, grants, renewals and releases answer 503 store_unavailable by
// their bounds (a commit the disk holds does not hold its callers), and a
// grant whose caller gave up is not made behind its back; afterwards the
// same process serves again.
const FaultStallDisk = "stall-disk"

// slowDiskSize is the stalled disk's size in MiB: room for ext4's journal
// and the store file.
const slowDiskSize = 64

// stallDisk stalls the store's disk past the grant wait and resumes it.
func (n *nemesis) stallDisk(ctx context.Context) error {
	if n.slowDisk == nil {
		return errNotApplicable
	}
	if err := n.slowDisk.Stall(); err != nil {
		return err
	}
	sleep(ctx, n.between(n.cfg.GrantWait+500*time.Millisecond, n.cfg.GrantWait+2*time.Second))
	return n.slowDisk.Resume()
}
