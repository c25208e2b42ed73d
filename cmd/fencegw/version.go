package main

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// versionLine is what `fencegw version` prints, on one line: the module's
// version ("(devel)" for a build from a checkout), the commit, its time and
// whether the tree had changes, as the Go toolchain recorded them in the
// binary (debug.ReadBuildInfo; absent when built with -buildvcs=false), and
// the Go version and platform. An operator asked which build a replica runs
// answers with it.
func versionLine() string {
	var b strings.Builder
	b.WriteString("fencegw ")
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		b.WriteString("(no build information)")
	} else {
		b.WriteString(bi.Main.Version)
		var revision, at string
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if revision != "" {
			b.WriteString(" commit " + revision)
			if at != "" {
				b.WriteString(" (" + at)
				if modified {
					b.WriteString(", modified")
				}
				b.WriteString(")")
			}
		}
	}
	b.WriteString(" " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH)
	return b.String()
}
