// Package auth is fencegw's API-key authentication: the --auth-file format
// (keys stored as SHA-256 hashes, with a role, resource prefixes, a request
// rate and caps; the upstreams' credentials), and a gateway.Authenticator
// over it.
//
// Keys are 256-bit random strings made by GenerateKey, so an unsalted
// SHA-256 is enough: salting and slow hashes protect low-entropy passwords
// from dictionary attacks, and there is no dictionary for a random 256-bit
// key. A presented key is hashed and compared with every configured hash in
// constant time (crypto/subtle), so neither the comparison nor which key
// matched shows in the response time.
package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fencegw/fencegw/tokens"
)

// File is the --auth-file format, YAML or JSON:
//
//	keys:
//	  - name: billing-worker        # leases are bound to it
//	    sha256: 9f86d0…              # fencegw hash-key < key
//	    role: worker                 # viewer | worker | admin
//	    resources: ["stmt:"]         # resource-name prefixes; none: all
//	    rate: 50                     # requests/s (0: unlimited)
//	    burst: 100                   # (default: rate, at least 1)
//	    max_ttl_ms: 60000            # cap on ttl_ms (0: the gateway's)
//	    max_leases: 20               # live leases at once (0: no cap)
//	upstreams:
//	  - upstream: statements
//	    headers: {Authorization: "Bearer upstream-secret"}
type File struct {
	Keys      []Key        `yaml:"keys" json:"keys"`
	Upstreams []Credential `yaml:"upstreams" json:"upstreams"`
}

// Key is one API key entry.
type Key struct {
	Name      string   `yaml:"name" json:"name"`
	SHA256    string   `yaml:"sha256" json:"sha256"`
	Role      string   `yaml:"role" json:"role"`
	Resources []string `yaml:"resources" json:"resources"`
	Rate      float64  `yaml:"rate" json:"rate"`
	Burst     int      `yaml:"burst" json:"burst"`
	MaxTTLMs  int64    `yaml:"max_ttl_ms" json:"max_ttl_ms"`
	MaxLeases int      `yaml:"max_leases" json:"max_leases"`
}

// Credential is what the gateway adds to writes forwarded to one upstream.
type Credential struct {
	Upstream string            `yaml:"upstream" json:"upstream"`
	Headers  map[string]string `yaml:"headers" json:"headers"`
}

// Limits on the file's values.
const (
	maxNameLen = 128
	// MaxLeasesCap is the largest max_leases: a capped grant counts up to
	// max_leases of the key's live leases inside its transaction, and this
	// bounds that work.
	MaxLeasesCap = 1000
	maxKeyLen    = 1024
	// KeyPrefix starts every key GenerateKey makes, so a leaked one is
	// recognisable.
	KeyPrefix = "fgk_"
)

// Config is a loaded auth file: an Authenticator and the upstream headers.
type Config struct {
	Keys *Keys
	// UpstreamHeaders, by upstream name, for gateway.Config.UpstreamHeaders.
	UpstreamHeaders map[string]http.Header
}

// Load reads and checks an auth file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

