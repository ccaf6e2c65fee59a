package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newRegistry returns a registry with the Go and process collectors,
// chatpipe_build_info, the process's Postgres round trips and cs.
func newRegistry(cs ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo(), pgRoundTrips)
	reg.MustRegister(cs...)
	return reg
}

// buildInfo is the gauge chatpipe_build_info{version,go_version} 1.
func buildInfo() prometheus.Collector {
	v, goVersion := buildVersion()
	if goVersion == "" {
		goVersion = runtime.Version()
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "chatpipe_build_info",
		Help:        "Always 1; the labels are the binary's version (with its VCS revision when known) and Go version.",
		ConstLabels: prometheus.Labels{"version": v, "go_version": goVersion}})
	g.Set(1)
	return g
}

// adminServer serves /metrics, /healthz, /readyz and the Go profiler
// (/debug/pprof/) of a role on its admin address, never on a public one.
type adminServer struct {
	ln  net.Listener
	srv *http.Server
}

func listenAdmin(addr string) (net.Listener, error) {
	// net.Listen reads "" as every interface on a free port: the role's
	// pprof would be open to the network. Roles whose admin listener is
	// optional check for "" before they get here.
	if addr == "" {
		return nil, errors.New("--admin: this role always serves /metrics, /healthz and /readyz; give an address such as 127.0.0.1:0")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	return ln, nil
}

// serveAdmin serves reg on /metrics, "ok" on /healthz and, on /readyz, 503
// with ready's error, else 200 "ready" — or 200 "ready, degraded: …" when
// degraded (may be nil) describes something an operator must look at that
// does not stop the role from working (a consumer's dead letters). mounts
// add more routes (the gateway's pipeline page).
func serveAdmin(ln net.Listener, reg *prometheus.Registry, ready func() error, degraded func(context.Context) string, log *slog.Logger, mounts ...func(*http.ServeMux)) *adminServer {
	mux := http.NewServeMux()
	for _, m := range mounts {
		m(mux)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if degraded != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if d := degraded(ctx); d != "" {
				w.Write([]byte("ready, degraded: " + d + "\n"))
				return
			}
		}
		w.Write([]byte("ready\n"))
	})
	// net/http/pprof's handlers, without its init's registration on
	// http.DefaultServeMux.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	a := &adminServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		if err := a.srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Error("admin server failed", "err", err)
		}
	}()
	return a
}

func (a *adminServer) Addr() string { return a.ln.Addr().String() }

func (a *adminServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = a.srv.Shutdown(ctx)
}
