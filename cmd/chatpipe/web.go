package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/web"
)

// The browser pages (package web): the chat page at /, on the gateway's
// HTTP server, and the pipeline at /ops, on its admin listener (and on the
// public address with --ops-public); in `chatpipe dev` a token endpoint.
func init() {
	newPages = func(d webDeps, metrics http.Handler) func(mux *http.ServeMux, chat, ops bool) {
		src, err := web.NewOps(web.OpsConfig{
			Etcd: d.Etcd, Prefix: lease.DefaultPrefix, VShards: d.Config.VShards, Dedicated: d.Config.Dedicated, Topic: d.Config.Topic,
			DB: d.DB, Brokers: d.Brokers, KafkaOpts: d.KafkaOpts, LocalMetrics: localMetrics(metrics), Log: d.Log,
		})
		if err != nil {
			d.Log.Error("pipeline page disabled", "err", err)
			src = nil
		}
		cfg := web.Config{Dev: d.Dev, Ops: src, Log: d.Log}
		if d.Dev {
			cfg.Secret, cfg.Issuer, cfg.Audience = d.Secret, d.Issuer, d.Audience
		}
		return func(mux *http.ServeMux, chat, ops bool) {
			mount := web.Mount // both share the scripts: mount them once per mux
			switch {
			case !chat && !ops:
				return
			case !ops:
				mount = web.MountChat
			case !chat:
				mount = web.MountOps
			}
			if err := mount(mux, cfg); err != nil {
				d.Log.Error("web pages disabled", "err", err)
			}
		}
	}
}

// localMetrics reads the process's own /metrics page through h, without a
// network round trip: in `chatpipe dev` it holds the in-process workers' and
// persist's metrics too.
func localMetrics(h http.Handler) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/metrics", nil)
		if err != nil {
			return nil, err
		}
		rec := &bufferWriter{header: http.Header{}, status: http.StatusOK}
		h.ServeHTTP(rec, req)
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
