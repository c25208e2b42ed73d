package redis

// LeaseKey is the Redis key of resource's claim.
func (s *Store) LeaseKey(resource string) string { return s.leaseKey(resource) }
