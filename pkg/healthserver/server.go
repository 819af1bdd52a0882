// Package healthserver is the HTTP endpoint shared by antrea-agent and
// antrea-controller: /healthz, /version and Prometheus /metrics, logging
// through klog as Antrea does, stopped cleanly on SIGTERM.
package healthserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/kiln-build/kiln/pkg/version"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// Handler serves /healthz, /version and /metrics for the named binary.
func Handler(binary string) http.Handler {
	registry := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "antrea_http_requests_total", Help: "HTTP requests served, by path.",
		ConstLabels: prometheus.Labels{"binary": binary},
	}, []string{"path"})
	info := version.Get(binary)
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "antrea_build_info", Help: "The build of this binary.",
		ConstLabels: prometheus.Labels{"binary": binary, "version": info.Version, "commit": info.GitCommit, "goversion": info.GoVersion},
	})
	build.Set(1)
	registry.MustRegister(requests, build, collectors.NewGoCollector())

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		requests.WithLabelValues("/healthz").Inc()
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		requests.WithLabelValues("/version").Inc()
		w.Header().Set("Content-Type", "application/json")
		w.Write(version.Get(binary).JSON())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	return mux
}

// Run serves on addr until SIGTERM or SIGINT, then drains connections.
func Run(binary, addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %q: %w", addr, err)
	}
	srv := &http.Server{Handler: Handler(binary), ReadHeaderTimeout: 10 * time.Second}
	klog.InfoS("Serving", "binary", binary, "address", ln.Addr().String())

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	klog.InfoS("Shutting down", "binary", binary)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
