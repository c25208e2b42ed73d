package tokens

import (
	"strconv"
	"testing"
	"time"
)

func TestStaleCache(t *testing.T) {
	c := newStaleCache()
	if _, _, ok := c.get("fl_a"); ok {
		t.Fatal("hit in an empty cache")
	}
	a := Lease{ID: "fl_a", Resource: "r", Token: 1}
	c.put(a, Resource{Name: "r", Token: 2})
	c.put(Lease{ID: "fl_b", Resource: "s", Token: 1}, Resource{Name: "s", Token: 5})
	if l, st, ok := c.get("fl_a"); !ok || l.ID != "fl_a" || st.Token != 2 {
		t.Fatalf("get fl_a: %+v %+v %v", l, st, ok)
	}
	c.forget("r")
	if _, _, ok := c.get("fl_a"); ok {
		t.Fatal("fl_a survived a grant of its resource")
	}
	if _, _, ok := c.get("fl_b"); !ok {
		t.Fatal("fl_b forgotten with another resource")
	}

	// Expired entries miss, and make room before live ones are evicted.
	c.mu.Lock()
	e := c.byID["fl_b"]
	e.until = time.Now().Add(-time.Millisecond)
	c.byID["fl_b"] = e
	c.mu.Unlock()
	if _, _, ok := c.get("fl_b"); ok {
		t.Fatal("an expired entry hit")
	}
	for i := range staleCacheSize + 10 {
		id := "fl_" + strconv.Itoa(i)
		c.put(Lease{ID: id, Resource: "many", Token: 1}, Resource{Name: "many", Token: 2})
	}
	if n := len(c.byID); n != staleCacheSize || int(c.size.Load()) != n {
		t.Fatalf("%d entries (size says %d), want the bound %d", n, c.size.Load(), staleCacheSize)
	}
	if _, ok := c.byID["fl_b"]; ok {
		t.Fatal("the expired entry was kept while live ones were evicted")
	}
	if _, _, ok := c.get("fl_" + strconv.Itoa(staleCacheSize+9)); !ok {
		t.Fatal("the newest entry is missing")
	}
	c.forget("many")
	if c.size.Load() != 0 || len(c.byResource) != 0 {
		t.Fatalf("after forgetting everything: size %d, %d resources", c.size.Load(), len(c.byResource))
	}
}
