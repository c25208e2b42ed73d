// Package postgres implements tokens.Store on PostgreSQL (pgx v5), and
// tokens.Fencer with Fence, for the "--postgres URL" storage mode: several
// gateways share one database. Tokens, fences, leases, the lease history
// and the rejection log live in tables; lease expiry is decided by the
// database's clock; the per-resource shared/exclusive lock is a PostgreSQL
// advisory lock, so it holds across replicas: its shared side kept by each
// replica's fence across writes (fence.go), its exclusive side taken per
// grant, release or revoke (locker.go); rejections fan out to every
// replica with LISTEN/NOTIFY (see notify.go).
//
// The package also serves as the durable ledger of the Redis mode
// (storage/redis): GrantClaimed (a grant whose holder Redis decided),
// LeaseAt, LeaseState and RecordEvent are the operations of its own that
// mode needs.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegw/fencegw/internal/batch"
	"github.com/fencegw/fencegw/tokens"
)

// Defaults for Options fields left zero.
const (
	// DefaultMaxConns bounds the query pool. Queries are short; a grant
	// holds a connection for one transaction.
	DefaultMaxConns = 16
	// DefaultMaxLockConns bounds the lock pool, whose connections wait for
	// or hold advisory locks one at a time: with a Fence, the exclusive
	// locks of grants, releases and revokes in progress (writes hold their
	// shared fences on the Fence's few sessions instead).
	DefaultMaxLockConns = DefaultExclusiveConns
	// DefaultStatementTimeout: no query of this package should take longer;
	// a hung database must turn into 503s, not into hung requests.
	DefaultStatementTimeout = 5 * time.Second
	// DefaultLockTimeout bounds a wait for a row or advisory lock when the
	// caller's context has no earlier deadline.
	DefaultLockTimeout = 30 * time.Second
	// DefaultConnectTimeout bounds opening one connection (TCP, TLS and
	// the startup exchange) when the URL has no connect_timeout: a server
	// that accepts connections and never answers is then named within it,
	// instead of when some later call's deadline runs out.
	DefaultConnectTimeout = 10 * time.Second
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// MaxConns is the size of the query pool (0: DefaultMaxConns).
	MaxConns int32
	// MaxLockConns is the size of the separate pool whose connections hold
	// advisory locks (0: DefaultMaxLockConns). It is separate so that
	// lock waits can never starve the queries they need.
	MaxLockConns int32
	// StatementTimeout is set as statement_timeout on query connections
	// (0: DefaultStatementTimeout).
	StatementTimeout time.Duration
	// LockTimeout is set as lock_timeout and bounds advisory lock waits
	// whose context has no earlier deadline (0: DefaultLockTimeout).
	LockTimeout time.Duration
	// RestartDrain closes resources that had a lease to grants for this
	// long after the PostgreSQL server (re)started, because writes that
	// were in flight when it went down lost their shared locks with their
	// sessions and may still land (0: no restart drain). The gateway passes
	// its drain period.
	RestartDrain time.Duration
	// MaxRejectionLog, MaxHistoryPerResource and LeaseRetention bound what
	// the store keeps (see Prune; 0: the Default values). PruneInterval is
	// how often Prune runs in the background (0: DefaultPruneInterval;
	// negative: never, for tests that call Prune themselves).
	MaxRejectionLog       int64
	MaxHistoryPerResource int
	LeaseRetention        time.Duration
	PruneInterval         time.Duration
	// MaxIdempotencyRecords caps the idempotency records (idempotency.go);
	// 0 means DefaultMaxIdempotencyRecords.
	MaxIdempotencyRecords int64
	// Schema, if set, is created if missing and used as search_path, so that
	// tests (or several deployments) can share one database.
	Schema string
	// Logger receives errors that have no caller to return to (nil: slog.Default()).
	Logger *slog.Logger
}

// Store is a tokens.Store backed by PostgreSQL (its Fence, NewFence, is
// the mode's Fencer). It is safe for concurrent use by many
// goroutines and many replicas.
type Store struct {
	pool     *pgxpool.Pool // queries
	lockPool *pgxpool.Pool // connections holding advisory locks
	opts     Options
	log      *slog.Logger
	keySalt  string                                             // the schema: advisory lock keys and channels are per schema
	channel  string                                             // NOTIFY channel for rejections
	recorder *batch.Batcher[tokens.Rejection, tokens.Rejection] // rejections.go
	instance string                                             // this process's records in idempotency_keys.owner

	keyEvents *batch.Batcher[tokens.Event, struct{}] // idempotency.go: history events of retries

	closeOnce    sync.Once
	pruneStop    chan struct{}
	pruneDone    chan struct{}
	pruneMu      sync.Mutex
	prunedEvents int64 // lease_events ids up to here were pruned

	exhaustedLogged atomic.Int64 // unix second of the last pool-exhausted warning
}

var _ tokens.Store = (*Store)(nil)

