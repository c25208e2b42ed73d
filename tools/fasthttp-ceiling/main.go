// Command fasthttp-ceiling is a bare reverse proxy on valyala/fasthttp:
// the leanest Go proxy a user could run in front of an upstream, and so
// the ceiling of any Go gateway built on fasthttp. cmd/fencegw-load
// measures it (setup fasthttp) beside the gateway, nginx and HAProxy, as
// it does the peers: its own process, its own CPU.
//
// It is a module of its own so that fencegw's module never depends on
// fasthttp; it is a measuring tool, not part of the gateway.
//
//	go build -C tools/fasthttp-ceiling -o /tmp/fasthttp-ceiling .
//	/tmp/fasthttp-ceiling -listen 127.0.0.1:8081 -upstream 127.0.0.1:8080
//
// It does what the peers' configurations do (cmd/fencegw-load/peers.go):
// keep-alive to the upstream, X-Forwarded-For and -Proto set, no access
// log. It runs until killed: the load tool ends its process group.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address to serve on")
	upstream := flag.String("upstream", "", "upstream host:port (plain HTTP)")
	certFile := flag.String("tls-cert", "", "serve TLS with this certificate (PEM), with -tls-key")
	keyFile := flag.String("tls-key", "", "the key (PEM) of -tls-cert")
	flag.Parse()
	if err := run(*listen, *upstream, *certFile, *keyFile); err != nil {
		fmt.Fprintln(os.Stderr, "fasthttp-ceiling: "+err.Error())
		os.Exit(1)
	}
}

func run(listen, upstream, certFile, keyFile string) error {
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return fmt.Errorf("-upstream must be host:port: %w", err)
	}
	if (certFile == "") != (keyFile == "") {
		return errors.New("-tls-cert and -tls-key go together")
	}
	srv := &fasthttp.Server{Handler: proxy(&fasthttp.HostClient{Addr: upstream, MaxConns: 512})}
	if certFile != "" {
		return srv.ListenAndServeTLS(listen, certFile, keyFile)
	}
	return srv.ListenAndServe(listen)
}

// proxy forwards each request to hc as it came, on a kept-alive
// connection, and the answer back.
func proxy(hc *fasthttp.HostClient) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		req := &ctx.Request
		req.Header.Set("X-Forwarded-For", ctx.RemoteIP().String())
		proto := "http"
		if ctx.IsTLS() {
			proto = "https"
		}
		req.Header.Set("X-Forwarded-Proto", proto)
		// The upstream is plain HTTP whatever the client spoke: a
		// HostClient refuses a request whose scheme is not its own.
		req.URI().SetScheme("http")
		// Connection is hop-by-hop: a client's "close" must not close
		// the upstream connection, nor the upstream's close the client's.
		req.Header.Del("Connection")
		if err := hc.Do(req, &ctx.Response); err != nil {
			ctx.Error("bad gateway: "+err.Error(), fasthttp.StatusBadGateway)
		}
		ctx.Response.Header.Del("Connection")
	}
}
