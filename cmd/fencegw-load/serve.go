package main

// -servers' child side: one setup served in its own process, with its
// profiles.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/bench"
	"github.com/fencegw/fencegw/internal/gcheadroom"
)

// runServe serves one setup until SIGTERM or SIGINT (the parent's
// startSelf).
func runServe(o options) error {
	up, err := url.Parse(o.serveUpstream)
	if err != nil || up.Host == "" {
		return fmt.Errorf("-serve-upstream %q is not a URL", o.serveUpstream)
	}
	var cfg *tls.Config
	if o.serveTLSCert != "" {
		if cfg, err = loadServerTLS(o.serveTLSCert, o.serveTLSKey); err != nil {
			return err
		}
	}
	var closeServer func() error
	if strings.HasPrefix(o.serveRole, "gateway") {
		// As fencegw serve runs, with its default --gc-headroom; the
		// others as their users run them, with Go's own collector.
		defer gcheadroom.Start(gcheadroom.Default)()
	}
	switch o.serveRole {
	case "gateway":
		gw, err := bench.StartGatewayTLS(o.serveDir, up, o.serveListen, cfg)
		if err != nil {
			return err
		}
		closeServer = gw.Close
	case "gateway-postgres":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		gw, err := bench.StartPostgresGateway(ctx, o.postgres, o.serveSchema, up, o.serveListen, cfg)
		cancel()
		if err != nil {
			return err
		}
		closeServer = gw.Close
	case "net-http":
		srv, err := bench.ServeTLSAt("net-http", o.serveListen, bench.NewFloor(), cfg)
		if err != nil {
			return err
		}
		closeServer = srv.Close
	case "bare-proxy":
		srv, err := bench.ServeTLSAt("bare-proxy", o.serveListen, bench.NewBareProxy(up), cfg)
		if err != nil {
			return err
		}
		closeServer = srv.Close
	default:
		return fmt.Errorf("-serve %q: not gateway, gateway-postgres, bare-proxy or net-http", o.serveRole)
	}
	stopProfiles, err := startProfiles(o)
	if err != nil {
		_ = closeServer()
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	return errors.Join(stopProfiles(), closeServer())
}

// startProfiles starts the CPU profile and marks the start of the
// allocation profile (-memprofile FILE also writes FILE.start: pass it to
// pprof -base to see only the measured rounds). The returned func stops and
// writes them.
func startProfiles(o options) (stop func() error, err error) {
	var cpu *os.File
	if o.cpuProfile != "" {
		if cpu, err = os.Create(o.cpuProfile); err != nil {
			return nil, err
		}
		if err = pprof.StartCPUProfile(cpu); err != nil {
			_ = cpu.Close()
			return nil, err
		}
	}
	if o.memProfile != "" {
		if err = writeAllocs(o.memProfile + ".start"); err != nil {
			if cpu != nil {
				pprof.StopCPUProfile()
				_ = cpu.Close()
			}
			return nil, err
		}
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		if o.memProfile != "" {
			errs = append(errs, writeAllocs(o.memProfile))
		}
		return errors.Join(errs...)
	}, nil
}

func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
}
