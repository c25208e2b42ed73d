//go:build !unix

package engine

import (
	"errors"
	"syscall"
)

// Where a non-blocking peek is not available, idle upstream connections
// are not reused.

// alive: without a non-blocking peek an idle connection cannot be checked,
// so none is reused.
func (c *engineConn) alive() bool { return false }

// rawConn: no socket to check or wait in.
func (c *engineConn) rawConn() syscall.RawConn { return nil }

// check: no peek to make.
func (c *engineConn) check() (bool, error) { return false, errNoCheck }

var errNoCheck = errors.New("no peek on this platform")
