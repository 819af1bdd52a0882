package publish_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/build"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

func TestRelease(t *testing.T) {
	testdaemon.Buildkit(t)
	reg := testdaemon.StartRegistry(t)
	ctx := context.Background()
	root := testdaemon.RepoRoot(t)
	out := t.TempDir()
	opts := build.Options{Root: root, Progress: "quiet", OutDir: out}
	ropts := publish.ReleaseOptions{PushOptions: publish.PushOptions{Registry: reg.Addr}, Force: true}

	t.Run("dry run publishes nothing", func(t *testing.T) {
		dry := ropts
		dry.DryRun = true
		sum, err := publish.Release(ctx, opts, dry)
		if err != nil {
			t.Fatal(err)
		}
		if len(sum.Images) != 2 || len(sum.Assets) != 9 || !strings.HasPrefix(sum.Images[0].Refs[0], reg.Addr+"/antrea/antrea-agent:") {
			t.Errorf("dry run summary: %+v", sum)
		}
		if _, err := os.Stat(sum.AssetsDir); !os.IsNotExist(err) {
			t.Errorf("a dry run wrote %s", sum.AssetsDir)
		}
		if _, _, _, err := reg.Manifest("antrea/antrea-agent", sum.Version); err == nil {
			t.Error("a dry run pushed")
		}
	})

	t.Run("a dirty tree refuses", func(t *testing.T) {
		tree := t.TempDir()
		testdaemon.CopyTree(t, root, tree)
		testdaemon.AppendLine(t, filepath.Join(tree, "README.md"), "\nuncommitted\n")
		o := opts
		o.Root = tree
		r := ropts
		r.Force = false
		if _, err := publish.Release(ctx, o, r); err == nil || !strings.Contains(err.Error(), "uncommitted") {
			t.Errorf("a dirty release: %v", err)
		}
	})

	first, err := publish.Release(ctx, opts, ropts)
	if err != nil {
		t.Fatal(err)
	}
	sums, err := os.ReadFile(filepath.Join(first.AssetsDir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("assets verify against SHA256SUMS and run", func(t *testing.T) {
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
		if n := strings.Count(string(sums), "\n"); n != 9 {
			t.Errorf("SHA256SUMS has %d lines, want 9", n)
		}
		got, err := exec.Command(filepath.Join(first.AssetsDir, "antctl-linux-x86_64"), "version").Output()
		if err != nil || !strings.Contains(string(got), "antctl version "+first.Version) || !strings.Contains(string(got), first.Commit) {
			t.Errorf("antctl asset says %q (%v), want version %s and commit %s", got, err, first.Version, first.Commit)
		}
	})

	t.Run("images carry three platforms, provenance and an SBOM", func(t *testing.T) {
		for _, img := range first.Images {
			name := "antrea/" + img.Name
			dgst, _, body, err := reg.Manifest(name, first.Version)
			if err != nil {
				t.Fatal(err)
			}
			if dgst != img.Digest {
				t.Errorf("%s: registry has %s, release reported %s", name, dgst, img.Digest)
			}
			var index ocispec.Index
			json.Unmarshal(body, &index)
			var plats []string
			predicates := map[string][]byte{}
			for _, m := range index.Manifests {
				if m.Annotations["vnd.docker.reference.type"] == "attestation-manifest" {
					_, _, mb, err := reg.Manifest(name, m.Digest.String())
					if err != nil {
						t.Fatal(err)
					}
					var am ocispec.Manifest
					json.Unmarshal(mb, &am)
					for _, l := range am.Layers {
						blob, err := reg.Blob(name, l.Digest.String())
						if err != nil {
							t.Fatal(err)
						}
						if bytes.Contains(blob, []byte(reg.Pass)) {
							t.Errorf("%s: an attestation contains the registry password", name)
						}
						predicates[l.Annotations["in-toto.io/predicate-type"]] = blob
					}
					continue
				}
				plats = append(plats, m.Platform.OS+"/"+m.Platform.Architecture+suffix(m.Platform.Variant))
			}
			if strings.Join(plats, ",") != publish.ReleasePlatforms {
				t.Errorf("%s platforms %v, want %s", name, plats, publish.ReleasePlatforms)
			}
			if _, ok := predicates["https://slsa.dev/provenance/v0.2"]; !ok && predicates["https://slsa.dev/provenance/v1"] == nil {
				t.Errorf("%s: no provenance attestation (predicates %v)", name, keys(predicates))
			}
			sbom, ok := predicates["https://spdx.dev/Document"]
			if !ok {
				t.Fatalf("%s: no SBOM attestation (predicates %v)", name, keys(predicates))
			}
			var statement struct {
				Predicate struct {
					Packages []struct{ Name string } `json:"packages"`
				} `json:"predicate"`
			}
			if err := json.Unmarshal(sbom, &statement); err != nil {
				t.Fatalf("%s: SBOM statement: %v", name, err)
			}
			listed := map[string]bool{}
			for _, p := range statement.Predicate.Packages {
				listed[p.Name] = true
			}
			// Every module `go version -m` lists for the binary is in the SBOM.
			mods, err := exec.Command("go", "version", "-m", filepath.Join(first.AssetsDir, "antctl-linux-x86_64")).Output()
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(mods), "\n") {
				f := strings.Fields(line)
				if len(f) >= 2 && (f[0] == "mod" || f[0] == "dep") && !listed[f[1]] {
					t.Errorf("%s: SBOM lacks module %s", name, f[1])
				}
			}
			if !listed["stdlib"] || !listed["antctl"] {
				t.Errorf("%s: SBOM lacks the standard library", name)
			}
			// Each image lists the modules of its own binaries and no others:
			// the agent image carries the CNI plugin, the controller does not.
			wantCNI := strings.Contains(name, "agent")
			if !listed["github.com/prometheus/client_golang"] || !listed["github.com/spf13/cobra"] || listed["github.com/containernetworking/cni"] != wantCNI {
				t.Errorf("%s: SBOM modules prometheus %t, cobra %t, cni %t (want cni %t)", name,
					listed["github.com/prometheus/client_golang"], listed["github.com/spf13/cobra"], listed["github.com/containernetworking/cni"], wantCNI)
			}
		}
	})

	t.Run("a second release is byte-identical", func(t *testing.T) {
		second, err := publish.Release(ctx, opts, ropts)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := os.ReadFile(filepath.Join(second.AssetsDir, "SHA256SUMS"))
		if !bytes.Equal(sums, again) {
			t.Errorf("assets differ between two releases:\n%s\n%s", sums, again)
		}
		for i, img := range second.Images {
			a := platformManifests(t, reg, "antrea/"+img.Name, img.Digest)
			b := platformManifests(t, reg, "antrea/"+first.Images[i].Name, first.Images[i].Digest)
			if strings.Join(a, ",") != strings.Join(b, ",") {
				t.Errorf("%s: platform manifests differ between releases:\n%v\n%v", img.Name, a, b)
			}
		}
	})
}

func platformManifests(t *testing.T, reg *testdaemon.Registry, name, digest string) []string {
	t.Helper()
	_, _, body, err := reg.Manifest(name, digest)
	if err != nil {
		t.Fatal(err)
	}
	var index ocispec.Index
	json.Unmarshal(body, &index)
	var out []string
	for _, m := range index.Manifests {
		if m.Annotations["vnd.docker.reference.type"] != "attestation-manifest" {
			out = append(out, m.Digest.String())
		}
	}
	return out
}

func suffix(v string) string {
	if v == "" {
		return ""
	}
	return "/" + v
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
