package main

// Reloading the configuration while serving. On SIGHUP, and when the
// configuration file, the auth file or the TLS certificate or key is
// replaced, the configuration is read again as at start (the same flags
// and variables, the files as they are now) and its live part (upstreams,
// credentials, routes, observed upstreams, allowed hosts, API keys: the
// gateway's Reload, which swaps them as one) and the certificate are
// applied. Settings that cannot change in place are named in one line and
// left as they are. A configuration that does not read is refused in one
// line, and the one in use stays.
//
// Replacement is seen by polling each file's identity (device, inode,
// size, modification time, through symlinks) once a second, not by
// fsnotify: Kubernetes replaces a mounted ConfigMap or Secret by swapping
// a symlink in the directory above the file, which an inotify watch on the
// file never reports and a watch on the directory reports as events on
// names other than the file's; a stat through the symlink sees the new
// file whatever way it was replaced, costs four syscalls a second and no
// dependency.

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/gateway"
)

// reloader applies reloads to a running gateway.
type reloader struct {
	gw   *gateway.Gateway
	log  *slog.Logger
	cert *atomic.Pointer[tls.Certificate] // nil without TLS
	cur  config                           // the configuration in use
	seen string                           // the files' identities when cur was read
}

// liveOf is the part of cfg the gateway swaps in place.
func liveOf(cfg config) gateway.Live {
	l := gateway.Live{Upstreams: cfg.Upstreams, AllowedHosts: cfg.AllowedHosts, Routes: cfg.Routes, Observe: cfg.Observe}
	if cfg.Auth != nil {
		l.Auth, l.UpstreamHeaders = cfg.Auth.Keys, cfg.Auth.UpstreamHeaders
	}
	return l
}

// run reloads on SIGHUP and when a file is replaced, until ctx ends.
func (rl *reloader) run(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			rl.reload("SIGHUP")
		case <-tick.C:
			if ids := fileIdentities(rl.cur); ids != rl.seen {
				rl.reload("a file was replaced")
			}
		}
	}
}

// reload reads the configuration again and applies it, or refuses it.
func (rl *reloader) reload(why string) {
	if rl.cur.reparse == nil {
		return
	}
	ids := fileIdentities(rl.cur)
	next, err := rl.cur.reparse()
	if err == nil && rl.cert != nil && next.Cert == nil {
		err = fmt.Errorf("--tls-cert: TLS cannot be turned off in place")
	}
	if err == nil && rl.cert == nil && next.Cert != nil {
		err = fmt.Errorf("--tls-cert: TLS cannot be turned on in place")
	}
	if err == nil && next.Listen != rl.cur.Listen && len(next.HostsFlag) == 0 {
		// The default Host list follows the address in use, which a
		// reload does not change.
		next.AllowedHosts = gateway.DefaultAllowedHosts(rl.cur.Listen)
	}
	if err == nil {
		if next.Auth != nil && rl.cur.Auth != nil {
			next.Auth.Keys.KeepBudgets(rl.cur.Auth.Keys)
		}
		err = rl.gw.Reload(liveOf(next)) // checked as a whole, then swapped
	} else {
		rl.gw.ReloadRefused()
	}
	if err != nil {
		// Refused: the files as they are now are not tried again every
		// second; the next change or SIGHUP tries again.
		rl.seen = ids
		rl.log.Error("configuration reload refused; the configuration in use stays", "why", why,
			"err", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return
	}
	if rl.cert != nil {
		rl.cert.Store(next.Cert)
	}
	if fixed := fixedChanges(rl.cur, next); len(fixed) > 0 {
		rl.log.Warn("configuration reload: these settings cannot change while serving and were left as they are; restart to apply them",
			"settings", strings.Join(fixed, ", "))
	}
	keep := rl.cur
	next.reparse = keep.reparse
	rl.cur = next
	// What cannot change stays as it was, so that the next comparison is
	// with what is in use.
	restoreFixed(&rl.cur, keep)
	rl.seen = ids
	keys := 0
	if next.Auth != nil {
		keys = next.Auth.Keys.Len()
	}
	rl.log.Info("configuration reloaded", "why", why, "generation", rl.gw.Generation(),
		"upstreams", len(next.Upstreams), "routes", len(next.Routes), "api_keys", keys, "tls", next.Cert != nil)
}

// fixedSettings are the config fields a running gateway cannot change,
// with their flag names.
var fixedSettings = []struct{ field, flag string }{
	{"Listen", "listen"}, {"Data", "data"}, {"Postgres", "postgres"}, {"Redis", "redis"}, {"RedisPrefix", "redis-prefix"},
	{"ForwardTimeout", "forward-timeout"}, {"DrainPeriod", "drain-period"}, {"GrantWait", "grant-wait"},
	{"MaxBody", "max-body"}, {"LogLevel", "log-level"}, {"BodyTimeout", "body-timeout"},
	{"ShutdownDelay", "shutdown-delay"}, {"InsecureNoAuth", "insecure-no-auth"},
	{"PGMaxConns", "pg-max-conns"}, {"PGLockConns", "pg-lock-conns"}, {"PGStatementTimeout", "pg-statement-timeout"},
	{"PGLockTimeout", "pg-lock-timeout"}, {"PGFenceSessions", "pg-fence-sessions"}, {"PGSchema", "pg-schema"},
	{"PGMaxFences", "pg-max-fences"}, {"PGSessionCheck", "pg-session-check"},
	{"IdempotencyWindow", "idempotency-window"}, {"IdempotencyMaxBody", "idempotency-max-body"},
	{"IdempotencyMaxRecords", "idempotency-max-records"}, {"GCHeadroom", "gc-headroom"}, {"Tracing", "OTEL_*"},
}

// reloadedFields are the config fields a reload applies (or that only say
// where the configuration came from); every other field is in
// fixedSettings (TestEveryConfigFieldIsClassified).
var reloadedFields = []string{"ConfigFile", "Upstreams", "AuthFile", "Auth", "TLSCert", "TLSKey", "Cert",
	"AllowedHosts", "HostsFlag", "Routes", "Observe", "src", "reparse"}

// fixedChanges names the settings that differ between a and b and cannot
// change in place (by name only: a store URL may hold a password).
func fixedChanges(a, b config) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for _, s := range fixedSettings {
		if !reflect.DeepEqual(va.FieldByName(s.field).Interface(), vb.FieldByName(s.field).Interface()) {
			out = append(out, s.flag)
		}
	}
	return out
}

// restoreFixed copies the settings that cannot change from keep into cfg.
func restoreFixed(cfg *config, keep config) {
	v, k := reflect.ValueOf(cfg).Elem(), reflect.ValueOf(keep)
	for _, s := range fixedSettings {
		v.FieldByName(s.field).Set(k.FieldByName(s.field))
	}
}

// fileIdentities is what a reload watches: the identity of each file the
// configuration was read from, through symlinks.
func fileIdentities(cfg config) string {
	var b strings.Builder
	for _, path := range []string{cfg.ConfigFile, cfg.AuthFile, cfg.TLSCert, cfg.TLSKey} {
		if path == "" {
			continue
		}
		fi, err := os.Stat(path)
		if err != nil {
			fmt.Fprintf(&b, "%s:missing;", path)
			continue
		}
		var dev, ino uint64
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			dev, ino = uint64(st.Dev), st.Ino
		}
		fmt.Fprintf(&b, "%s:%d:%d:%d:%d;", path, dev, ino, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}
