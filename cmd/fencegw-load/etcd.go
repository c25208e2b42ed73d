package main

// The grants' peer: lock acquisitions on etcd, what a user would run
// instead of fencegw's grants. fencegw-load starts Debian's etcd (one
// member, its WAL fsync'd as fencegw's store is) and runs tools/etcd-locks,
// a module of its own so that fencegw's module does not depend on etcd's
// client, with as many acquirers for as long as the gateway's grants.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/bench"
)

// etcdLocksBuild is how to build the acquirers' program, from the
// repository's root.
const etcdLocksBuild = "go build -C tools/etcd-locks -o /tmp/etcd-locks ."

// etcdResult is what tools/etcd-locks prints.
type etcdResult struct {
	Acquisitions int64   `json:"acquisitions"`
	Errors       int64   `json:"errors"`
	FirstError   string  `json:"first_error"`
	PerSecond    float64 `json:"per_second"`
	P50US        float64 `json:"p50_us"`
	P90US        float64 `json:"p90_us"`
	P99US        float64 `json:"p99_us"`
	MaxUS        float64 `json:"max_us"`
	// ServerCPU is etcd's CPU per acquisition, read by fencegw-load.
	ServerCPU time.Duration `json:"-"`
}

// lookEtcd finds etcd's server and the acquirers' program.
func lookEtcd(server, locks string) (serverBin, locksBin string, err error) {
	if serverBin, err = exec.LookPath(server); err != nil {
		return "", "", fmt.Errorf("-etcd: no etcd server %q (Debian: apt-get install etcd-server): %w", server, err)
	}
	if locksBin, err = exec.LookPath(locks); err == nil {
		locksBin, err = filepath.Abs(locksBin)
	}
	if err != nil {
		return "", "", fmt.Errorf("-etcd-locks: no program %q (%w): build it with `%s`", locks, err, etcdLocksBuild)
	}
	return serverBin, locksBin, nil
}

// runEtcdLocks starts a one-member etcd in a directory of its own, drives
// it with acquirers for d after warmup, and stops it. Acquisitions etcd
// refused (its own "request timed out" when its WAL's fsync stalls on a
// loaded machine) are the peer's figure, counted in the result; only a
// run with none that succeeded is an error.
func runEtcdLocks(ctx context.Context, serverBin, locksBin string, acquirers int, d, warmup time.Duration) (etcdResult, error) {
	client, dir, err := childPlace("etcd")
	if err != nil {
		return etcdResult{}, err
	}
	peerPort, err := freePort()
	if err != nil {
		return etcdResult{}, err
	}
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	args := []string{
		"--name", "fencegw-load", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "http://" + client, "--advertise-client-urls", "http://" + client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "fencegw-load=" + peerURL, "--log-level", "warn",
	}
	p, err := startChild(ctx, "etcd", serverBin, args, dir, client, false)
	if err != nil {
		return etcdResult{}, err
	}
	defer p.stop()
	// The acquirers run in their own process (as the gateway's clients run
	// in this one), so that the server's CPU is etcd's alone; a first run
	// warms etcd up, unmeasured.
	locks := func(d time.Duration) (etcdResult, error) {
		// Each run its own fresh keys.
		prefix := "fencegw-load/lock/" + strconv.FormatInt(time.Now().UnixNano(), 36) + "/"
		cmd := exec.CommandContext(ctx, locksBin, "-endpoint", client, "-acquirers", strconv.Itoa(acquirers),
			"-duration", d.String(), "-warmup", "0s", "-prefix", prefix)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return etcdResult{}, fmt.Errorf("etcd-locks: %w: %s", err, strings.TrimSpace(errOut.String()))
		}
		var r etcdResult
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			return etcdResult{}, fmt.Errorf("etcd-locks printed %q: %w", out.String(), err)
		}
		return r, nil
	}
	if warmup > 0 {
		if _, err := locks(warmup); err != nil {
			return etcdResult{}, err
		}
	}
	cpu0 := bench.GroupCPU(p.cmd.Process.Pid)
	r, err := locks(d)
	if err != nil {
		return etcdResult{}, err
	}
	if r.Acquisitions > 0 {
		r.ServerCPU = (bench.GroupCPU(p.cmd.Process.Pid) - cpu0) / time.Duration(r.Acquisitions)
	}
	if r.Acquisitions == 0 && r.Errors > 0 {
		return r, fmt.Errorf("no etcd acquisition succeeded (%d failed); first: %s", r.Errors, r.FirstError)
	}
	return r, nil
}
