package release_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/release"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/sign"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestTheDefaultReleaseIsIsolatedOnEveryDaemon releases a tiny repository
// as `release` does by default: each platform, and an asset platform no
// image has (two binaries there), compiled from nothing in an isolated Go
// cache that is emptied afterwards, and the provenance says so. Spread
// over the shared daemon and a new one, with a layer cache export
// configured (which an isolated release leaves out), each daemon compiles
// its share from nothing again and the release is the same. TestRelease
// releases this repository with -trustcaches; this is the default at a
// tiny repository's cost.
func TestTheDefaultReleaseIsIsolatedOnEveryDaemon(t *testing.T) {
	d := testdaemon.Shared(t)
	ctx := context.Background()
	root := testdaemon.TinyRepo(t, "[linux/amd64, linux/arm64]")
	// Two binaries on the asset platform, which build in one go build.
	kilnYAML := filepath.Join(root, "build", "kiln.yaml")
	cfg, err := os.ReadFile(kilnYAML)
	if err != nil {
		t.Fatal(err)
	}
	const binaries = "binaries:\n  - {name: tiny, package: ./cmd/tiny}\n"
	if !bytes.Contains(cfg, []byte(binaries)) {
		t.Fatalf("%s lists no binary tiny as this test expects:\n%s", kilnYAML, cfg)
	}
	cfg = bytes.Replace(cfg, []byte(binaries), []byte(binaries+"  - {name: tiny-cli, package: ./cmd/tiny-cli}\n"), 1)
	cfg = append(cfg, "release:\n  assets:\n    tiny: [linux/amd64, windows/amd64]\n    tiny-cli: [windows/amd64]\n"...)
	modfixture.Write(t, root, map[string]string{
		"build/kiln.yaml":      string(cfg),
		"cmd/tiny-cli/main.go": "package main\n\nimport \"example.com/tiny/pkg/version\"\n\nfunc main() { println(\"cli\", version.Version) }\n",
	})
	testdaemon.Git(t, root, "add", "-A")
	testdaemon.Git(t, root, "commit", "-qm", "release assets")
	testdaemon.Git(t, root, "tag", "-f", "v1.0.0")
	keys := testdaemon.CosignKeyPair(t, "tiny-pass")
	t.Setenv(sign.KeyEnv, filepath.Join(keys, "cosign.key"))
	t.Setenv(sign.PasswordEnv, "tiny-pass")
	verifier := mustVerifier(t, filepath.Join(keys, "cosign.pub"))

	// The statements of the index's attestations and its platforms', with
	// the registry's name as the first release's.
	attestations := func(t *testing.T, reg *testdaemon.Registry, as string, img release.ReleasedImage) [][]byte {
		t.Helper()
		repo := reg.Addr + "/tiny/" + img.Name
		sts := openAttestations(t, ctx, verifier, repo, img.Digest)
		for _, p := range img.Platforms {
			sts = append(sts, openAttestations(t, ctx, verifier, repo, p.Digest)...)
		}
		for i := range sts {
			sts[i] = bytes.ReplaceAll(sts[i], []byte(reg.Addr), []byte(as))
		}
		return sts
	}

	reg := testdaemon.StartRegistry(t)
	opts := session.Options{Root: root, Progress: "quiet", OutDir: t.TempDir()}
	first, err := release.Release(ctx, opts, release.ReleaseOptions{PushOptions: publish.PushOptions{Registry: reg.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	var assets []string
	for _, a := range first.Assets {
		assets = append(assets, a.Name)
	}
	slices.Sort(assets)
	if first.Caches != "isolated" || len(first.Images) != 1 || len(first.Images[0].Platforms) != 2 ||
		!slices.Equal(assets, []string{"tiny-cli-windows-x86_64.exe", "tiny-linux-x86_64", "tiny-windows-x86_64.exe"}) {
		t.Fatalf("the release: caches %q, %d images, assets %v: %+v", first.Caches, len(first.Images), assets, first)
	}
	want := attestations(t, reg, reg.Addr, first.Images[0])
	var provenances int
	for _, st := range want {
		if bytes.Contains(st, []byte(`"https://slsa.dev/provenance/v1"`)) {
			provenances++
			if !regexp.MustCompile(`"caches":\s*"isolated"`).Match(st) {
				t.Errorf("a provenance does not record isolated caches:\n%s", st)
			}
		}
	}
	if provenances != 3 {
		t.Errorf("%d provenances, want 3 (the index and two platforms)", provenances)
	}
	noIsolatedCacheLeft(t, ctx, "the release", d)

	fresh := testdaemon.Buildkit(t)
	t.Setenv(buildkit.HostEnv, d.Address+","+fresh.Address)
	reg2 := testdaemon.StartRegistry(t)
	layerCache := t.TempDir()
	o := opts
	o.OutDir, o.CacheTo = t.TempDir(), "type=local,dest="+layerCache
	spread, err := release.Release(ctx, o, release.ReleaseOptions{PushOptions: publish.PushOptions{Registry: reg2.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	if len(spread.Images) != 1 || spread.Images[0].Digest != first.Images[0].Digest {
		t.Errorf("spread: %+v; on one daemon: %+v", spread.Images, first.Images)
	}
	if len(spread.Assets) != len(first.Assets) {
		t.Fatalf("spread: assets %+v; on one daemon: %+v", spread.Assets, first.Assets)
	}
	for i, a := range spread.Assets {
		if a.Name != first.Assets[i].Name || a.SHA256 != first.Assets[i].SHA256 {
			t.Errorf("asset %s spread: %s; on one daemon: %s %s", a.Name, a.SHA256, first.Assets[i].Name, first.Assets[i].SHA256)
		}
	}
	got := attestations(t, reg2, reg.Addr, spread.Images[0])
	if len(got) != len(want) {
		t.Fatalf("%d attestations spread, %d on one daemon", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("attestation %d spread:\n%s\non one daemon:\n%s", i, got[i], want[i])
		}
	}
	if entries, _ := os.ReadDir(layerCache); len(entries) != 0 {
		t.Errorf("an isolated release exported a layer cache: %v", entries)
	}
	noIsolatedCacheLeft(t, ctx, "the spread release", d, fresh)
}

// noIsolatedCacheLeft fails the test for each isolated Go cache left on
// the daemons: what left it is the build named by who.
func noIsolatedCacheLeft(t *testing.T, ctx context.Context, who string, daemons ...*buildkit.Daemon) {
	t.Helper()
	for _, daemon := range daemons {
		usage, err := daemon.DiskUsage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range usage {
			if u.RecordType == client.UsageRecordTypeCacheMount && strings.Contains(u.Description, golang.IsolatedCachePrefix) {
				t.Errorf("%s left its isolated cache on %s: %s (%d bytes)", who, daemon.Address, u.Description, u.Size)
			}
		}
	}
}
