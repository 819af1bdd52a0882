// Package testdaemon starts the real daemons integration tests need. A test
// that cannot get one skips, unless CI is set, where it fails: a skip in CI
// would hide a missing install step.
package testdaemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/platforms"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/plan"
)

// Unavailable skips the test, or fails it in CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set, so this may not skip: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RepoRoot is the repository root: the nearest directory above the test's
// package that holds build/kiln.yaml.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "build", "kiln.yaml")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no build/kiln.yaml above the test's directory")
		}
		dir = parent
	}
}

// Buildkit starts a private managed buildkitd (its own state, the shared
// cached binary), points BUILDKIT_HOST at it for the test, and stops it at
// the end. Integration tests are skipped with -short.
func Buildkit(t *testing.T) *buildkit.Daemon {
	t.Helper()
	return BuildkitWithConfig(t, "")
}

// BuildkitWithConfig is Buildkit with extra buildkitd.toml lines, such as
// a registry's CA.
func BuildkitWithConfig(t *testing.T, extra string) *buildkit.Daemon {
	t.Helper()
	d, stop := startBuildkit(t, extra)
	t.Cleanup(stop)
	t.Setenv(buildkit.HostEnv, d.Address)
	return d
}

var toolchain struct {
	sync.Once
	err error
}

// Toolchain fetches the pinned Go toolchain into the real kiln cache, once
// per test binary, with the GOPROXY the tests started under. Tests that
// point GOPROXY at a fixture proxy, or off, then find it there, as on a
// machine where a build ran before; on a fresh machine nothing else would
// have fetched it yet.
func Toolchain(t testing.TB) {
	t.Helper()
	root := RepoRoot(t)
	toolchain.Do(func() {
		cfg, err := config.Load(root)
		if err != nil {
			toolchain.err = err
			return
		}
		// The managed daemon's worker runs on this host: its platform.
		tc, err := plan.PinnedToolchain(cfg, platforms.Normalize(platforms.DefaultSpec()))
		if err != nil {
			toolchain.err = err
			return
		}
		cache, err := buildkit.CacheDir()
		if err != nil {
			toolchain.err = err
			return
		}
		env, err := plan.ModuleEnvOf("")
		if err != nil {
			toolchain.err = err
			return
		}
		_, toolchain.err = golang.FetchToolchain(context.Background(), tc, cache, env["GOPROXY"])
	})
	if toolchain.err != nil {
		Unavailable(t, "cannot fetch the pinned Go toolchain: %v", toolchain.err)
	}
}

var shared struct {
	sync.Mutex
	daemon *buildkit.Daemon
	stop   func()
}

// Shared is Buildkit for tests whose subject is not the daemon's state: one
// daemon per test binary, so a later test's build of the same tree is warm.
// The package's TestMain calls StopShared.
func Shared(t *testing.T) *buildkit.Daemon {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.daemon == nil {
		shared.daemon, shared.stop = startBuildkit(t, "")
	}
	t.Setenv(buildkit.HostEnv, shared.daemon.Address)
	return shared.daemon
}

// Main runs a package's tests and stops the daemon they shared: call it
// from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

// StopShared stops the daemon Shared started, if any.
func StopShared() {
	shared.Lock()
	defer shared.Unlock()
	if shared.stop != nil {
		shared.stop()
		shared.daemon, shared.stop = nil, nil
	}
}

