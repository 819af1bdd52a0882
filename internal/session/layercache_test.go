package session_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

func TestRegistryLayerCacheAcrossDaemons(t *testing.T) {
	reg := testdaemon.StartRegistry(t)
	ctx := context.Background()
	cache := "type=registry,ref=" + reg.Addr + "/antrea/cache,mode=max"
	binCache := "type=registry,ref=" + reg.Addr + "/antrea/bincache,mode=max"
	// One platform: the subject is the cache import (CI time).
	opts := session.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64", Progress: "quiet"}

	var first *session.ImagesOutcome
	var binaries *session.BinariesOutcome
	outA := t.TempDir()
	t.Run("daemon A exports", func(t *testing.T) {
		// The package's daemon, warm from the tests before: B's is the
		// fresh one that must not compile.
		testdaemon.Shared(t)
		o := opts
		o.OutDir, o.CacheTo = outA, cache
		var err error
		if first, err = session.Images(ctx, o); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := reg.Manifest("antrea/cache", "images"); err != nil {
			t.Fatalf("no cache in the registry: %v", err)
		}
		// -x in the go build, so that daemon C's output would show every
		// compile, had it run the step rather than take its result.
		// In a cache of its own: B imports every tag of the images' one.
		ob := o
		ob.TraceCompiles, ob.CacheTo = true, binCache
		if binaries, err = session.Binaries(ctx, ob); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := reg.Manifest("antrea/bincache", "binaries"); err != nil {
			t.Fatalf("no binaries cache in the registry: %v", err)
		}
	})
	// onFreshDaemon starts t's own daemon and builds from the cache given.
	onFreshDaemon := func(t *testing.T, exported bool, from string) session.Options {
		if !exported {
			t.Skip("daemon A failed")
		}
		testdaemon.Buildkit(t)
		o := opts
		o.OutDir, o.CacheFrom = t.TempDir(), from
		return o
	}
	t.Run("fresh daemon B imports the layers", func(t *testing.T) {
		o := onFreshDaemon(t, first != nil, cache)
		again, err := session.Images(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// Every compile step comes from the cache: zero run on B.
		if ran := append(again.Ran("go build"), again.Ran("binary")...); len(ran) > 0 {
			t.Errorf("%d compile steps ran on daemon B: %v", len(ran), ran)
		}
		for i := range first.Images {
			if first.Images[i].Digest != again.Images[i].Digest {
				a, _ := inspect.ReadLayout(first.Images[i].Path)
				b, _ := inspect.ReadLayout(again.Images[i].Path)
				t.Errorf("%s differs with the imported cache:\n%s", first.Images[i].Name, diffText(inspect.DiffLayouts(first.Images[i].Name, a, b)))
			}
		}
	})
	// The binaries job reads its files from the steps rather than
	// exporting a result, and its cache must still hold every step.
	t.Run("fresh daemon C imports the binaries' layers", func(t *testing.T) {
		o := onFreshDaemon(t, binaries != nil, binCache)
		var progress bytes.Buffer
		o.TraceCompiles, o.Progress, o.ProgressOut = true, "plain", &progress
		again, err := session.Binaries(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// BuildKit reports a step whose result it loads from an imported
		// cache as run (for a moment, without -x output): what counts is
		// that no compile ran.
		if compiles := strings.Count(progress.String(), "/pkg/tool/linux_amd64/compile "); compiles > 0 {
			t.Errorf("daemon C compiled %d packages; want the go build's result from the cache:\n%s", compiles, progress.String())
		}
		for _, name := range []string{"antctl", "antrea-agent", "antrea-cni", "antrea-controller"} {
			a, errA := os.ReadFile(filepath.Join(binaries.Dir, "linux_amd64", name))
			c, errC := os.ReadFile(filepath.Join(again.Dir, "linux_amd64", name))
			if errA != nil || errC != nil || !bytes.Equal(a, c) {
				t.Errorf("%s: daemon C's differs from daemon A's (%v, %v)", name, errA, errC)
			}
		}
	})
}
