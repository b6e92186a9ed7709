package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/commands"
	"github.com/lockproxy/lockproxy/lockspage"
	"github.com/lockproxy/lockproxy/proxy"
	"github.com/lockproxy/lockproxy/quorum"
)

// serveHTTP serves, on addr (metrics.listen): /metrics, /locks and
// /locks.json (the page of the lock state, see lockspage), /healthz (the
// process is alive), /readyz (the backend answers and a majority of lock
// nodes answer with their data; otherwise it says which nodes are down or
// recovering, and until when, or that Sentinel names no primary; ready
// with a warning while no Sentinel answers) and the pprof profiles. The returned function stops the
// server and waits for it.
func serveHTTP(addr string, logger *zap.Logger, p *proxy.Proxy, locker *quorum.Locker, cmds *commands.Handler) (func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), p, locker, cmds)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Profiles for finding where the proxy spends its time (go tool pprof
	// http://ADDR/debug/pprof/profile); keep metrics.listen on loopback.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	// The operators' page of the lock state: /locks and /locks.json.
	lockspage.New(locker, cmds.ID()).Register(mux)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := errors.Join(p.Ready(ctx), locker.Ready(ctx)); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
		if bs := p.Backend(); bs.Sentinel && !bs.SentinelsSilentSince.IsZero() {
			// Still ready: the primary answers. But a failover now would
			// go unnoticed until a Sentinel answers again.
			fmt.Fprintf(w, "warning: no Sentinel has answered since %s; forwarding to the last known primary %s\n",
				bs.SentinelsSilentSince.UTC().Format(time.RFC3339), bs.Primary)
		}
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("metrics server stopped", zap.Error(err))
		}
	}()
	logger.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}
