//go:build !unix

package engine

import "context"

// Without a non-blocking peek, a half-sent exchange is not watched for an
// early answer (answerwatch.go): the answer is read once the body is sent.
type answerWatch struct{}

func watchAnswer(*engineConn, Write) *answerWatch { return nil }

func (a *answerWatch) end(context.Context) bool { return false }
