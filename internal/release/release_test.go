package release_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	spdxjson "github.com/spdx/tools-golang/json"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/release"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/sign"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// cosign runs the real cosign CLI.
func cosign(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(testdaemon.Cosign(t), args...).Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out) + string(ee.Stderr), err
	}
	return string(out), err
}

// statements decodes the DSSE envelopes cosign verify-attestation prints.
func statements(t *testing.T, out string) []map[string]json.RawMessage {
	t.Helper()
	var sts []map[string]json.RawMessage
	for _, line := range strings.Split(out, "\n") {
		var env struct{ Payload string }
		if json.Unmarshal([]byte(line), &env) != nil || env.Payload == "" {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(env.Payload)
		if err != nil {
			t.Fatal(err)
		}
		var st map[string]json.RawMessage
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatal(err)
		}
		sts = append(sts, st)
	}
	return sts
}

func TestRelease(t *testing.T) {
	d := testdaemon.Shared(t)
	reg := testdaemon.StartRegistry(t)
	ctx := context.Background()
	// A tagged copy of this repository: release:verify checks the tag out.
	const version = "v1.0.0"
	root := testdaemon.TaggedCopy(t, testdaemon.RepoRoot(t), version)
	// Antrea's release compiles seven platforms cold; this one is a part of
	// it, its image platforms with one that has a variant, tagged again.
	// An asset platform no image has (Windows, two binaries there) is
	// TestTheDefaultReleaseIsIsolatedOnEveryDaemon's, at a tiny
	// repository's cost: here it compiled 15 CPU-s more.
	kilnYAML := filepath.Join(root, "build", "kiln.yaml")
	cfg, err := os.ReadFile(kilnYAML)
	if err != nil {
		t.Fatal(err)
	}
	part := regexp.MustCompile(`(?ms)^release:\n.*?\n\n`).ReplaceAll(cfg, []byte("release:\n  platforms: [linux/amd64, linux/arm/v7]\n  assets:\n    antctl: [linux/amd64, linux/arm/v7]\n  manifests: [build/yamls/antrea.yml]\n\n"))
	if bytes.Equal(part, cfg) {
		t.Fatal("no release section in build/kiln.yaml")
	}
	if err := os.WriteFile(kilnYAML, part, 0o644); err != nil {
		t.Fatal(err)
	}
	testdaemon.Git(t, root, "commit", "-qam", "release a part")
	testdaemon.Git(t, root, "tag", "-f", version)
	const releasePlatforms = "linux/amd64,linux/arm/v7"
	keys := testdaemon.CosignKeyPair(t, "release-pass")
	other := testdaemon.CosignKeyPair(t, "other-pass")
	pub, otherPub := filepath.Join(keys, "cosign.pub"), filepath.Join(other, "cosign.pub")
	t.Setenv(sign.KeyEnv, filepath.Join(keys, "cosign.key"))
	t.Setenv(sign.PasswordEnv, "release-pass")
	out := t.TempDir()
	opts := session.Options{Root: root, Progress: "quiet", OutDir: out}
	// The release trusts the daemon's caches (-trustcaches): it compiles
	// each platform once into the shared daemon's Go cache, where the
	// spread release, the build of another commit and the warm rebuild
	// below find it, instead of cold again each time (four cold platform
	// compiles, 160 CPU-s, fewer). The default, isolated release is
	// TestTheDefaultReleaseIsIsolatedOnEveryDaemon's, on a tiny
	// repository; here release:verify rebuilds linux/arm/v7 from nothing
	// in isolation and finds it identical to this release.
	ropts := release.ReleaseOptions{PushOptions: publish.PushOptions{Registry: reg.Addr}, TrustCaches: true}
	assetsDir := filepath.Join(out, "release", version)

	t.Run("dry run publishes nothing", func(t *testing.T) {
		dry := ropts
		dry.DryRun = true
		sum, err := release.Release(ctx, opts, dry)
		if err != nil {
			t.Fatal(err)
		}
		if len(sum.Images) != 2 || len(sum.Assets) != 2 || len(sum.Manifests) != 1 || sum.Images[0].Refs[0] != reg.Addr+"/antrea/antrea-agent:"+version {
			t.Errorf("dry run summary: %+v", sum)
		}
		if _, err := os.Stat(sum.AssetsDir); !os.IsNotExist(err) {
			t.Errorf("a dry run wrote %s", sum.AssetsDir)
		}
		if _, _, _, err := reg.Manifest("antrea/antrea-agent", version); err == nil {
			t.Error("a dry run pushed")
		}
	})

	t.Run("a dirty tree refuses", func(t *testing.T) {
		tree := t.TempDir()
		testdaemon.CopyTree(t, root, tree)
		testdaemon.AppendLine(t, filepath.Join(tree, "README.md"), "\nuncommitted\n")
		o := opts
		o.Root = tree
		if _, err := release.Release(ctx, o, ropts); err == nil || !strings.Contains(err.Error(), "uncommitted") {
			t.Errorf("a dirty release: %v", err)
		}
	})

	t.Run("no key or a wrong password refuses, writing nothing", func(t *testing.T) {
		t.Setenv(sign.KeyEnv, "")
		if _, err := release.Release(ctx, opts, ropts); err == nil || !strings.Contains(err.Error(), sign.KeyEnv) {
			t.Errorf("a release without a key: %v", err)
		}
		t.Setenv(sign.KeyEnv, filepath.Join(keys, "cosign.key"))
		t.Setenv(sign.PasswordEnv, "not-the-password")
		_, err := release.Release(ctx, opts, ropts)
		if err == nil || !strings.Contains(err.Error(), "cosign.key") || strings.Contains(err.Error(), "not-the-password") {
			t.Errorf("a release with a wrong key password: %v", err)
		}
		if _, err := os.Stat(assetsDir); !os.IsNotExist(err) {
			t.Errorf("a refused release wrote %s", assetsDir)
		}
		if _, _, _, err := reg.Manifest("antrea/antrea-agent", version); err == nil {
			t.Error("a refused release pushed")
		}
	})

	first, err := release.Release(ctx, opts, ropts)
	if err != nil {
		t.Fatal(err)
	}
	if first.Caches != "trusted" {
		t.Errorf("a release with -trustcaches says its caches were %q", first.Caches)
	}
	// The summary (release -metadata) names each image's platform manifests.
	for _, img := range first.Images {
		if len(img.Platforms) != 2 || img.Platforms[1].Platform != "linux/arm/v7" || !strings.HasPrefix(img.Platforms[0].Digest, "sha256:") {
			t.Errorf("%s: the summary's platforms %+v", img.Name, img.Platforms)
		}
		// And what was attached: a signature and an attestation manifest
		// for the index and each platform, as the registry serves them.
		if len(img.Attached) != 6 {
			t.Errorf("%s: the summary lists %d attached manifests, want 6: %+v", img.Name, len(img.Attached), img.Attached)
		}
		for _, a := range img.Attached {
			name, tag, _ := strings.Cut(strings.TrimPrefix(a.Ref, reg.Addr+"/"), ":")
			if dg, _, _, err := reg.Manifest(name, tag); err != nil || dg != a.Digest {
				t.Errorf("%s: the registry serves %s as %s (%v); the summary says %s", img.Name, a.Ref, dg, err, a.Digest)
			}
		}
	}
	sums, err := os.ReadFile(filepath.Join(first.AssetsDir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("assets verify against SHA256SUMS, its signature and run", func(t *testing.T) {
		for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
			sum, name, _ := strings.Cut(line, "  ")
			data, err := os.ReadFile(filepath.Join(first.AssetsDir, name))
			if err != nil {
				t.Fatal(err)
			}
			if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != sum {
				t.Errorf("%s does not match SHA256SUMS", name)
			}
		}
		if n := strings.Count(string(sums), "\n"); n != 3 {
			t.Errorf("SHA256SUMS has %d lines, want 3", n)
		}
		for _, name := range []string{"antctl-linux-x86_64", "antctl-linux-arm", "antrea.yml"} {
			if !strings.Contains(string(sums), "  "+name+"\n") {
				t.Errorf("SHA256SUMS has no %s:\n%s", name, sums)
			}
		}
		blob := []string{"verify-blob", "--insecure-ignore-tlog", "--signature", filepath.Join(first.AssetsDir, "SHA256SUMS.sig"), filepath.Join(first.AssetsDir, "SHA256SUMS")}
		if out, err := cosign(t, append(blob, "--key", pub)...); err != nil {
			t.Errorf("cosign verify-blob SHA256SUMS: %v\n%s", err, out)
		}
		if out, err := cosign(t, append(blob, "--key", otherPub)...); err == nil {
			t.Errorf("cosign verify-blob passed with another key:\n%s", out)
		}
		got, err := exec.Command(filepath.Join(first.AssetsDir, "antctl-linux-x86_64"), "version").Output()
		if err != nil || !strings.Contains(string(got), "antctl version "+version) || !strings.Contains(string(got), first.Commit) {
			t.Errorf("antctl asset says %q (%v), want version %s and commit %s", got, err, version, first.Commit)
		}
	})

	t.Run("the manifest ships pinned to the digests the registry serves", func(t *testing.T) {
		source, err := os.ReadFile(filepath.Join(root, "build", "yamls", "antrea.yml"))
		if err != nil {
			t.Fatal(err)
		}
		want := string(source)
		for _, name := range []string{"antrea-agent", "antrea-controller"} {
			dgst, _, _, err := reg.Manifest("antrea/"+name, version)
			if err != nil {
				t.Fatal(err)
			}
			from := "image: antrea/" + name + ":latest"
			if !strings.Contains(want, from) {
				t.Fatalf("build/yamls/antrea.yml has no %q", from)
			}
			want = strings.Replace(want, from, "image: "+reg.Addr+"/antrea/"+name+"@"+dgst, 1)
		}
		got, err := os.ReadFile(filepath.Join(first.AssetsDir, "antrea.yml"))
		if err != nil || string(got) != want {
			t.Errorf("the released antrea.yml (%v):\n%s\nwant:\n%s", err, got, want)
		}
		if m := first.Manifests; len(m) != 1 || m[0].References != 2 || m[0].Source != "build/yamls/antrea.yml" {
			t.Errorf("the summary's manifests: %+v", m)
		}
	})

	t.Run("cosign verifies signatures, SLSA v1 provenance and SBOMs", func(t *testing.T) {
		config, _ := os.ReadFile(filepath.Join(root, "build", "kiln.yaml"))
		configSum := sha256.Sum256(config)
		for _, img := range first.Images {
			name := "antrea/" + img.Name
			ref := img.Refs[0]
			dgst, _, body, err := reg.Manifest(name, version)
			if err != nil {
				t.Fatal(err)
			}
			if dgst != img.Digest {
				t.Errorf("%s: registry has %s, release reported %s", name, dgst, img.Digest)
			}
			var index ocispec.Index
			json.Unmarshal(body, &index)
			var plats []string
			for _, m := range index.Manifests {
				if m.Platform == nil {
					t.Fatalf("%s: an index entry without a platform: %v", name, m)
				}
				plats = append(plats, m.Platform.OS+"/"+m.Platform.Architecture+suffix(m.Platform.Variant))
				if out, err := cosign(t, "verify", "--key", pub, "--insecure-ignore-tlog", reg.Addr+"/"+name+"@"+m.Digest.String()); err != nil {
					t.Errorf("%s %s: cosign verify of the platform manifest: %v\n%s", name, m.Platform.Architecture, err, out)
				}
			}
			// The index holds the images and nothing else: no attestation
			// manifest with a build time in it.
			if strings.Join(plats, ",") != releasePlatforms {
				t.Errorf("%s index entries %v, want exactly %s", name, plats, releasePlatforms)
			}
			if out, err := cosign(t, "verify", "--key", pub, "--insecure-ignore-tlog", ref); err != nil {
				t.Errorf("cosign verify %s: %v\n%s", ref, err, out)
			}
			if out, err := cosign(t, "verify", "--key", otherPub, "--insecure-ignore-tlog", ref); err == nil {
				t.Errorf("cosign verify %s passed with another key:\n%s", ref, out)
			}

			out, err := cosign(t, "verify-attestation", "--key", pub, "--insecure-ignore-tlog", "--type", "slsaprovenance1", ref)
			if err != nil {
				t.Fatalf("cosign verify-attestation --type slsaprovenance1 %s: %v\n%s", ref, err, out)
			}
			if out, err := cosign(t, "verify-attestation", "--key", otherPub, "--insecure-ignore-tlog", "--type", "slsaprovenance1", ref); err == nil {
				t.Errorf("cosign verify-attestation passed with another key:\n%s", out)
			}
			var prov struct {
				Predicate struct {
					BuildDefinition struct {
						ExternalParameters struct {
							Source struct{ Commit, TreeState string }
						}
						InternalParameters struct {
							Config    struct{ SHA256 string }
							Toolchain struct{ SHA256 string }
							Caches    string
						}
					}
				}
			}
			var provenances int
			for _, st := range statements(t, out) {
				if string(st["predicateType"]) != `"https://slsa.dev/provenance/v1"` {
					continue
				}
				provenances++
				raw, _ := json.Marshal(st)
				json.Unmarshal(raw, &prov)
			}
			bd := prov.Predicate.BuildDefinition
			if provenances != 1 || bd.ExternalParameters.Source.Commit != first.Commit || bd.ExternalParameters.Source.TreeState != "clean" ||
				bd.InternalParameters.Config.SHA256 != hex.EncodeToString(configSum[:]) || bd.InternalParameters.Caches != "trusted" || len(bd.InternalParameters.Toolchain.SHA256) != 64 {
				t.Errorf("%s: %d provenances; the last records %+v", name, provenances, bd)
			}
			if bytes.Contains([]byte(out), []byte(reg.Pass)) || bytes.Contains([]byte(out), []byte("release-pass")) {
				t.Errorf("%s: an attestation holds a secret", name)
			}

			out, err = cosign(t, "verify-attestation", "--key", pub, "--insecure-ignore-tlog", "--type", "spdxjson", ref)
			if err != nil {
				t.Fatalf("cosign verify-attestation --type spdxjson %s: %v\n%s", ref, err, out)
			}
			checkSBOMs(t, ctx, img.PushResult, statements(t, out))
		}
	})

	t.Run("spread over two daemons it is the same release", func(t *testing.T) {
		// The shared daemon and a fresh one: linux/amd64 on the first
		// (warm), linux/arm/v7 on the second (cold).
		other := testdaemon.Buildkit(t)
		t.Setenv(buildkit.HostEnv, d.Address+","+other.Address)
		reg2 := testdaemon.StartRegistry(t)
		o := opts
		o.OutDir = t.TempDir()
		r := ropts
		r.Registry = reg2.Addr
		spread, err := release.Release(ctx, o, r)
		if err != nil {
			t.Fatal(err)
		}
		if len(spread.Images) != len(first.Images) || len(spread.Assets) != len(first.Assets) {
			t.Fatalf("spread: %d images and %d assets; on one daemon: %d and %d", len(spread.Images), len(spread.Assets), len(first.Images), len(first.Assets))
		}
		if len(spread.Manifests) != 1 || spread.Manifests[0].References != first.Manifests[0].References {
			t.Errorf("spread, the manifests: %+v; on one daemon: %+v", spread.Manifests, first.Manifests)
		}
		for i, img := range spread.Images {
			one := first.Images[i]
			if img.Digest != one.Digest || !slices.Equal(img.Platforms, one.Platforms) || len(img.Attached) != len(one.Attached) {
				t.Errorf("%s spread: %s %v, %d attached; on one daemon: %s %v, %d attached", img.Name, img.Digest, img.Platforms, len(img.Attached), one.Digest, one.Platforms, len(one.Attached))
			}
			if dgst, _, _, err := reg2.Manifest("antrea/"+img.Name, version); err != nil || dgst != one.Digest {
				t.Errorf("%s: the tag %s names %s (%v), want %s", img.Name, version, dgst, err, one.Digest)
			}
			// The attestations say what one daemon's say, but for the
			// registry's name in the subjects.
			repo := "/antrea/" + img.Name
			verifier := mustVerifier(t, pub)
			want := openAttestations(t, ctx, verifier, reg.Addr+repo, one.Digest)
			got := openAttestations(t, ctx, verifier, reg2.Addr+repo, img.Digest)
			if len(want) != 1+len(one.Platforms) || len(got) != len(want) {
				t.Fatalf("%s: %d attestations spread, %d on one daemon", img.Name, len(got), len(want))
			}
			for _, m := range one.Platforms {
				want = append(want, openAttestations(t, ctx, verifier, reg.Addr+repo, m.Digest)...)
				got = append(got, openAttestations(t, ctx, verifier, reg2.Addr+repo, m.Digest)...)
			}
			if len(got) != len(want) || len(want) != 1+3*len(one.Platforms) {
				t.Fatalf("%s: with the platforms', %d attestations spread, %d on one daemon", img.Name, len(got), len(want))
			}
			for j := range want {
				if g := bytes.ReplaceAll(got[j], []byte(reg2.Addr), []byte(reg.Addr)); !bytes.Equal(g, want[j]) {
					t.Errorf("%s: attestation %d spread:\n%s\non one daemon:\n%s", img.Name, j, g, want[j])
				}
			}
			if out, err := cosign(t, "verify-attestation", "--key", pub, "--insecure-ignore-tlog", "--type", "slsaprovenance1", img.Refs[0]); err != nil {
				t.Errorf("cosign verify-attestation %s: %v\n%s", img.Refs[0], err, out)
			}
		}
		for i, a := range spread.Assets {
			if a.Name != first.Assets[i].Name || a.SHA256 != first.Assets[i].SHA256 {
				t.Errorf("asset %s spread: %s; on one daemon: %s %s", a.Name, a.SHA256, first.Assets[i].Name, first.Assets[i].SHA256)
			}
			if data, err := os.ReadFile(filepath.Join(spread.AssetsDir, a.Name)); err != nil || fmt.Sprintf("%x", sha256.Sum256(data)) != a.SHA256 {
				t.Errorf("asset %s: %v", a.Name, err)
			}
		}
		blob := []string{"verify-blob", "--insecure-ignore-tlog", "--key", pub, "--signature", filepath.Join(spread.AssetsDir, "SHA256SUMS.sig"), filepath.Join(spread.AssetsDir, "SHA256SUMS")}
		if out, err := cosign(t, blob...); err != nil {
			t.Errorf("cosign verify-blob of the spread release's SHA256SUMS: %v\n%s", err, out)
		}
		if entries, _ := os.ReadDir(o.OutDir); len(entries) != 1 || entries[0].Name() != "release" {
			t.Errorf("the spread release left %v in its output folder, want release/ alone", entries)
		}
	})

	resolver := buildkit.Resolver(true, false, buildkit.Credentials())
	vopts := release.VerifyReleaseOptions{PushOptions: publish.PushOptions{Registry: reg.Addr}, Version: version, PublicKey: pub}
	// A rebuild in isolation is a cold compile of each platform it
	// rebuilds: this one rebuilds linux/arm/v7 alone (cross-compiled, with a
	// variant) and compares its manifests; the one below rebuilds every
	// release platform warm and compares indexes. The signatures and
	// attestations of every platform are checked by both.
	const isolatedPlatform = "linux/arm/v7"
	withAssets := vopts
	withAssets.Assets = first.AssetsDir
	vo, err := release.VerifyRelease(ctx, session.Options{Root: root, Progress: "quiet", Platforms: isolatedPlatform}, withAssets)
	if err != nil {
		t.Fatal(err)
	}
	if !vo.OK() || vo.Commit != first.Commit || len(vo.Images) != 2 {
		t.Fatalf("release:verify of the release: %+v", vo)
	}
	// Every asset is checked against the signed SHA256SUMS; the one of the
	// platform rebuilt is rebuilt and compared.
	// The manifest is pinned again to what the registry serves and compared.
	if a := vo.Assets; len(a.Verified) != 3 || !slices.Equal(a.Compared, []string{"antrea.yml", "antctl-linux-arm"}) {
		t.Errorf("release:verify checked the assets %v and compared %v; want all 3, and antrea.yml and antctl-linux-arm", a.Verified, a.Compared)
	}
	// The isolated Go cache (and the binaries kept beside it) is emptied.
	noIsolatedCacheLeft(t, ctx, "release:verify", d)
	for _, img := range vo.Images {
		if strings.Join(img.Compared, ",") != isolatedPlatform || !img.Identical {
			t.Errorf("%s: compared %v, identical %v; want %s, identical", img.Name, img.Compared, img.Identical, isolatedPlatform)
		}
		if img.Signatures != 3 || img.Attestations != 3 {
			t.Errorf("%s: %d signatures and %d attestations verified, want 3 and 3 (the index and two platforms)", img.Name, img.Signatures, img.Attestations)
		}
	}
	// Both images carry binaries of the platform's one go build: the
	// isolated rebuild runs it, and each step before it, once (local
	// sources are sent to every job). A step that ignored the cache beside
	// one that did not would show twice under its name.
	for _, once := range []string{"[linux/arm/v7] go build", "[go] build kilnstep", "[go] go mod download", "[go] toolchain go"} {
		var runs []int
		for _, st := range vo.Rebuild {
			if strings.HasPrefix(st.Name, once) && !strings.HasSuffix(st.Name, "archive") {
				runs = append(runs, st.Runs)
			}
		}
		if !slices.Equal(runs, []int{1}) {
			t.Errorf("the isolated rebuild ran %s %v times, want once", once, runs)
		}
	}
	for _, st := range vo.Rebuild {
		if strings.HasPrefix(st.Name, "[linux/amd64]") {
			t.Errorf("release:verify -platforms=%s ran %s", isolatedPlatform, st.Name)
		}
	}
	if _, err := release.VerifyRelease(ctx, session.Options{Root: root, Progress: "quiet"}, release.VerifyReleaseOptions{PushOptions: vopts.PushOptions, Version: "v9.9.9", PublicKey: pub}); err == nil || !strings.Contains(err.Error(), "v9.9.9") {
		t.Errorf("release:verify of a version never released: %v", err)
	}

	// A build of another commit replaces the agent's linux/amd64 image. It
	// trusts the daemon's caches, as the release did and the warm rebuild
	// below does: the three share one compile of linux/amd64.
	testdaemon.AppendLine(t, filepath.Join(root, "pkg", "agent", "agent.go"), "\nvar tampered = \"another commit\"\n")
	testdaemon.Git(t, root, "commit", "-qam", "another commit")
	o := opts
	o.Platforms, o.Stamp, o.Release, o.TrustCaches = "linux/amd64", true, true, true
	o.Images = []string{"antrea-agent"}
	pushed, err := publish.Push(ctx, o, publish.PushOptions{Registry: reg.Addr})
	if err != nil {
		t.Fatal(err)
	}
	_, _, otherIndex, err := reg.Manifest("antrea/antrea-agent", pushed[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	_, mediaType, released, err := reg.Manifest("antrea/antrea-agent", version)
	if err != nil {
		t.Fatal(err)
	}
	var idx, otherIdx ocispec.Index
	json.Unmarshal(released, &idx)
	json.Unmarshal(otherIndex, &otherIdx)
	if len(otherIdx.Manifests) != 1 || len(idx.Manifests) != 2 {
		t.Fatalf("indexes of %d and %d manifests", len(otherIdx.Manifests), len(idx.Manifests))
	}
	idx.Manifests[0] = otherIdx.Manifests[0] // linux/amd64
	tampered, _ := json.Marshal(idx)
	reg.PutManifest(t, "antrea/antrea-agent", version, mediaType, tampered)

	// The controller keeps its images, but its amd64 signature is another
	// key's and its provenance, signed with the right key, names another
	// commit.
	controllerRepo := reg.Addr + "/antrea/antrea-controller"
	_, _, controllerIndex, err := reg.Manifest("antrea/antrea-controller", version)
	if err != nil {
		t.Fatal(err)
	}
	var cidx ocispec.Index
	json.Unmarshal(controllerIndex, &cidx)
	otherSigner, err := sign.LoadKey(filepath.Join(other, "cosign.key"), []byte("other-pass"))
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := otherSigner.SignatureLayer(controllerRepo, cidx.Manifests[0].Digest)
	if _, err := sign.Attach(ctx, resolver, controllerRepo, cidx.Manifests[0].Digest, "sig", []sign.Layer{foreign}); err != nil {
		t.Fatal(err)
	}
	signer, err := sign.LoadKey(filepath.Join(keys, "cosign.key"), []byte("release-pass"))
	if err != nil {
		t.Fatal(err)
	}
	cdigest := digest.FromBytes(controllerIndex)
	atts, err := sign.Fetch(ctx, resolver, controllerRepo, cdigest, "att")
	if err != nil {
		t.Fatal(err)
	}
	st, err := signer.Verifier().OpenEnvelope(atts[0].Data)
	if err != nil || !bytes.Contains(st, []byte(first.Commit)) {
		t.Fatalf("the controller's first attestation is not its provenance: %v", err)
	}
	lie, _ := signer.AttestationLayer(bytes.ReplaceAll(st, []byte(first.Commit), []byte(strings.Repeat("0", 40))), "https://slsa.dev/provenance/v1")
	atts[0] = lie
	if _, err := sign.Attach(ctx, resolver, controllerRepo, cdigest, "att", atts); err != nil {
		t.Fatal(err)
	}

	if _, err := release.VerifyRelease(ctx, session.Options{Root: root, Progress: "quiet", Platforms: "linux/s390x"}, vopts); err == nil || !strings.Contains(err.Error(), "-platforms: linux/s390x is not a release platform") {
		t.Errorf("release:verify -platforms=linux/s390x: %v", err)
	}
	// Every signature is checked and every platform rebuilt, on the
	// release's warm cache: the indexes are compared.
	t.Cleanup(release.WarmRebuilds())
	vo, err = release.VerifyRelease(ctx, session.Options{Root: root, Progress: "quiet"}, vopts)
	if err != nil {
		t.Fatal(err)
	}
	if vo.OK() {
		t.Fatal("release:verify passed a release whose amd64 agent is another commit's build")
	}
	agent, controller := vo.Images[0], vo.Images[1]
	if strings.Join(agent.Compared, ",") != releasePlatforms || agent.Identical || !controller.Identical || controller.Rebuilt != controller.Digest {
		t.Errorf("release:verify compared %v; agent identical %v, controller identical %v, its index rebuilt as %s of %s", agent.Compared, agent.Identical, controller.Identical, controller.Rebuilt, controller.Digest)
	}
	if len(agent.Problems) == 0 || !strings.Contains(strings.Join(agent.Problems, "\n"), "no signature") {
		t.Errorf("the tampered index's signatures: %v", agent.Problems)
	}
	problems := strings.Join(controller.Problems, "\n")
	if !strings.Contains(problems, "linux/amd64: ") || !strings.Contains(problems, "no signature") ||
		!strings.Contains(problems, "provenance names commit \""+strings.Repeat("0", 40)) {
		t.Errorf("the controller, identical but signed with another key and attested with another commit: %+v", controller)
	}
	var located bool
	for _, d := range vo.Differences {
		located = located || d.Platform == "linux/amd64" && strings.Contains(d.Path, "usr/local/bin/antrea-agent")
		if d.Platform != "linux/amd64" && d.Where != "index" {
			t.Errorf("a difference outside the replaced platform: %s", d)
		}
	}
	if !located {
		t.Errorf("the differences do not name the agent binary of linux/amd64: %v", vo.Differences)
	}
	for _, d := range vo.Differences {
		t.Logf("located: %s", d)
	}
}

// checkSBOMs parses each SBOM with the SPDX library and compares its
// modules with `go version -m` of that platform's binaries in the image.
func checkSBOMs(t *testing.T, ctx context.Context, img publish.PushResult, sts []map[string]json.RawMessage) {
	t.Helper()
	layout, err := release.PullLayout(ctx, buildkit.Resolver(true, false, buildkit.Credentials()), img.Refs[0], digest.Digest(img.Digest))
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != len(layout.Manifests) {
		t.Fatalf("%s: %d SBOMs for %d platforms", img.Name, len(sts), len(layout.Manifests))
	}
	namespaces := map[string]bool{}
	for _, st := range sts {
		doc, err := spdxjson.Read(bytes.NewReader(st["predicate"]))
		if err != nil {
			t.Fatalf("%s: the SPDX library does not parse the SBOM: %v", img.Name, err)
		}
		namespaces[doc.DocumentNamespace] = true
		var subjects []struct{ Digest map[string]string }
		json.Unmarshal(st["subject"], &subjects)
		var platform string
		for _, m := range layout.Manifests {
			for _, s := range subjects {
				if "sha256:"+s.Digest["sha256"] == m.Digest {
					platform = m.Platform
				}
			}
		}
		if platform == "" {
			t.Fatalf("%s: an SBOM names no platform manifest of the image: %s", img.Name, st["subject"])
		}
		inSBOM := map[string]bool{}
		for _, p := range doc.Packages {
			inSBOM[p.PackageName+" "+p.PackageVersion] = true
		}
		want := map[string]bool{}
		for _, man := range layout.Manifests {
			if man.Platform != platform {
				continue
			}
			for _, l := range man.Layers {
				for _, f := range l.Files {
					if !strings.HasPrefix(f.Path, "usr/local/bin/") || f.Type != '0' {
						continue
					}
					bin := filepath.Join(t.TempDir(), filepath.Base(f.Path))
					os.WriteFile(bin, f.Data, 0o755)
					mods, err := exec.Command("go", "version", "-m", bin).Output()
					if err != nil {
						t.Fatal(err)
					}
					for _, line := range strings.Split(string(mods), "\n") {
						fs := strings.Fields(line)
						switch {
						case len(fs) >= 3 && fs[0] == "dep":
							want[fs[1]+" "+fs[2]] = true
						case len(fs) >= 2 && fs[0] == "mod":
							want[fs[1]+" v1.0.0"] = true // the release's version, not (devel)
						}
					}
				}
			}
		}
		if len(want) < 5 {
			t.Fatalf("%s %s: go version -m lists %d modules; the check needs real ones", img.Name, platform, len(want))
		}
		for mod := range want {
			if !inSBOM[mod] {
				t.Errorf("%s %s: the SBOM lacks %s", img.Name, platform, mod)
			}
		}
		for p := range inSBOM {
			name, _, _ := strings.Cut(p, " ")
			if strings.Contains(name, ".") && !want[p] {
				t.Errorf("%s %s: the SBOM lists %s, which no binary of the image holds", img.Name, platform, p)
			}
		}
		_, hasCNI := want["github.com/containernetworking/cni "+versionOf(want, "github.com/containernetworking/cni")]
		if hasCNI != strings.Contains(img.Name, "agent") {
			t.Errorf("%s %s: CNI modules %t", img.Name, platform, hasCNI)
		}
	}
	if len(namespaces) != len(sts) {
		t.Errorf("%s: SBOM namespaces are not unique per platform: %v", img.Name, namespaces)
	}
}

func versionOf(mods map[string]bool, path string) string {
	for m := range mods {
		if p, v, _ := strings.Cut(m, " "); p == path {
			return v
		}
	}
	return ""
}

func suffix(v string) string {
	if v == "" {
		return ""
	}
	return "/" + v
}

func mustVerifier(t *testing.T, pub string) *sign.Verifier {
	t.Helper()
	v, err := sign.LoadPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// openAttestations are the statements attached to an index, opened.
func openAttestations(t *testing.T, ctx context.Context, v *sign.Verifier, repo, index string) [][]byte {
	t.Helper()
	layers, err := sign.Fetch(ctx, buildkit.Resolver(true, false, buildkit.Credentials()), repo, digest.Digest(index), "att")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, l := range layers {
		st, err := v.OpenEnvelope(l.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, st)
	}
	return out
}