// Parse checks an auth file's contents. Unknown fields are errors (a typo
// in "resources" must not silently grant every resource).
func Parse(data []byte) (*Config, error) {
	var f File
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			return nil, fmt.Errorf("parse JSON: %w", err)
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&f); err != nil {
			return nil, fmt.Errorf("parse YAML: %w", err)
		}
	}
	if len(f.Keys) == 0 {
		return nil, errors.New("no keys: an auth file needs at least one")
	}
	keys := &Keys{byName: map[string]*entry{}, now: time.Now}
	hashes := map[[32]byte]string{}
	for i, k := range f.Keys {
		e, err := newEntry(k)
		if err != nil {
			return nil, fmt.Errorf("keys[%d] (%q): %w", i, k.Name, err)
		}
		if _, dup := keys.byName[k.Name]; dup {
			return nil, fmt.Errorf("keys[%d]: name %q given twice", i, k.Name)
		}
		if other, dup := hashes[e.hash]; dup {
			return nil, fmt.Errorf("keys[%d] (%q): same key as %q", i, k.Name, other)
		}
		hashes[e.hash] = k.Name
		keys.byName[k.Name] = e
		keys.all = append(keys.all, e)
	}
	headers := map[string]http.Header{}
	for i, c := range f.Upstreams {
		if c.Upstream == "" {
			return nil, fmt.Errorf("upstreams[%d]: upstream name missing", i)
		}
		if _, dup := headers[c.Upstream]; dup {
			return nil, fmt.Errorf("upstreams[%d]: upstream %q given twice", i, c.Upstream)
		}
		h := http.Header{}
		for name, value := range c.Headers {
			if err := checkHeader(name, value); err != nil {
				return nil, fmt.Errorf("upstreams[%d] (%q): %w", i, c.Upstream, err)
			}
			h.Set(name, value)
		}
		headers[c.Upstream] = h
	}
	return &Config{Keys: keys, UpstreamHeaders: headers}, nil
}

func newEntry(k Key) (*entry, error) {
	if k.Name == "" || len(k.Name) > maxNameLen {
		return nil, fmt.Errorf("name must be 1..%d bytes", maxNameLen)
	}
	for _, r := range k.Name {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return nil, errors.New("name must be printable UTF-8")
		}
	}
	raw, err := hex.DecodeString(k.SHA256)
	if err != nil || len(raw) != sha256.Size {
		return nil, errors.New("sha256 must be 64 hex digits (fencegw hash-key)")
	}
	p := Principal{Name: k.Name, MaxLeases: k.MaxLeases}
	switch k.Role {
	case "viewer":
		p.Role = RoleViewer
	case "worker":
		p.Role = RoleWorker
	case "admin":
		p.Role = RoleAdmin
	default:
		return nil, fmt.Errorf("role %q: want viewer, worker or admin", k.Role)
	}
	for _, prefix := range k.Resources {
		// A prefix is the start of a resource name: the same alphabet.
		if err := tokens.DefaultLimits.ValidateResource(prefix); err != nil {
			return nil, fmt.Errorf("resources: prefix %q: %w", prefix, err)
		}
		p.Resources = append(p.Resources, prefix)
	}
	switch {
	case k.Rate < 0 || math.IsNaN(k.Rate) || math.IsInf(k.Rate, 0):
		return nil, errors.New("rate must be a number >= 0 (requests/s; 0: unlimited)")
	case k.Burst < 0:
		return nil, errors.New("burst must be >= 0")
	case k.MaxTTLMs < 0 || k.MaxTTLMs > tokens.DefaultLimits.MaxTTL.Milliseconds():
		return nil, fmt.Errorf("max_ttl_ms must be between 0 and %d", tokens.DefaultLimits.MaxTTL.Milliseconds())
	case k.MaxLeases < 0 || k.MaxLeases > MaxLeasesCap:
		return nil, fmt.Errorf("max_leases must be between 0 and %d", MaxLeasesCap)
	}
	p.MaxTTL = time.Duration(k.MaxTTLMs) * time.Millisecond
	e := &entry{principal: p}
	copy(e.hash[:], raw)
	if k.Rate > 0 {
		burst := float64(k.Burst)
		if burst == 0 {
			burst = max(1, math.Ceil(k.Rate))
		}
		e.bucket = &bucket{rate: k.Rate, burst: burst}
		e.principal.Rate, e.principal.Burst = k.Rate, int(min(burst, math.MaxInt32))
	}
	return e, nil
}

