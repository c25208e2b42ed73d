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
