package bolt

// Seed: sets up a store file with resources already granted up to a token
// (tests and load runs).

import (
	"fmt"

	bbolt "go.etcd.io/bbolt"
)

// Seed records, in the store file at path (created if missing), each of
// resources as last granted token: the next grant on it gets token+1. A
// resource whose token is already token or higher is left alone, so Seed
// never makes a token go down. It is for setting up tests and load runs
// (the torture starts tokens at 2^53 so that a float64 loses a bit) and
// must run while no gateway has the file open.
func Seed(path string, token int64, resources ...string) error {
	s, err := Open(path, Options{})
	if err != nil {
		return err
	}
	err = s.db.Update(func(tx *bbolt.Tx) error {
		for _, r := range resources {
			st, err := getResource(tx, r)
			if err != nil {
				return err
			}
			if st.token >= token {
				continue
			}
			st.token = token
			if err := s.putResource(tx, r, &st); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	return nil
}
