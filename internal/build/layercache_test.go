package build_test

import (
	"context"
	"testing"

	"github.com/kiln-build/kiln/internal/build"
	"github.com/kiln-build/kiln/internal/testdaemon"
	"github.com/kiln-build/kiln/internal/verify"
)

func TestRegistryLayerCacheAcrossDaemons(t *testing.T) {
	reg := testdaemon.StartRegistry(t)
	ctx := context.Background()
	cache := "type=registry,ref=" + reg.Addr + "/antrea/cache,mode=max"
	// One platform: the subject is the cache import (CI time).
	opts := build.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64", Progress: "quiet"}

	var first *build.ImagesOutcome
	outA := t.TempDir()
	t.Run("daemon A exports", func(t *testing.T) {
		// The package's daemon, warm from the tests before: B's is the
		// fresh one that must not compile.
		testdaemon.Shared(t)
		o := opts
		o.OutDir, o.CacheTo = outA, cache
		var err error
		if first, err = build.Images(ctx, o); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := reg.Manifest("antrea/cache", "images"); err != nil {
			t.Fatalf("no cache in the registry: %v", err)
		}
	})
	t.Run("fresh daemon B imports the layers", func(t *testing.T) {
		if first == nil {
			t.Skip("daemon A failed")
		}
		testdaemon.Buildkit(t)
		o := opts
		o.OutDir, o.CacheFrom = t.TempDir(), cache
		again, err := build.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// Every compile step comes from the cache: zero run on B.
		if ran := append(again.Ran("go build"), again.Ran("binary")...); len(ran) > 0 {
			t.Errorf("%d compile steps ran on daemon B: %v", len(ran), ran)
		}
		for i := range first.Images {
			if first.Images[i].Digest != again.Images[i].Digest {
				a, _ := verify.ReadLayout(first.Images[i].Path)
				b, _ := verify.ReadLayout(again.Images[i].Path)
				t.Errorf("%s differs with the imported cache:\n%s", first.Images[i].Name, diffText(verify.DiffLayouts(first.Images[i].Name, a, b)))
			}
		}
	})
}
