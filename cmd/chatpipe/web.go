package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/web"
)

// The browser pages (package web) on the gateway's HTTP server: the chat
// page at /, the pipeline at /ops, and in `chatpipe dev` a token endpoint.
func init() {
	mountWeb = func(mux *http.ServeMux, d webDeps) {
		ops, err := web.NewOps(web.OpsConfig{
			Etcd: d.Etcd, Prefix: lease.DefaultPrefix, VShards: d.Config.VShards, Topic: d.Config.Topic,
			DB: d.DB, Brokers: d.Brokers, KafkaOpts: d.KafkaOpts, LocalMetrics: localMetrics(mux), Log: d.Log,
		})
		if err != nil {
			d.Log.Error("pipeline page disabled", "err", err)
			ops = nil
		}
		cfg := web.Config{Dev: d.Dev, Ops: ops, Log: d.Log}
		if d.Dev {
			cfg.Secret = d.Secret
		}
		if err := web.Mount(mux, cfg); err != nil {
			d.Log.Error("web pages disabled", "err", err)
		}
	}
}

// localMetrics reads the server's own /metrics page through mux, without a
// network round trip: in `chatpipe dev` it holds the in-process workers' and
// persist's metrics too.
func localMetrics(mux *http.ServeMux) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/metrics", nil)
		if err != nil {
			return nil, err
		}
		rec := &bufferWriter{header: http.Header{}, status: http.StatusOK}
		mux.ServeHTTP(rec, req)
		if rec.status != http.StatusOK {
			return nil, fmt.Errorf("local /metrics: HTTP %d", rec.status)
		}
		return rec.body.Bytes(), nil
	}
}

// bufferWriter is an http.ResponseWriter that keeps the response.
type bufferWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *bufferWriter) Header() http.Header         { return w.header }
func (w *bufferWriter) Write(b []byte) (int, error) { return w.body.Write(b) }
func (w *bufferWriter) WriteHeader(status int)      { w.status = status }
