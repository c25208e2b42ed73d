package redis

// LeaseKey is the Redis key of resource's claim.
func (s *Store) LeaseKey(resource string) string { return s.leaseKey(resource) }

// RateKey is the Redis key of an API key's request budget.
func (s *Store) RateKey(key string) string { return s.rateKey(key) }
