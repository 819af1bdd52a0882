package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kiln-build/kiln/internal/bench/measure"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/session"
)

// Scenarios of a fresh daemon that shares caches through a registry.
const (
	KilnFreshLayers   = "kiln fresh daemon, layer cache"
	KilnFreshSnapshot = "kiln fresh daemon, layer cache + Go cache snapshot"
)

// freshDaemon times a new daemon (the bench daemon, emptied) building an
// edited commit after the caches of the unedited one were published, with
// the registry layer cache and, when snapshot is set, the Go cache snapshot.
// The baseline is kiln's own cold build.
func (r *runner) freshDaemon(name string, snapshot bool) func(context.Context) error {
	return func(ctx context.Context) error {
		pkg := r.report.SharedEdit
		if pkg == "" {
			pkg = r.report.OneBinaryEdit
		}
		switch {
		case r.registry == "":
			r.report.Scenarios = append(r.report.Scenarios, Scenario{Name: name, Kind: "kiln", Note: "no registry (-registry, REGISTRY, or docker-registry on PATH): skipped"})
			return nil
		case pkg == "":
			r.report.Scenarios = append(r.report.Scenarios, Scenario{Name: name, Kind: "kiln", Note: "no package to edit"})
			return nil
		}
		r.progress(name, 1, 1)
		repo := fmt.Sprintf("%s/kiln-bench/%d", r.registry, r.step)
		layers := "type=registry,ref=" + repo + "/cache,mode=max"

		// Daemon A publishes the unedited commit's caches (not timed).
		publish := r.opts.Build
		publish.CacheTo = layers
		if snapshot {
			publish.GoCacheTo = repo + "/gocache"
		}
		if _, err := session.Binaries(ctx, publish); err != nil {
			return fmt.Errorf("%s: publish the caches: %w", name, err)
		}
		if err := r.edit(pkg, 200+r.step); err != nil {
			return err
		}
		// The same daemon, emptied, is daemon B; the client forgets the
		// snapshots it fetched.
		if err := r.prune(ctx, pruneAll); err != nil {
			return err
		}
		if dir, err := buildkit.CacheDir(); err == nil {
			os.RemoveAll(filepath.Join(dir, "gocache"))
		}
		fresh := r.opts.Build
		fresh.CacheFrom = layers
		if snapshot {
			// The bench's own registry, on this machine: unsigned.
			fresh.GoCacheFrom, fresh.GoCacheUnsigned = repo+"/gocache", true
		}
		s, steps, err := r.kilnBuildWith(ctx, fresh)
		if err != nil {
			return err
		}
		sc := Scenario{Name: name, Kind: "kiln", Baseline: KilnCold,
			Description: "empty daemon importing the registry layer cache, after an edit to " + pkg}
		if snapshot {
			sc.Description = "empty daemon importing the layer cache and seeding GOCACHE from the snapshot, after an edit to " + pkg
		}
		r.describe(&sc, steps, s.Sent)
		r.add(sc, []measure.Sample{s})
		return nil
	}
}

// benchRegistry is the registry of the shared-cache scenarios: the given
// one, else REGISTRY, else a docker-registry started on loopback for the
// run (stopped by the returned function).
func benchRegistry(given string) (string, func(), error) {
	if given == "" {
		given = os.Getenv(buildkit.RegistryEnv)
	}
	if given != "" {
		return given, func() {}, nil
	}
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		return "", func() {}, nil
	}
	dir, err := os.MkdirTemp("", "kiln-bench-registry-")
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o600); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) }
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			return addr, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("the bench registry (%s) did not start on %s", bin, addr)
}
