package gateway

import "github.com/fencegw/fencegw/auth"

// The keys file's principals authenticate the gateway's callers; auth does
// not import the gateway, so the check that it fits lives here.
var _ Authenticator = (*auth.Keys)(nil)
