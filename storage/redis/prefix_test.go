package redis_test

import (
	"testing"

	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/tokens"
)

// No lease key, rate bucket or channel of one schema is another schema's, the default
// schema's included, whatever the schemas' names hold; the default schema
// keeps the prefix of earlier releases.
func TestSchemaPrefixesNeverMeet(t *testing.T) {
	if got := redis.SchemaPrefix(""); got != "fencegw:" {
		t.Fatalf("the default schema's prefix is %q, want fencegw: (rolling upgrades)", got)
	}
	schemas := []string{"", "lease", "a", "a:lease", "a#lease:b", "x#", "#", "fencegw", "lease:b", "rate:b"}
	resources := []string{"x", "lease:x", "b:lease:x", "a", "a:lease:x", "rejections"}
	owner := map[string]string{}
	for _, s := range schemas {
		p := redis.SchemaPrefix(s)
		names := []string{"channel " + p + "rejections"}
		for _, r := range resources {
			if err := tokens.DefaultLimits.ValidateResource(r); err != nil {
				t.Fatalf("%q: %v", r, err)
			}
			names = append(names, "key "+p+"lease:"+r)
		}
		rates := redis.New(nil, nil, redis.Options{Prefix: p})
		for _, k := range []string{"x", "a#lease:x", "#", "lease:x", "b#rate:x"} { // key names may hold '#'
			names = append(names, "key "+rates.RateKey(k))
		}
		for _, n := range names {
			if o, ok := owner[n]; ok && o != s {
				t.Errorf("%s is schema %q's and schema %q's", n, o, s)
			}
			owner[n] = s
		}
	}
}
