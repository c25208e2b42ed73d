//go:build !unix

package engine

import "context"

// Without a non-blocking peek, a half-sent exchange is not watched for an
// early answer (answerwatch.go): the answer is read once the body is sent.
type answerWatch struct{}

type heard int

const (
	heardNothing heard = iota
	heardAnswer
	heardHangUp
)

var errHungUp error // never the error of an exchange here

func watchAnswer(*engineConn, Write) *answerWatch { return nil }

func (a *answerWatch) end(context.Context) heard { return heardNothing }
