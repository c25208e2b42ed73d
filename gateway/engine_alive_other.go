//go:build !unix

package gateway

import "net"

// alive: without a non-blocking peek an idle connection cannot be checked,
// so none is reused.
func (c *engineConn) alive() bool { return false }

// unreadBytes: without a non-blocking peek, connections close as they did
// (framingConn.linger never runs).
func unreadBytes(net.Conn) bool { return false }
