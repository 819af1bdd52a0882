package spread_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/log"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/ocimerge"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/spread"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestPlatformsBuiltApartMergeToTheSameImage: an image's platforms built
// by separate builds, or on separate daemons, merge into the image one
// build of every platform makes, byte for byte; a daemon that is not there
// fails the build and a merge of parts that do not make the image refuses.
//
// The repository is a tiny one: what is proven here does not depend on
// what compiles, and its three cold platform compiles (two on the shared
// daemon, one on the fresh one) take a few CPU-seconds each instead of
// forty. TestRelease spreads this repository's own release.
func TestPlatformsBuiltApartMergeToTheSameImage(t *testing.T) {
	shared := testdaemon.Shared(t)
	ctx := context.Background()
	root := testdaemon.TinyRepo(t, "[linux/amd64, linux/arm64]")
	order := []ocispec.Platform{platforms.MustParse("linux/amd64"), platforms.MustParse("linux/arm64")}
	build := func(platforms string) session.ImageResult {
		t.Helper()
		out, err := session.Images(ctx, session.Options{Root: root, OutDir: t.TempDir(), Progress: "quiet", Platforms: platforms})
		if err != nil {
			t.Fatal(err)
		}
		return out.Images[0]
	}
	whole := build("linux/amd64,linux/arm64")
	amd64, arm64 := build("linux/amd64"), build("linux/arm64")

	merged := filepath.Join(t.TempDir(), "tiny.oci.tar")
	// The parts in another order than the image's platforms.
	desc, err := ocimerge.Merge(ctx, merged, []string{arm64.Path, amd64.Path}, order)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest.String() != whole.Digest {
		t.Errorf("the merged index is %s, the one build's %s", desc.Digest, whole.Digest)
	}
	got, _ := os.ReadFile(merged)
	want, _ := os.ReadFile(whole.Path)
	if !bytes.Equal(got, want) {
		t.Errorf("the merged layout (%d bytes) differs from the one build's (%d bytes)", len(got), len(want))
	}

	t.Run("built on two daemons", func(t *testing.T) {
		// The shared daemon, warm, and a fresh one that compiles its
		// platform cold (two cold daemons would prove no more: the spread
		// release compiles cold on both of its daemons).
		a, b := shared, testdaemon.Buildkit(t)
		t.Setenv(buildkit.HostEnv, a.Address+","+b.Address)
		out := t.TempDir()
		opts := session.Options{Root: root, OutDir: out, Progress: "quiet", Platforms: "linux/amd64,linux/arm64"}
		both, err := spread.Images(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(both.Images[0].Path)
		if both.Images[0].Digest != whole.Digest || !bytes.Equal(got, want) {
			t.Errorf("built on two daemons: %s (%d bytes), on one: %s (%d bytes)", both.Images[0].Digest, len(got), whole.Digest, len(want))
		}
		var names []string
		for _, st := range both.Steps {
			names = append(names, st.Name)
		}
		for _, platform := range []string{"linux/amd64", "linux/arm64"} {
			if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "["+platform+"] go build") }) {
				t.Errorf("no daemon ran the go build of %s: %v", platform, names)
			}
		}
		// A daemon that is not there fails the build, named, and nothing
		// is written.
		missing := "unix://" + filepath.Join(t.TempDir(), "buildkitd.sock")
		t.Setenv(buildkit.HostEnv, a.Address+","+missing)
		if _, err = spread.Images(ctx, opts); err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "linux/arm64") {
			t.Errorf("a build on a daemon that is not there: %v", err)
		}
		got, _ = os.ReadFile(both.Images[0].Path)
		if entries, _ := os.ReadDir(filepath.Join(out, "images")); len(entries) != 1 || !bytes.Equal(got, want) {
			t.Errorf("a failed spread build changed the images folder: %v", entries)
		}
		// Pushed from the two daemons, each its platform by digest and kiln
		// the index under the tags, the image is the one one daemon pushes.
		reg := testdaemon.StartRegistry(t)
		t.Setenv(buildkit.HostEnv, a.Address+","+b.Address)
		spreadPush, err := publish.Push(ctx, opts, publish.PushOptions{Registry: reg.Addr, Latest: true, ReadBack: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, tag := range []string{"v0.0.0-dev", "latest"} {
			if dgst, _, _, err := reg.Manifest("tiny/tiny", tag); err != nil || dgst != spreadPush[0].Digest {
				t.Errorf("the tag %s names %s (%v), want %s", tag, dgst, err, spreadPush[0].Digest)
			}
		}
		t.Setenv(buildkit.HostEnv, shared.Address)
		onePush, err := publish.Push(ctx, opts, publish.PushOptions{Registry: reg.Addr})
		if err != nil {
			t.Fatal(err)
		}
		if spreadPush[0].Digest != onePush[0].Digest || len(spreadPush[0].Platforms) != 2 {
			t.Errorf("pushed from two daemons: %s %v, from one: %s", spreadPush[0].Digest, spreadPush[0].Platforms, onePush[0].Digest)
		}

		// A push with a daemon missing, retried elsewhere, pushes the same.
		t.Setenv(buildkit.HostEnv, missing+","+shared.Address)
		if retried, err := publish.Push(ctx, opts, publish.PushOptions{Registry: reg.Addr, RetryElsewhere: true}); err != nil || retried[0].Digest != onePush[0].Digest {
			t.Errorf("a push retried elsewhere: %v %v, want %s", retried, err, onePush[0].Digest)
		}
		t.Setenv(buildkit.HostEnv, shared.Address)

		// The Go cache snapshot a one-daemon build publishes seeds each
		// daemon of a spread build of the same platforms.
		snapshots := reg.Addr + "/kiln/gocache"
		publishing := opts
		publishing.GoCacheTo, publishing.OutDir = snapshots, t.TempDir()
		if _, err := session.Images(ctx, publishing); err != nil {
			t.Fatal(err)
		}
		t.Setenv(buildkit.HostEnv, a.Address+","+b.Address)
		seededCtx, seedLogs := withLogs(ctx)
		seeded := opts
		seeded.GoCacheFrom, seeded.GoCacheUnsigned, seeded.OutDir = snapshots, true, t.TempDir()
		if out, err := spread.Images(seededCtx, seeded); err != nil {
			t.Errorf("a spread build seeded from a snapshot: %v", err)
		} else if out.Images[0].Digest != whole.Digest {
			t.Errorf("seeded from a snapshot: %s, on one daemon: %s", out.Images[0].Digest, whole.Digest)
		}
		if n := strings.Count(seedLogs.String(), "Go cache snapshot "+snapshots+":"); n != 2 {
			t.Errorf("%d daemons seeded from the snapshot, want 2:\n%s", n, seedLogs.String())
		}

		// With -retryelsewhere the missing daemon's platform is built on the
		// one that finished (the shared daemon, warm), to the same bytes.
		t.Setenv(buildkit.HostEnv, missing+","+shared.Address)
		logged, logs := withLogs(ctx)
		retry := opts
		retry.RetryElsewhere = true
		if again, err := spread.Images(logged, retry); err != nil {
			t.Errorf("a build retried elsewhere: %v", err)
		} else if got, _ = os.ReadFile(again.Images[0].Path); again.Images[0].Digest != whole.Digest || !bytes.Equal(got, want) {
			t.Errorf("retried elsewhere: %s (%d bytes), on one daemon: %s (%d bytes)", again.Images[0].Digest, len(got), whole.Digest, len(want))
		}
		if !strings.Contains(logs.String(), "building linux/amd64 on the daemon at "+shared.Address+" instead") {
			t.Errorf("the retry is not reported: %s", logs.String())
		}
		t.Setenv(buildkit.HostEnv, missing+","+missing+"-2")
		if _, err := spread.Images(ctx, retry); err == nil || !strings.Contains(err.Error(), "no daemon finished") {
			t.Errorf("a retried build where every daemon failed: %v", err)
		}
		// A compile error is the build's, not the daemon's: it fails the
		// build without a retry. The source breaks linux/arm64 only, so the
		// daemon building amd64 finishes and could take arm64 over.
		broken := t.TempDir()
		testdaemon.CopyTree(t, root, broken)
		if err := os.WriteFile(filepath.Join(broken, "cmd", "tiny", "broken_arm64.go"), []byte("package main\n\nvar broken int = \"arm64 only\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Setenv(buildkit.HostEnv, a.Address+","+b.Address)
		compileErr := retry
		compileErr.Root, compileErr.OutDir = broken, t.TempDir()
		logged, logs = withLogs(ctx)
		_, err = spread.Images(logged, compileErr)
		if err == nil || !strings.Contains(err.Error(), "not retried") || !strings.Contains(err.Error(), b.Address) || !strings.Contains(err.Error(), "broken_arm64.go") {
			t.Errorf("a compile error on one daemon with -retryelsewhere: %v", err)
		}
		if strings.Contains(logs.String(), "instead (-retryelsewhere)") {
			t.Errorf("a compile error was retried elsewhere:\n%s", logs.String())
		}
		// Two daemons exporting one layer cache would overwrite each other.
		withCache := opts
		withCache.CacheTo = "type=local,dest=" + t.TempDir()
		if _, err := spread.Images(ctx, withCache); err == nil || !strings.Contains(err.Error(), "-cacheto") {
			t.Errorf("a spread build exporting a layer cache: %v", err)
		}
	})

	// A platform missing, one twice, and a part whose blob was changed.
	tampered := filepath.Join(t.TempDir(), "tampered.oci.tar")
	data, _ := os.ReadFile(amd64.Path)
	i := bytes.Index(data, []byte("\"architecture\":\"amd64\""))
	if i < 0 {
		t.Fatal("no config blob in the amd64 part")
	}
	os.WriteFile(tampered, bytes.Replace(data, []byte("\"architecture\":\"amd64\""), []byte("\"architecture\":\"AMD64\""), 1), 0o644)
	for _, tt := range []struct {
		name  string
		parts []string
		want  string
	}{
		{"a platform missing", []string{amd64.Path}, "no part holds linux/arm64"},
		{"a platform twice", []string{amd64.Path, arm64.Path, amd64.Path}, "linux/amd64 is in two parts"},
		{"a blob changed", []string{tampered, arm64.Path}, "holds bytes of"},
	} {
		dest := filepath.Join(t.TempDir(), "merged.oci.tar")
		if _, err := ocimerge.Merge(ctx, dest, tt.parts, order); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Errorf("%s: wrote %s", tt.name, dest)
		}
	}
}

// withLogs is ctx logging into the returned buffer.
func withLogs(ctx context.Context) (context.Context, *bytes.Buffer) {
	var logs bytes.Buffer
	logger := logrus.New()
	logger.SetOutput(&logs)
	return log.WithLogger(ctx, logrus.NewEntry(logger)), &logs
}
