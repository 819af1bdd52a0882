package managed

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/buildkit"
)

// TestThePatchCutsWhatTheManagedDaemonNeverRuns applies the embedded patch to
// the pinned BuildKit as the build does: the containerd worker's files are
// not in the copy, the patched files no longer import the dropped
// backends, and what kiln uses is still there.
func TestThePatchCutsWhatTheManagedDaemonNeverRuns(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), toolsGoMod, 0o644)
	os.WriteFile(filepath.Join(dir, "go.sum"), toolsGoSum, 0o644)
	if err := writePatchedCommand(t.Context(), dir, append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")); err != nil {
		t.Fatal(err)
	}
	patched := map[string]string{}
	entries, err := os.ReadDir(filepath.Join(dir, patchedCommand))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, patchedCommand, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		patched[e.Name()] = string(b)
	}
	if _, ok := patched["main_unix.go"]; !ok {
		t.Error("an unpatched file of cmd/buildkitd, main_unix.go, is not in the copy")
	}
	for name := range patched {
		if strings.HasSuffix(name, "_test.go") {
			t.Errorf("the copy has BuildKit's test file %s", name)
		}
	}
	for _, gone := range []string{"main_containerd_worker.go", "main_containerd_worker_unix.go"} {
		if _, ok := patched[gone]; ok {
			t.Errorf("%s is in the copy, not deleted", gone)
		}
	}
	for file, cuts := range map[string][]string{
		"main.go":            {"remotecache/s3", "remotecache/azblob", "remotecache/gha", "frontend/dockerfile/builder", "detect/jaeger", "policy-helpers"},
		"main_oci_worker.go": {"stargz-snapshotter", "fuse-overlayfs-snapshotter"},
	} {
		src, ok := patched[file]
		if !ok {
			t.Fatalf("the copy has no %s", file)
		}
		for _, cut := range cuts {
			if strings.Contains(src, cut) {
				t.Errorf("patched %s still imports %s", file, cut)
			}
		}
	}
	for _, kept := range []string{`"registry": registryremotecache.ResolveCacheExporterFunc`, `"local":`, `"inline":`, `frontends["gateway.v0"]`} {
		if !strings.Contains(patched["main.go"], kept) {
			t.Errorf("patched main.go lost %s", kept)
		}
	}
	if !strings.Contains(patched["main_oci_worker.go"], `case "overlayfs":`) {
		t.Error("patched main_oci_worker.go lost the overlayfs snapshotter")
	}
}

// TestAPatchThatNoLongerAppliesStopsTheBuild: against other sources (another
// BuildKit), the build stops with the patch's name and the remedy, and
// writes no copy.
func TestAPatchThatNoLongerAppliesStopsTheBuild(t *testing.T) {
	saved := buildkitdPatch
	defer func() { buildkitdPatch = saved }()
	buildkitdPatch = []byte(strings.Replace(string(saved), "\n-\t\"github.com/moby/buildkit/cache/remotecache/gha\"\n", "\n-\t\"github.com/moby/buildkit/cache/remotecache/ghb\"\n", 1))
	if string(buildkitdPatch) == string(saved) {
		t.Fatal("the test's edit did not reach the patch")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), toolsGoMod, 0o644)
	os.WriteFile(filepath.Join(dir, "go.sum"), toolsGoSum, 0o644)
	err := writePatchedCommand(t.Context(), dir, append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly"))
	if err == nil || !strings.Contains(err.Error(), "buildkitd.patch does not apply") || !strings.Contains(err.Error(), "main.go") {
		t.Fatalf("got %v, want the patch and the file it does not apply to", err)
	}
	if _, err := os.Stat(filepath.Join(dir, patchedCommand)); err == nil {
		t.Error("a copy was written although the patch did not apply")
	}
}

// TestACacheBackendTheManagedDaemonLacksIsRefusedFirst: a gha, s3 or azblob
// cache for the managed daemon is refused before anything starts, naming
// the flag and the remedy; with BUILDKIT_HOST it is the daemon's to judge.
func TestACacheBackendTheManagedDaemonLacksIsRefusedFirst(t *testing.T) {
	t.Setenv(buildkit.HostEnv, "")
	check := func(spec string) error {
		entries, err := buildkit.CacheEntries(spec, "", "-cacheto")
		if err != nil {
			return err
		}
		return buildkit.CheckCacheBackend(entries, spec, "-cacheto")
	}
	for _, spec := range []string{"type=s3,bucket=b,region=r", "type=gha", "type=azblob,account_url=https://a"} {
		err := check(spec)
		if err == nil || !strings.Contains(err.Error(), "-cacheto") || !strings.Contains(err.Error(), buildkit.HostEnv) {
			t.Errorf("%s: got %v, want the flag and %s named", spec, err, buildkit.HostEnv)
		}
	}
	for _, spec := range []string{"type=registry,ref=localhost:5000/c", "type=local,dest=/tmp/c", "type=inline"} {
		if err := check(spec); err != nil {
			t.Errorf("%s: %v", spec, err)
		}
	}
	t.Setenv(buildkit.HostEnv, "tcp://buildkitd.example:1234")
	if err := check("type=s3,bucket=b,region=r"); err != nil {
		t.Errorf("with %s set: %v", buildkit.HostEnv, err)
	}
}

// TestTheDaemonIsNotAskedForTheExporterThePatchCut: a shell that exports
// OTEL_TRACES_EXPORTER=jaeger would stop the patched daemon from starting;
// the variable does not reach it, and every other tracing setting does.
func TestTheDaemonIsNotAskedForTheExporterThePatchCut(t *testing.T) {
	env := daemonEnv([]string{"OTEL_TRACES_EXPORTER=jaeger", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317", "PATH=/bin"})
	if slices.Contains(env, "OTEL_TRACES_EXPORTER=jaeger") {
		t.Error("OTEL_TRACES_EXPORTER=jaeger reaches the daemon")
	}
	for _, kept := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317", "PATH=/bin"} {
		if !slices.Contains(env, kept) {
			t.Errorf("%s does not reach the daemon", kept)
		}
	}
	if env := daemonEnv([]string{"OTEL_TRACES_EXPORTER=otlp"}); !slices.Contains(env, "OTEL_TRACES_EXPORTER=otlp") {
		t.Error("OTEL_TRACES_EXPORTER=otlp does not reach the daemon")
	}
}

// TestTheDaemonInheritsNoSecrets: the long-lived daemon takes only what it
// needs of the environment that started it; tokens, keys, passwords and an
// SSH agent stay out of its /proc/PID/environ.
func TestTheDaemonInheritsNoSecrets(t *testing.T) {
	env := daemonEnv([]string{"PATH=/bin", "HOME=/root", "HTTPS_PROXY=http://proxy:3128", "LC_ALL=C", "BUILDKIT_STEP_LOG_MAX_SIZE=1",
		"GITHUB_TOKEN=t", "AWS_SECRET_ACCESS_KEY=s", "SSH_AUTH_SOCK=/tmp/agent", "KILN_SIGNING_PASSWORD=p", "COSIGN_PASSWORD=p",
		"KILN_GOCACHE_SIGNING_KEY=/k", "NPM_TOKEN=n", "DOCKER_CONFIG=/d", "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer t"})
	want := []string{"PATH=/bin", "HOME=/root", "HTTPS_PROXY=http://proxy:3128", "LC_ALL=C", "BUILDKIT_STEP_LOG_MAX_SIZE=1", "GOGC=50"}
	if !slices.Equal(env, want) {
		t.Errorf("the daemon's environment: %q, want %q", env, want)
	}
}
