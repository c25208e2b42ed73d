// Package refusingdisk gives tests a file system whose files can be made to
// refuse every write, and then take writes again: an ext4 image of the
// test's own on a loop device, where chattr +i makes each write to an open
// file fail (EPERM), as a failing disk's writes fail. It needs root,
// mkfs.ext4, mount and chattr; without them a test is skipped, or fails
// under CI=true (a missing fault must never pass silently in CI).
package refusingdisk

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Mount mounts a fresh 32 MiB ext4 file system and returns its directory;
// it is unmounted (its files made writable first) when the test ends.
func Mount(t testing.TB) string {
	t.Helper()
	need := func(msg string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatal("a disk that refuses writes: " + msg)
		}
		t.Skip("a disk that refuses writes: " + msg)
	}
	if os.Geteuid() != 0 {
		need("mounting an ext4 image needs root")
	}
	for _, bin := range []string{"mkfs.ext4", "mount", "umount", "chattr"} {
		if _, err := exec.LookPath(bin); err != nil {
			need(err.Error())
		}
	}
	base := t.TempDir()
	img, dir := filepath.Join(base, "disk.ext4"), filepath.Join(base, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 32<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		need(fmt.Sprintf("mount -o loop: %v: %s", err, out))
	}
	t.Cleanup(func() {
		// A file left immutable could not be removed with the directory.
		_ = exec.Command("chattr", "-R", "-i", dir).Run()
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// Refuse makes file refuse every write until heal is called (once).
func Refuse(t testing.TB, file string) (heal func(), err error) {
	if out, err := exec.Command("chattr", "+i", file).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("chattr +i %s: %w: %s", file, err, out)
	}
	return func() {
		if out, err := exec.Command("chattr", "-i", file).CombinedOutput(); err != nil {
			t.Errorf("chattr -i %s: %v: %s", file, err, out)
		}
	}, nil
}
