package publish_test

import (
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"context"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/containerd"

	"github.com/kiln-build/kiln/internal/build"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

func TestLoadIntoContainerdAndSmoke(t *testing.T) {
	testdaemon.Shared(t)
	sock := testdaemon.Containerd(t)
	ctx := context.Background()
	opts := build.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64,linux/arm64", Progress: "quiet", OutDir: t.TempDir()}

	built, err := build.Images(ctx, opts)
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
