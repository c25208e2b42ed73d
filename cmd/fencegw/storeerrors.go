package main

// What serve says when a store does not open: one line naming the flag,
// the address (a password hidden) and the cause, instead of a driver's
// wrapped chain (which printed PostgreSQL's dial error once per attempt,
// and go-redis's own logger four lines before it).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	goredis "github.com/redis/go-redis/v9"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/tokens"
)

// quietRedis is go-redis's logger: silent. Its pool logs every failed
// dial on its own; serve reports the failure once, itself.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { goredis.SetLogger(quietRedis{}) }

// storeError turns a store's failure to open into one line: a usage error
// (exit 2) for a value the driver refused, else one naming the store, its
// address and the cause (exit 1).
func storeError(err error, cfg config) error {
	var te *tokens.Error
	if errors.As(err, &te) && te.Kind == tokens.ErrInvalid && te.Field == "postgres" {
		return usageError("%s: %s", cfg.src.of("postgres"), te.Detail)
	}
	if errors.Is(err, bolterrors.ErrTimeout) {
		return usageError("%s: %s is in use by another process%s: is another fencegw serving from it? Stop it, or give this one its own --data",
			cfg.src.of("data"), filepath.Join(cfg.Data, "fencegw.db"), lockHolder(filepath.Join(cfg.Data, "fencegw.db")))
	}
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ce) || cfg.Postgres != "" && cfg.Redis == "" && netCause(err) != "":
		return fmt.Errorf("%s %s: cannot reach PostgreSQL at %s: %s", cfg.src.of("postgres"), redactURL(cfg.Postgres), pgAddress(cfg.Postgres), cause(err))
	case cfg.Redis != "" && strings.Contains(err.Error(), "Redis"):
		return fmt.Errorf("%s %s: cannot reach Redis at %s: %s", cfg.src.of("redis"), redactURL(cfg.Redis), redisAddress(cfg.Redis), cause(err))
	}
	// Anything else, on one line.
	return errors.New(strings.Join(strings.Fields(err.Error()), " "))
}

// cause is the root of a connection failure in a few words.
func cause(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("no answer within the connect timeout (%s a connection when the URL has no connect_timeout): the server accepts connections but does not answer", postgres.DefaultConnectTimeout)
	}
	if c := netCause(err); c != "" {
		return c
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message + " (SQLSTATE " + pe.Code + ")"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return strings.Join(strings.Fields(msg), " ")
}

// netCause is a network failure's own words (connection refused, no such
// host), or "".
func netCause(err error) string {
	var op *net.OpError
	if errors.As(err, &op) {
		var sys *os.SyscallError
		if errors.As(op.Err, &sys) {
			return sys.Err.Error()
		}
		return op.Err.Error()
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns.Error()
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "connection refused"
	}
	return ""
}

// redactURL is a store URL with its password hidden.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(key=value settings)"
	}
	return u.Redacted()
}

// pgAddress is the host:port a PostgreSQL URL or key=value string names.
func pgAddress(s string) string {
	if c, err := pgconn.ParseConfig(s); err == nil {
		return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
	}
	return "the --postgres address"
}

// redisAddress is the address a Redis URL names.
func redisAddress(s string) string {
	if o, err := goredis.ParseURL(s); err == nil {
		return o.Addr
	}
	return "the --redis address"
}

// lockHolder is " (pid N)" for the process that holds path's lock, as
// /proc/locks tells (Linux), or "".
func lockHolder(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return ""
	}
	suffix := ":" + strconv.FormatUint(st.Ino, 10)
	for line := range strings.Lines(string(locks)) {
		f := strings.Fields(line)
		// 1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF
		if len(f) >= 6 && strings.HasSuffix(f[5], suffix) && f[4] != strconv.Itoa(os.Getpid()) {
			return " (pid " + f[4] + ")"
		}
	}
	return ""
}
