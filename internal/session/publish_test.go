package session_test

// The images:load, images:smoke and images:push tests live beside
// TestImagesIntegration rather than in internal/publish: their subject is
// what publish does with built images, not a cold build, so they run on
// this package's daemon after TestImagesIntegration has built the same
// images there. On a daemon of their own, their first build compiled both
// platforms cold (about 100 CPU-s of a CI run); a daemon shared across
// packages merged their steps with other packages' isolated rebuilds.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"

	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/containerd"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

func TestLoadIntoContainerdAndSmoke(t *testing.T) {
	testdaemon.Shared(t)
	sock := testdaemon.Containerd(t)
	ctx := context.Background()
	opts := session.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64,linux/arm64", Progress: "quiet", OutDir: t.TempDir()}

	built, err := session.Images(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := publish.Load(ctx, opts, publish.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range loaded {
		if l.Digest != built.Images[i].Digest {
			t.Errorf("%s: containerd holds %s, the build exported %s", l.Ref, l.Digest, built.Images[i].Digest)
		}
		if l.Ref != "docker.io/"+built.Images[i].Ref {
			t.Errorf("loaded as %s, want docker.io/%s", l.Ref, built.Images[i].Ref)
		}
	}

	before := containersAndSnapshots(t, sock)
	results, err := publish.Smoke(ctx, opts, publish.LoadOptions{Address: sock})
	if err != nil {
		t.Fatal(err)
	}
	if after := containersAndSnapshots(t, sock); after != before {
		t.Errorf("smoke runs left containers or snapshots behind: %s before, %s after", before, after)
	}
	ran := map[string]int{}
	for _, r := range results {
		if r.Skipped != "" {
			testdaemon.Unavailable(t, "%s %s skipped: %s", r.Image, r.Platform, r.Skipped)
			continue
		}
		if r.Err != "" {
			t.Errorf("%s %s %s: %s (output %q)", r.Image, r.Platform, r.Binary, r.Err, r.Output)
		}
		ran[r.Platform]++
	}
	if ran["linux/amd64"] != 5 || (ran["linux/arm64"] != 0 && ran["linux/arm64"] != 5) {
		t.Errorf("binaries run per platform: %v", ran)
	}

	t.Run("a missing socket is named", func(t *testing.T) {
		_, err := publish.Load(ctx, opts, publish.LoadOptions{Address: "/nonexistent/containerd.sock"})
		if err == nil || !strings.Contains(err.Error(), "/nonexistent/containerd.sock") || !strings.Contains(err.Error(), "CONTAINERD_ADDRESS") {
			t.Errorf("error: %v", err)
		}
	})
}

// containersAndSnapshots counts the containers and active snapshots of the
// namespace images:smoke uses.
func containersAndSnapshots(t *testing.T, sock string) string {
	t.Helper()
	c, err := containerd.Connect(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), containerd.DefaultNamespace)
	list, err := c.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var active int
	err = c.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindActive {
			active++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d containers and %d active snapshots", len(list), active)
}

func TestPushToARegistry(t *testing.T) {
	d := testdaemon.Shared(t)
	reg := testdaemon.StartRegistry(t)
	var progress, logs bytes.Buffer
	logger := logrus.New()
	logger.SetOutput(&logs)
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
	opts := session.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64,linux/arm64", Progress: "plain", ProgressOut: &progress, OutDir: t.TempDir()}

	built, err := session.Images(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("pushed index equals the built one", func(t *testing.T) {
		results, err := publish.Push(ctx, opts, publish.PushOptions{Registry: reg.Addr, Latest: true})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range results {
			if r.Digest != built.Images[i].Digest {
				t.Errorf("%s: pushed %s, built %s", r.Name, r.Digest, built.Images[i].Digest)
			}
			for _, tag := range []string{"v0.0.0-dev", "latest"} {
				dgst, mediaType, body, err := reg.Manifest("antrea/"+r.Name, tag)
				if err != nil {
					t.Fatal(err)
				}
				if dgst != r.Digest || mediaType != ocispec.MediaTypeImageIndex {
					t.Errorf("%s:%s pulled back as %s %s, want %s index", r.Name, tag, dgst, mediaType, r.Digest)
				}
				var index ocispec.Index
				json.Unmarshal(body, &index)
				if len(index.Manifests) != 2 || index.Manifests[0].Platform.Architecture != "amd64" || index.Manifests[1].Platform.Architecture != "arm64" {
					t.Errorf("%s:%s index platforms: %+v", r.Name, tag, index.Manifests)
				}
			}
		}
	})

	t.Run("credentials appear nowhere", func(t *testing.T) {
		canary := []byte(reg.Pass)
		for what, data := range map[string][]byte{"progress output": progress.Bytes(), "logs": logs.Bytes()} {
			if bytes.Contains(data, canary) {
				t.Errorf("the registry password is in the %s", what)
			}
		}
		for _, img := range built.Images {
			data, _ := os.ReadFile(img.Path)
			if bytes.Contains(data, canary) {
				t.Errorf("the registry password is in %s", img.Path)
			}
		}
		if d.Managed != nil {
			if path, ok := testdaemon.GrepTree(d.Managed.(*managed.Managed).Dir, canary); ok {
				t.Errorf("the registry password is in the daemon's state or log: %s", path)
			}
		}
	})

	t.Run("wrong credentials name their source", func(t *testing.T) {
		// Another name for the same registry: the daemon has no cached
		// authorization for it.
		host := strings.Replace(reg.Addr, "127.0.0.1", "localhost", 1)
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"auths": {"`+host+`": {"auth": "a2lsbjp3cm9uZw=="}}}`), 0o600)
		t.Setenv("DOCKER_CONFIG", dir)
		_, err := publish.Push(ctx, opts, publish.PushOptions{Registry: host})
		if err == nil {
			t.Fatal("a push with wrong credentials succeeded")
		}
		for _, want := range []string{"401", filepath.Join(dir, "config.json"), host} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not mention %q: %v", want, err)
			}
		}
	})

	t.Run("a stopped registry is named, and a rerun completes the push", func(t *testing.T) {
		reg.Stop()
		_, err := publish.Push(ctx, opts, publish.PushOptions{Registry: reg.Addr})
		if err == nil {
			t.Fatal("a push to a stopped registry succeeded")
		}
		if !strings.Contains(err.Error(), reg.Addr) || !strings.Contains(err.Error(), "unreachable") {
			t.Errorf("error does not name the unreachable registry: %v", err)
		}
		reg.Start()
		if _, err := publish.Push(ctx, opts, publish.PushOptions{Registry: reg.Addr}); err != nil {
			t.Fatalf("the push after the registry came back: %v", err)
		}
	})

	t.Run("bad registry", func(t *testing.T) {
		if _, err := publish.Push(ctx, opts, publish.PushOptions{Registry: "Not A Registry"}); err == nil || !strings.Contains(err.Error(), "Not A Registry") {
			t.Errorf("bad registry: %v", err)
		}
	})
}

// A registry off loopback is reached over verified HTTPS: a certificate from
// a CA the daemon does not trust is refused unless -skiptlsverify says so,
// and a CA in the daemon's configuration is enough.
func TestPushToATLSRegistryChecksItsCertificate(t *testing.T) {
	ctx := context.Background()
	opts := session.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64", Images: []string{"antrea-controller"}, Progress: "quiet", OutDir: t.TempDir()}
	// The compile is not the subject: the package's daemon, warm, exports
	// its layers to a plain registry and the TLS-configured one imports them.
	testdaemon.Shared(t)
	cache := "type=registry,ref=" + testdaemon.StartRegistry(t).Addr + "/antrea/cache,mode=max"
	seed := opts
	seed.OutDir, seed.CacheTo = t.TempDir(), cache
	if _, err := session.Images(ctx, seed); err != nil {
		t.Fatal(err)
	}
	opts.CacheFrom = cache

	trusted := testdaemon.StartTLSRegistry(t)
	testdaemon.BuildkitWithConfig(t, fmt.Sprintf("[registry.%q]\n  ca = [%q]\n", trusted.Addr, trusted.CAFile))
	stranger := testdaemon.StartTLSRegistry(t)

	_, err := publish.Push(ctx, opts, publish.PushOptions{Registry: stranger.Addr})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a push to a registry whose CA the daemon does not trust gave %v; want a certificate error", err)
	}
	results, err := publish.Push(ctx, opts, publish.PushOptions{Registry: trusted.Addr})
	if err != nil {
		t.Fatalf("a push with the CA in the daemon's configuration: %v", err)
	}
	if dg, _, _, err := trusted.Manifest("antrea/antrea-controller", "v0.0.0-dev"); err != nil || dg != results[0].Digest {
		t.Errorf("the trusted registry holds %s (%v), the push reported %s", dg, err, results[0].Digest)
	}
	if _, err := publish.Push(ctx, opts, publish.PushOptions{Registry: stranger.Addr, SkipTLSVerify: true}); err != nil {
		t.Errorf("an explicit -skiptlsverify push: %v", err)
	}
}
