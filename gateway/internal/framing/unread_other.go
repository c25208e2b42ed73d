//go:build !unix

package framing

// Without Unix: no peek at unread bytes.

import "net"

// unreadBytes: without a non-blocking peek, connections close as they did
// (conn.linger never runs).
func unreadBytes(net.Conn) bool { return false }

// peerGone: without a non-blocking peek, only the client watch hears a
// client go.
func peerGone(net.Conn) bool { return false }
