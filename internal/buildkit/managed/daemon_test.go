package managed_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestManagedDaemonStartsOnce starts the managed daemon from two callers at
// once: one daemon comes up, both get a working client, Stop ends it.
func TestManagedDaemonStartsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts buildkitd")
	}
	m, err := managed.DefaultManaged(testdaemon.RepoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kiln-bk-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	m.Dir = dir
	// A copy of the configuration, edited below while the daemon runs.
	config, err := os.ReadFile(m.Config)
	if err != nil {
		t.Fatal(err)
	}
	m.Config = filepath.Join(dir, "edited-buildkitd.toml")
	if err := os.WriteFile(m.Config, config, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	defer m.Stop(ctx)
	// Whatever command starts the daemon, it does not inherit its secrets.
	t.Setenv("KILN_SIGNING_PASSWORD", "release-password-value")
	t.Setenv("COSIGN_PASSWORD", "release-password-value")

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := m.Ensure(ctx)
			if err == nil {
				_, err = c.ListWorkers(ctx)
				c.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			testdaemon.Unavailable(t, "cannot start buildkitd: %v", err)
		}
	}
	daemonLog, err := os.ReadFile(m.LogFile())
	if err != nil {
		t.Fatal(err)
	}
	pid, running := m.Running()
	if !running {
		t.Fatal("managed daemon is not running after Ensure")
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil || strings.Contains(string(environ), "release-password-value") || !strings.Contains(string(environ), "PATH=") {
		t.Errorf("the daemon's environment (%v) holds the signing password, or was not read", err)
	}
	// Each start appends to the log; two starts would leave two lines.
	if n := strings.Count(string(daemonLog), "running server on"); n != 1 {
		t.Errorf("daemon started %d times, want once:\n%s", n, daemonLog)
	}

	// buildkitd reads its configuration only at start: a build that finds
	// the file changed under a running daemon says so, and only then.
	warnings := func() string {
		var buf bytes.Buffer
		logger := logrus.New()
		logger.SetOutput(&buf)
		c, err := m.Ensure(log.WithLogger(ctx, logrus.NewEntry(logger)))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		return buf.String()
	}
	if got := warnings(); got != "" {
		t.Errorf("the unchanged configuration warned: %s", got)
	}
	edited := strings.Replace(string(config), `platformsCacheMaxAge = "24h"`, `platformsCacheMaxAge = "1h"`, 1)
	if edited == string(config) {
		t.Fatal(`no platformsCacheMaxAge = "24h" in ` + m.Config + " to edit")
	}
	if err := os.WriteFile(m.Config, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := warnings(); !strings.Contains(got, m.Config) || !strings.Contains(got, "buildkit:stop") || !strings.Contains(got, fmt.Sprintf("pid %d", pid)) {
		t.Errorf("an edited configuration gave %q, want a warning naming %s, the pid and buildkit:stop", got, m.Config)
	}
	stopped, err := m.Stop(ctx)
	if err != nil || !stopped {
		t.Fatalf("Stop: %v %v", stopped, err)
	}
	if _, running := m.Running(); running {
		t.Errorf("pid %d still running after Stop", pid)
	}
}

func TestUnreachableAddressIsNamed(t *testing.T) {
	addr := "unix:///nonexistent/kiln/buildkitd.sock"
	_, err := buildkit.Dial(context.Background(), addr)
	if err == nil {
		t.Fatal("dialled a socket that does not exist")
	}
	if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "BUILDKIT_HOST") {
		t.Errorf("error %q does not name the address and the remedy", err)
	}
}

func TestPlainTCPBeyondLoopbackIsRefusedBeforeDialling(t *testing.T) {
	for _, env := range []string{buildkit.TLSDirEnv, buildkit.TLSCACertEnv, buildkit.TLSCertEnv, buildkit.TLSKeyEnv, buildkit.PlaintextEnv} {
		t.Setenv(env, "")
	}
	// 192.0.2.0/24 is TEST-NET-1: nothing answers there, so an error that
	// names TLS comes from the check, not from a dial.
	_, err := buildkit.Dial(context.Background(), "tcp://192.0.2.1:1234")
	if err == nil || !strings.Contains(err.Error(), "needs TLS") || !strings.Contains(err.Error(), buildkit.PlaintextEnv) {
		t.Errorf("plain tcp:// off this machine gave %v", err)
	}
	_, err = buildkit.Dial(context.Background(), "tcp://127.0.0.1:1")
	if err == nil || strings.Contains(err.Error(), "needs TLS") {
		t.Errorf("loopback without TLS gave %v; want a plain dial error", err)
	}
	// The scheme in capitals is the same scheme; a gRPC target, a bare
	// address or an unknown scheme is no address kiln dials.
	for addr, want := range map[string]string{
		"TCP://192.0.2.1:1234":  "needs TLS",
		"Tcp://192.0.2.1:1234":  "needs TLS",
		"dns:///192.0.2.1:1234": "does not dial dns://",
		"192.0.2.1:1234":        "give the scheme",
		"passthrough:///x:1234": "does not dial passthrough://",
		"://192.0.2.1:1234":     "give the scheme",
	} {
		if _, err := buildkit.Dial(context.Background(), addr); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), buildkit.HostEnv) {
			t.Errorf("%s gave %v; want it refused (%q) before any dial", addr, err, want)
		}
	}
}

// TestThisRepositoryRunsTheDefaultDaemonConfig: this repository's
// build/buildkitd.toml is the example adopters copy, and the daemon its own
// builds and benches run; a copy that drifts from kiln's default (as when the
// default went to three parallel steps) measures another daemon.
func TestThisRepositoryRunsTheDefaultDaemonConfig(t *testing.T) {
	project, err := os.ReadFile(managed.ProjectConfig(testdaemon.RepoRoot(t)))
	if err != nil {
		t.Fatal(err)
	}
	m := &managed.Managed{Dir: t.TempDir()}
	path, err := m.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	def, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(project) != string(def) {
		t.Fatal("build/buildkitd.toml differs from internal/buildkit/managed/tools/buildkitd.toml: copy the default over it, or change both")
	}
}