func startBuildkit(t *testing.T, extra string) (*buildkit.Daemon, func()) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs buildkitd")
	}
	Toolchain(t)
	root := RepoRoot(t)
	m, err := managed.DefaultManaged(root)
	if err != nil {
		t.Fatal(err)
	}
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "kiln-bk-")
	if err != nil {
		t.Fatal(err)
	}
	m.Dir = dir
	if extra != "" {
		base, err := m.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(base)
		if err != nil {
			t.Fatal(err)
		}
		m.Config = filepath.Join(dir, "buildkitd-test.toml")
		if err := os.WriteFile(m.Config, append(append(data, '\n'), extra...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := m.Ensure(context.Background())
	if err != nil {
		os.RemoveAll(dir)
		Unavailable(t, "cannot start buildkitd: %v", err)
	}
	name := t.Name()
	stop := func() {
		c.Close()
		reportCPU(m, name)
		m.Stop(context.Background())
		os.RemoveAll(dir)
	}
	return &buildkit.Daemon{Client: c, Address: m.Address(), Managed: m}, stop
}

// ManagedCache gives the test its own kiln cache dir (KILN_CACHE_DIR), so
// that builds start and use a managed daemon of their own, exactly as
// `mage images` does with BUILDKIT_HOST unset. The buildkitd binary, the
// toolchain and kilnstep are linked from the real cache instead of being
// built again.
// The daemon is stopped at the end.
func ManagedCache(t *testing.T) *managed.Managed {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs buildkitd")
	}
	root := RepoRoot(t)
	real, err := managed.DefaultManaged(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := real.EnsureBinary(context.Background()); err != nil {
		Unavailable(t, "cannot build buildkitd: %v", err)
	}
	Toolchain(t)
	realCache, err := buildkit.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kiln-cache-")
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"bin", "toolchain", "kilnstep"} {
		if _, err := os.Stat(filepath.Join(realCache, sub)); err == nil {
			if err := os.Symlink(filepath.Join(realCache, sub), filepath.Join(dir, sub)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("KILN_CACHE_DIR", dir)
	t.Setenv(buildkit.HostEnv, "")
	os.Unsetenv(buildkit.HostEnv)
	m, err := managed.DefaultManaged(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		reportCPU(m, t.Name())
		m.Stop(context.Background())
		os.RemoveAll(dir)
	})
	return m
}

// Cosign is the path of the cosign CLI (.ci/run installs it from the Go
// module proxy).
func Cosign(t testing.TB) string {
	t.Helper()
	waitForCosign(t)
	path, err := exec.LookPath("cosign")
	if err != nil {
		Unavailable(t, "cosign not on PATH (GOBIN=/usr/local/bin go install github.com/sigstore/cosign/v3/cmd/cosign@v3.1.3)")
	}
	return path
}

// waitForCosign waits while the file $KILN_TEST_COSIGN_PENDING exists:
// .ci/run builds cosign beside the first tests and removes it when the
// build ends, however it ends.
func waitForCosign(t testing.TB) {
	pending := os.Getenv("KILN_TEST_COSIGN_PENDING")
	if pending == "" {
		return
	}
	for start := time.Now(); ; time.Sleep(time.Second) {
		if _, err := os.Stat(pending); err != nil {
			return
		}
		if time.Since(start) > 20*time.Minute {
			Unavailable(t, "cosign: still being built after 20 minutes (%s exists)", pending)
		}
	}
}

// CosignKeyPair makes cosign.key and cosign.pub with the real cosign CLI in
// a new folder, the key encrypted with password.
func CosignKeyPair(t testing.TB, password string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(Cosign(t), "generate-key-pair")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD="+password)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
	}
	return dir
}

// reportCPU appends the CPU seconds a test daemon and the steps it ran
// used to $KILN_TEST_DAEMON_CPU, so that CI can say which tests compile
// the most inside BuildKit (a step's processes are reaped by runc, and runc
// by buildkitd, so their time is in buildkitd's cutime).
func reportCPU(m *managed.Managed, test string) {
	out := os.Getenv("KILN_TEST_DAEMON_CPU")
	pid, ok := m.PID()
	if out == "" || !ok {
		return
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return
	}
	// The fields after the command's closing parenthesis, from state on.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 15 {
		return
	}
	var ticks [4]float64
	for i := range ticks {
		ticks[i], _ = strconv.ParseFloat(fields[11+i], 64)
	}
	const hz = 100 // USER_HZ on Linux
	f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%.0f\t%.0f\t%s\n", (ticks[2]+ticks[3])/hz, (ticks[0]+ticks[1])/hz, test)
}