// checkHeader refuses header names the gateway owns or that are hop-by-hop,
// and values that could split a header.
func checkHeader(name, value string) error {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", r)
	}) {
		return fmt.Errorf("header name %q is not a token", name)
	}
	canon := http.CanonicalHeaderKey(name)
	switch {
	case strings.HasPrefix(canon, "Fencing-"), strings.HasPrefix(canon, "X-Forwarded-"), canon == "Forwarded",
		canon == "Host", canon == "Connection", canon == "Content-Length", canon == "Transfer-Encoding",
		canon == "Te", canon == "Trailer", canon == "Upgrade", canon == "Keep-Alive", canon == "Proxy-Connection":
		return fmt.Errorf("header %q is set by the gateway or hop-by-hop; it cannot be configured", name)
	case strings.ContainsAny(value, "\r\n\x00"):
		return fmt.Errorf("header %q: value contains a control character", name)
	}
	return nil
}

// Keys is a gateway.Authenticator over the keys of an auth file. It is safe
// for concurrent use. Its rate budgets are kept in memory, per gateway
// replica: exact in the embedded mode, where the process is the only
// replica; in the replicated modes the gateway takes from a bucket in the
// store (gateway.RateStore) and falls back on these only when the store
// does not answer.
type Keys struct {
	all    []*entry
	byName map[string]*entry
	now    func() time.Time
}

type entry struct {
	hash      [sha256.Size]byte
	principal Principal
	bucket    *bucket // nil: unlimited
}

// KeepBudgets carries the rate budgets of old's keys over to the keys of k
// with the same name, rate and burst, so that a configuration reload does
// not refill every key's burst. Call it before k is in use.
func (k *Keys) KeepBudgets(old *Keys) {
	if old == nil {
		return
	}
	for name, e := range k.byName {
		if o := old.byName[name]; o != nil && e.bucket != nil && o.bucket != nil &&
			e.bucket.rate == o.bucket.rate && e.bucket.burst == o.bucket.burst {
			e.bucket = o.bucket
		}
	}
}

// Len is the number of keys.
func (k *Keys) Len() int { return len(k.all) }

// Authenticate implements gateway.Authenticator: the key comes as
// `Authorization: Bearer <key>`, or as the password of HTTP Basic (any user
// name) for browsers on the dashboard.
func (k *Keys) Authenticate(r *http.Request) (*Principal, error) {
	key, ok := presentedKey(r)
	if !ok {
		return nil, ErrUnauthenticated
	}
	e := k.match(key)
	if e == nil {
		return nil, ErrUnauthenticated
	}
	p := e.principal // a copy: callers cannot change the configured one
	return &p, nil
}

func presentedKey(r *http.Request) (string, bool) {
	h := r.Header.Values("Authorization")
	if len(h) != 1 {
		return "", false // none, or ambiguous
	}
	scheme, rest, _ := strings.Cut(h[0], " ")
	var key string
	switch strings.ToLower(scheme) {
	case "bearer":
		key = strings.TrimSpace(rest)
	case "basic":
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
		if err != nil {
			return "", false
		}
		_, key, _ = strings.Cut(string(raw), ":")
	default:
		return "", false
	}
	if key == "" || len(key) > maxKeyLen {
		return "", false
	}
	return key, true
}

// match compares the key's hash with every configured hash in constant time,
// without stopping at a match.
func (k *Keys) match(key string) *entry {
	sum := sha256.Sum256([]byte(key))
	var found *entry
	for _, e := range k.all {
		if subtle.ConstantTimeCompare(sum[:], e.hash[:]) == 1 {
			found = e
		}
	}
	return found
}

// Allow implements gateway.Authenticator with one token bucket per key, in
// this process.
func (k *Keys) Allow(p *Principal) (bool, time.Duration) {
	e := k.byName[p.Name]
	if e == nil || e.bucket == nil {
		return true, 0
	}
	return e.bucket.take(k.now())
}

// bucket is a token bucket: rate tokens a second, at most burst saved up.
// (Twenty lines, so not worth golang.org/x/time/rate as a dependency.)
type bucket struct {
	rate, burst float64

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func (b *bucket) take(now time.Time) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last.IsZero() {
		b.tokens = b.burst
	} else if d := now.Sub(b.last); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
}

// Hash returns the hex SHA-256 of key, as the auth file stores it.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// GenerateKey returns a new random key (256 bits, base64url).
func GenerateKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24)
	return KeyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}
