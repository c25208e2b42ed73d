package storagetest

// Running a suite's tests as parallel subtests.

import "testing"

// suiteTest is one subtest of a suite over harness H.
type suiteTest[H any] struct {
	name string
	fn   func(*testing.T, H)
}

// runParallel runs each test as a parallel subtest: each opens what it
// needs from h and uses resource names of its own.
func runParallel[H any](t *testing.T, h H, tests []suiteTest[H]) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}