// Open connects to url, applies the embedded migrations (serialised across
// concurrently starting replicas by an advisory lock) and returns a Store.
// Connection failures are tokens.ErrStoreUnavailable.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.MaxLockConns <= 0 {
		opts.MaxLockConns = DefaultMaxLockConns
	}
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = DefaultStatementTimeout
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	if opts.MaxRejectionLog <= 0 {
		opts.MaxRejectionLog = DefaultMaxRejectionLog
	}
	if opts.MaxHistoryPerResource <= 0 {
		opts.MaxHistoryPerResource = DefaultMaxHistoryPerResource
	}
	if opts.LeaseRetention <= 0 {
		opts.LeaseRetention = DefaultLeaseRetention
	}
	if opts.MaxIdempotencyRecords <= 0 {
		opts.MaxIdempotencyRecords = DefaultMaxIdempotencyRecords
	}
	if opts.PruneInterval == 0 {
		opts.PruneInterval = DefaultPruneInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, tokens.Invalid("postgres", "bad connection URL: "+err.Error())
	}
	if cfg.ConnConfig.ConnectTimeout == 0 { // the URL has no connect_timeout
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	params := cfg.ConnConfig.RuntimeParams
	params["application_name"] = "fencegw"
	params["lock_timeout"] = ms(opts.LockTimeout)
	params["idle_in_transaction_session_timeout"] = ms(opts.StatementTimeout * 2)
	params["timezone"] = "UTC"
	if opts.Schema != "" {
		params["search_path"] = pgx.Identifier{opts.Schema}.Sanitize()
	}
	lockCfg := cfg.Copy()
	cfg.MaxConns = opts.MaxConns
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = ms(opts.StatementTimeout)
	lockCfg.MaxConns = opts.MaxLockConns
	lockCfg.MinConns = 0
	// Lock waits are bounded per call by lock_timeout (from the caller's
	// deadline); a statement_timeout would cut them at a fixed length.
	lockCfg.ConnConfig.RuntimeParams["statement_timeout"] = "0"

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, tokens.Unavailable("postgres connect", err)
	}
	lockPool, err := pgxpool.NewWithConfig(ctx, lockCfg)
	if err != nil {
		pool.Close()
		return nil, tokens.Unavailable("postgres connect", err)
	}
	s := &Store{
		pool:     pool,
		lockPool: lockPool,
		opts:     opts,
		log:      log,
		keySalt:  opts.Schema,
		channel:  channelName("fencegw_rejections", opts.Schema),
		instance: newInstance(),
	}
	s.recorder = newRecorder(s)
	s.keyEvents = newKeyEventRecorder(s)
	if err := s.migrate(ctx); err != nil {
		_ = s.Close() // the migration's failure is the one to report
		return nil, err
	}
	if opts.PruneInterval > 0 {
		s.pruneStop, s.pruneDone = make(chan struct{}), make(chan struct{})
		go s.pruneLoop()
	}
	return s, nil
}

// Close stops pruning, turns this process's idempotency keys still in
// progress into unknown outcomes, commits the queued rejections and closes
// both pools; locks still held are released by the database with their
// sessions. Its error is that of marking the keys, which then turn unknown
// at their deadline instead. Close is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if s.pruneStop != nil {
			close(s.pruneStop)
			<-s.pruneDone
		}
		err = s.closeKeys()
	})
	s.recorder.Close()
	s.pool.Close()
	s.lockPool.Close()
	return err
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return tokens.Unavailable("postgres ping", err)
	}
	return nil
}

// lockKey maps a name to a 64-bit advisory lock key (FNV-1a over the schema
// and the name). A collision only makes two resources share a lock: slower,
// never unsafe.
func (s *Store) lockKey(kind, name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(s.keySalt))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return int64(h.Sum64())
}

func ms(d time.Duration) string {
	v := d.Milliseconds()
	if v < 1 {
		v = 1
	}
	return strconv.FormatInt(v, 10)
}

// SQLSTATEs this package tells apart.
const (
	codeLockNotAvailable = "55P03" // lock_timeout
	codeQueryCanceled    = "57014" // statement_timeout or cancel request
)

// interpret translates a driver error into a tokens error: pgx.ErrNoRows is
// ErrNotFound, a tokens error stays as it is, and anything else is
// ErrStoreUnavailable, except that a wait for a connection cut short while
// every connection of the query pool was in use says so (and is logged, at
// most once a second): the database may be perfectly reachable, and the
// fix is --pg-max-conns, not the network. Every query of the package goes
// through this one function, so none reports an exhausted pool as an
// unreachable database.
func (s *Store) interpret(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return &tokens.Error{Kind: tokens.ErrNotFound, Detail: op}
	case tokens.ErrorOf(err) != nil:
		return err
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		if st := s.pool.Stat(); st.AcquiredConns() >= st.MaxConns() {
			if now := time.Now().Unix(); s.exhaustedLogged.Swap(now) != now {
				s.log.Warn("PostgreSQL query pool exhausted: every connection of this replica is busy",
					"op", op, "max_conns", st.MaxConns(), "waiting", st.EmptyAcquireCount())
			}
			return tokens.Busy(fmt.Sprintf("postgres %s: all %d connections of this replica's pool are busy (--pg-max-conns)", op, st.MaxConns()), err)
		}
	}
	return tokens.Unavailable("postgres "+op, err)
}

func isPgCode(err error, codes ...string) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	for _, c := range codes {
		if pe.Code == c {
			return true
		}
	}
	return false
}

// channelName is the NOTIFY channel called base in schema: channels are
// per database, so each schema's carry a hash of its name.
func channelName(base, schema string) string {
	if schema == "" {
		return base
	}
	h := fnv.New64a()
	h.Write([]byte(schema))
	return fmt.Sprintf("%s_%x", base, h.Sum64())
}

// sessionConfig is the connection config for the fence's long-lived
// sessions (lock sessions and the yield listener); replica, if set, is
// added to application_name so that an operator (or a test) can tell
// replicas apart in pg_stat_activity.
func (s *Store) sessionConfig(replica string) *pgx.ConnConfig {
	cfg := s.pool.Config().ConnConfig.Copy()
	name := "fencegw-fence"
	if replica != "" {
		name += " " + replica
	}
	if len(name) > 63 { // NAMEDATALEN - 1
		name = name[:63]
	}
	cfg.RuntimeParams["application_name"] = name
	return cfg
}

// PoolConns is the number of connections the Store's pools hold now.
func (s *Store) PoolConns() int32 {
	return s.pool.Stat().TotalConns() + s.lockPool.Stat().TotalConns()
}
