package redis

// The API keys' request budgets shared by every replica
// (gateway.RateStore): a token bucket per key, a hash under the
// deployment's prefix.

import (
	"context"
	"encoding/hex"
	"errors"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// rateKey is the bucket of an API key. The name is hex-encoded: key names
// may hold any printable character, '#' included, and hex keeps every
// bucket key of one schema's prefix from being another's (SchemaPrefix).
func (s *Store) rateKey(key string) string {
	return s.prefix + "rate:" + hex.EncodeToString([]byte(key))
}

// takeScript refills the bucket by Redis's clock (TIME: scripts are
// replicated by their effects) and takes one token if there is one, in
// one atomic step. ARGV: rate (tokens/s), burst. The rate and burst come
// with each call, so a reload's apply at once; a bucket over a lowered
// burst is cut to it, and a clock stepped back refills nothing. The key
// expires once the bucket would be full again, when a missing key means
// the same. Returns {taken (0|1), tokens left (a string: Lua numbers
// become integers in replies)}.
var takeScript = goredis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
if tokens == nil or at == nil then
  tokens, at = burst, now
end
if now > at then
  tokens = tokens + (now - at) * rate
  at = now
end
tokens = math.min(burst, tokens)
local taken = 0
if tokens >= 1 then
  tokens = tokens - 1
  taken = 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%.17g', at))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {taken, string.format('%.17g', tokens)}
`)

// Take implements gateway.RateStore.
func (s *Store) Take(ctx context.Context, key string, rate float64, burst int) (bool, time.Duration, error) {
	if rate <= 0 {
		return true, 0, nil // unlimited
	}
	burst = max(burst, 1)
	res, err := takeScript.Run(ctx, s.rdb, []string{s.rateKey(key)},
		strconv.FormatFloat(rate, 'g', -1, 64), burst).Slice()
	if err != nil {
		return false, 0, unavailable("take rate", err)
	}
	if len(res) != 2 {
		return false, 0, unavailable("take rate", errors.New("unexpected script reply"))
	}
	taken, _ := res[0].(int64)
	left, _ := res[1].(string)
	tokens, err := strconv.ParseFloat(left, 64)
	if err != nil {
		return false, 0, unavailable("take rate", err)
	}
	if taken == 1 {
		return true, 0, nil
	}
	return false, time.Duration((1 - tokens) / rate * float64(time.Second)), nil
}
