package torture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SlowDisk is a real disk whose writes can be stalled: an ext4 file system
// on a loop device over a file, mounted on Dir, and a blkio cgroup whose
// processes' writes to that device the kernel's block throttle holds
// (blkio.throttle.write_bps_device). Stalled, a commit's pwrite and
// fdatasync wait in the block layer as on a degraded volume or a throttled
// cloud disk; resumed, the held writes go out at once.
//
// Why not a device-mapper delay target: the kernels this runs on (CI's
// and the developers' VMs) have no device-mapper driver (dmsetup fails
// with "/dev/mapper/control: No such device"); the blkio throttle and
// loop devices are there. It needs root and cgroup v1's blkio hierarchy.
type SlowDisk struct {
	Dir string

	img    string // the file behind the loop device
	loop   string // /dev/loopN
	majMin string // the loop device's "major:minor"
	cgroup string // the blkio cgroup's directory
	home   string // the blkio cgroup the joined processes go back to
	undo   []func() error
}

// blkioRoot is where cgroup v1's blkio hierarchy is mounted.
const blkioRoot = "/sys/fs/cgroup/blkio"

// diskCommandTimeout bounds each losetup, mkfs and mount.
const diskCommandTimeout = 30 * time.Second

// stalledBPS is the write rate of a stalled disk: one byte a second holds
// a page's write for over an hour, until Resume.
const stalledBPS = 1

// SlowDiskUnsupported says why a SlowDisk cannot be made here ("" if it
// can be tried): not root, or no losetup, mkfs.ext4 or blkio throttle.
func SlowDiskUnsupported() string {
	if os.Geteuid() != 0 {
		return "a stalled disk needs root (a loop device, a mount, a blkio cgroup)"
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is missing (Debian's mount and e2fsprogs)"
		}
	}
	if _, err := os.Stat(filepath.Join(blkioRoot, "blkio.throttle.write_bps_device")); err != nil {
		return "no blkio throttle in " + blkioRoot + " (cgroup v1's blkio hierarchy)"
	}
	return ""
}

// MountSlowDisk makes a disk of sizeMiB MiB (its backing file in work)
// and mounts it on dir, unstalled. Close undoes all of it, also after a
// failure midway.
func MountSlowDisk(work, dir string, sizeMiB int) (d *SlowDisk, err error) {
	if why := SlowDiskUnsupported(); why != "" {
		return nil, errors.New(why)
	}
	d = &SlowDisk{Dir: dir, img: filepath.Join(work, "slowdisk.img")}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.Close())
			d = nil
		}
	}()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return d, err
	}
	f, err := os.Create(d.img)
	if err != nil {
		return d, err
	}
	d.undo = append(d.undo, func() error { return os.Remove(d.img) })
	err = f.Truncate(int64(sizeMiB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return d, err
	}
	out, err := run(context.Background(), diskCommandTimeout, "losetup", "--find", "--show", d.img)
	if err != nil {
		return d, err
	}
	d.loop = strings.TrimSpace(out)
	d.undo = append(d.undo, func() error {
		_, err := run(context.Background(), diskCommandTimeout, "losetup", "-d", d.loop)
		return err
	})
	if _, err := run(context.Background(), diskCommandTimeout, "mkfs.ext4", "-q", d.loop); err != nil {
		return d, err
	}
	if _, err := run(context.Background(), diskCommandTimeout, "mount", d.loop, dir); err != nil {
		return d, err
	}
	d.undo = append(d.undo, func() error { _, err := run(context.Background(), diskCommandTimeout, "umount", dir); return err })
	if d.majMin, err = deviceNumber(d.loop); err != nil {
		return d, err
	}
	d.home = blkioRoot
	d.cgroup = filepath.Join(blkioRoot, fmt.Sprintf("fencegw-slowdisk-%d-%s", os.Getpid(), filepath.Base(d.loop)))
	if err := os.Mkdir(d.cgroup, 0o755); err != nil {
		return d, err
	}
	d.undo = append(d.undo, d.removeCgroup)
	return d, nil
}

// deviceNumber is a block device's "major:minor".
func deviceNumber(dev string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "dev"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Join puts process pid in the disk's cgroup: its writes to the disk are
// held while it is stalled. A process's children started later are in it
// too.
func (d *SlowDisk) Join(pid int) error {
	return os.WriteFile(filepath.Join(d.cgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// Stall holds every write of the joined processes to the disk.
func (d *SlowDisk) Stall() error { return d.throttle(stalledBPS) }

// Resume lifts the stall: the held writes go out at once.
func (d *SlowDisk) Resume() error { return d.throttle(0) }

func (d *SlowDisk) throttle(bps int) error {
	rule := fmt.Sprintf("%s %d", d.majMin, bps)
	return os.WriteFile(filepath.Join(d.cgroup, "blkio.throttle.write_bps_device"), []byte(rule), 0)
}

// removeCgroup lifts the stall, moves what is left in the cgroup back to
// the root one and removes it.
func (d *SlowDisk) removeCgroup() error {
	errs := []error{d.Resume()}
	if b, err := os.ReadFile(filepath.Join(d.cgroup, "cgroup.procs")); err == nil {
		for _, pid := range strings.Fields(string(b)) {
			if err := os.WriteFile(filepath.Join(d.home, "cgroup.procs"), []byte(pid), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("move %s out of %s: %w", pid, d.cgroup, err))
			}
		}
	}
	errs = append(errs, os.Remove(d.cgroup))
	return errors.Join(errs...)
}

// Close resumes the disk and removes the cgroup, the mount, the loop
// device and its file, in that order; it reports every step that failed.
func (d *SlowDisk) Close() error {
	var errs []error
	for i := len(d.undo) - 1; i >= 0; i-- {
		errs = append(errs, d.undo[i]())
	}
	d.undo = nil
	return errors.Join(errs...)
}
