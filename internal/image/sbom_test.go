package image

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	spdxjson "github.com/spdx/tools-golang/json"

	"github.com/kiln-build/kiln/internal/config"
)

// The input is a binary with real module dependencies (testdata/sbommain),
// built here with the host go.
func TestSBOMListsEveryModuleOfTheBinaryOnce(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "sbommain")
	if out, err := exec.Command("go", "build", "-o", exe, "./testdata/sbommain").CombinedOutput(); err != nil {
		t.Fatalf("build the SBOM test binary: %v\n%s", err, out)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	info, err := buildinfo.Read(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	created := time.Unix(1700000000, 0)
	bins := map[string][]byte{"one": data, "two": data}
	doc, err := SBOM("img", "linux/amd64", "v1.2.3", created, bins)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := SBOM("img", "linux/amd64", "v1.2.3", created, bins)
	if !bytes.Equal(doc, again) {
		t.Error("two SBOMs of the same binaries differ")
	}
	parsed, err := spdxjson.Read(bytes.NewReader(doc))
	if err != nil {
		t.Fatalf("the SPDX library does not parse the SBOM: %v", err)
	}
	versions := map[string]string{}
	purls := map[string]string{}
	ids := map[string]bool{}
	for _, p := range parsed.Packages {
		id := string(p.PackageSPDXIdentifier)
		if ids[id] {
			t.Errorf("SPDX id %s used twice", id)
		}
		ids[id] = true
		versions[p.PackageName] = p.PackageVersion
		for _, r := range p.PackageExternalReferences {
			purls[p.PackageName] = r.Locator
		}
		if p.PackageName == "one" {
			sum := sha256.Sum256(data)
			if len(p.PackageChecksums) != 1 || p.PackageChecksums[0].Value != hex.EncodeToString(sum[:]) {
				t.Errorf("binary one's checksums %v", p.PackageChecksums)
			}
		}
	}
	if got, want := purls[info.Main.Path], "pkg:golang/"+info.Main.Path+"@v1.2.3"; got != want {
		t.Errorf("the main module's purl is %q, want %q", got, want)
	}
	other, _ := SBOM("img", "linux/arm64", "v1.2.3", created, bins)
	otherDoc, _ := spdxjson.Read(bytes.NewReader(other))
	if otherDoc.DocumentNamespace == parsed.DocumentNamespace {
		t.Errorf("two platforms' SBOMs share the namespace %s", parsed.DocumentNamespace)
	}
	if len(info.Deps) < 3 {
		t.Fatalf("the test binary has %d dependencies; the test needs a real graph", len(info.Deps))
	}
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		if versions[d.Path] != d.Version {
			t.Errorf("module %s: SBOM says %q, build info %q", d.Path, versions[d.Path], d.Version)
		}
	}
	if versions["stdlib"] != info.GoVersion || versions["one"] != "v1.2.3" || versions["two"] != "v1.2.3" {
		t.Errorf("stdlib %q, binaries %q and %q", versions["stdlib"], versions["one"], versions["two"])
	}
}

func TestSPDXIDsOfDifferentNamesNeverCollide(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"a/b", "a-b", "a_b", "a--b", "a-2f-b", "a.b", "é"} {
		id := spdxID(name)
		if other, ok := seen[id]; ok {
			t.Errorf("%q and %q both become %q", name, other, id)
		}
		seen[id] = name
		for _, r := range id {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-') {
				t.Errorf("%q: id %q holds %q", name, id, r)
			}
		}
	}
}

// TestReleaseAssetsOfThisRepository: this repository's kiln.yaml ships the
// files Antrea ships, named as Antrea names them.
func TestReleaseAssetsOfThisRepository(t *testing.T) {
	cfg, err := config.Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range Assets(cfg.Release) {
		names = append(names, a.Name)
	}
	want := []string{
		"antctl-linux-x86_64", "antctl-linux-arm64", "antctl-linux-arm", "antctl-darwin-x86_64", "antctl-darwin-arm64",
		"antctl-windows-x86_64.exe", "antctl-windows-arm64.exe", "antrea-agent-windows-x86_64.exe", "antrea-cni-windows-x86_64.exe",
	}
	if !slices.Equal(names, want) {
		t.Errorf("release assets %v, want %v", names, want)
	}
	if got := strings.Join(cfg.Release.Platforms, ","); got != "linux/amd64,linux/arm64,linux/arm/v7" {
		t.Errorf("release platforms %s", got)
	}
}

// TestGoPURLsAreWrittenAsOtherToolsWriteThem: the package-url library's
// encoding, "+incompatible" included.
func TestGoPURLsAreWrittenAsOtherToolsWriteThem(t *testing.T) {
	for path, want := range map[string]string{
		"github.com/docker/cli@v29.8.2+incompatible": "pkg:golang/github.com/docker/cli@v29.8.2%2Bincompatible",
		"golang.org/x/net@v0.60.0":                   "pkg:golang/golang.org/x/net@v0.60.0",
		"stdlib@go1.26.8":                            "pkg:golang/stdlib@go1.26.8",
	} {
		p, v, _ := strings.Cut(path, "@")
		if got := GoPURL(p, v); got != want {
			t.Errorf("GoPURL(%q, %q) = %q, want %q", p, v, got, want)
		}
	}
}
