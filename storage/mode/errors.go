package mode

// Why a mode did not open, classified here, where the drivers are known,
// so that a caller can say so in one line (naming its own flag, the
// address and the cause) instead of a driver's wrapped chain, without
// importing a driver or a backend itself.

import (
	"context"
	"errors"
	"net"
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
// dial on its own (four lines before the caller's one); a mode's failure
// to open is reported once, by its caller, from the error Open returns.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { goredis.SetLogger(quietRedis{}) }

// ConfigError is a bad value in Config (a URL that does not parse, a
// setting the driver refused): the caller's mistake, not an outage.
// Field is the Config field at fault ("postgres", "redis").
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Failure says what kind of failure a StoreError is.
type Failure int

const (
	// Unreachable: the store's server could not be reached (refused, no
	// such host, no answer within the connect timeout).
	Unreachable Failure = iota + 1
	// InUse: the embedded store's file is locked by another process.
	InUse
	// NoDirectory: the embedded store's directory could not be created.
	NoDirectory
)

// StoreError is a store that did not open for a reason a caller reports
// in its own words: Store is "postgres", "redis" or "data" (the Config
// field naming it), Where the address (host:port) or the file, Cause the
// failure in a few words (Unreachable), Holder " (pid N)" for the process
// holding the file's lock, if known (InUse). Err is the driver's error.
type StoreError struct {
	Store   string
	Failure Failure
	Where   string
	Cause   string
	Holder  string
	Err     error
}

func (e *StoreError) Error() string {
	switch e.Failure {
	case InUse:
		return e.Where + " is in use by another process" + e.Holder
	case NoDirectory:
		return "cannot create the data directory " + e.Where + ": " + e.Cause
	default:
		return "cannot reach " + e.Store + " at " + e.Where + ": " + e.Cause
	}
}

func (e *StoreError) Unwrap() error { return e.Err }

// classify turns a failure to open cfg's mode into a *ConfigError or a
// *StoreError where it is one of those, else returns it as it is.
func classify(err error, cfg Config) error {
	var te *tokens.Error
	if errors.As(err, &te) && te.Kind == tokens.ErrInvalid && te.Field == "postgres" {
		return &ConfigError{Field: "postgres", Err: errors.New(te.Detail)}
	}
	if errors.Is(err, bolterrors.ErrTimeout) {
		path := filepath.Join(cfg.Data, "fencegw.db")
		return &StoreError{Store: "data", Failure: InUse, Where: path, Holder: lockHolder(path), Err: err}
	}
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ce) || cfg.Postgres != "" && cfg.Redis == "" && netCause(err) != "":
		return &StoreError{Store: "postgres", Failure: Unreachable, Where: pgAddress(cfg.Postgres), Cause: cause(err), Err: err}
	case cfg.Redis != "" && strings.Contains(err.Error(), "Redis"):
		return &StoreError{Store: "redis", Failure: Unreachable, Where: redisAddress(cfg.Redis), Cause: cause(err), Err: err}
	}
	return err
}

// cause is the root of a connection failure in a few words.
func cause(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within the connect timeout (" + postgres.DefaultConnectTimeout.String() +
			" a connection when the URL has no connect_timeout): the server accepts connections but does not answer"
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

// pgAddress is the host:port a PostgreSQL URL or key=value string names.
func pgAddress(s string) string {
	if c, err := pgconn.ParseConfig(s); err == nil {
		return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
	}
	return "the PostgreSQL address"
}

// redisAddress is the address a Redis URL names.
func redisAddress(s string) string {
	if o, err := goredis.ParseURL(s); err == nil {
		return o.Addr
	}
	return "the Redis address"
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
