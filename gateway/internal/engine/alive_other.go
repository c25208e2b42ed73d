//go:build !unix

package engine

// alive: without a non-blocking peek an idle connection cannot be checked,
// so none is reused.
func (c *engineConn) alive() bool { return false }
