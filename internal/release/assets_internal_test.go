package release

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/sign"
	"github.com/kiln-build/kiln/internal/spread"
)

// TestCheckAssets: release:verify accepts the assets a release wrote and
// names each way a downloaded folder can differ from them.
func TestCheckAssets(t *testing.T) {
	keys := t.TempDir()
	signer, verifier := keyPair(t, keys, "release")
	_, foreign := keyPair(t, keys, "other")
	assets := []string{"antctl-linux-x86_64", "antctl-windows-x86_64.exe"}
	// release writes them so: the files, SHA256SUMS and its signature.
	write := func(t *testing.T, files map[string]string, listed ...string) string {
		dir := t.TempDir()
		var lines []string
		for _, name := range slices.Sorted(maps.Keys(files)) {
			os.WriteFile(filepath.Join(dir, name), []byte(files[name]), 0o755)
			lines = append(lines, fmt.Sprintf("%x  %s", sha256.Sum256([]byte(files[name])), name))
		}
		lines = append(lines, listed...)
		sums := []byte(strings.Join(lines, "\n") + "\n")
		sig, err := signer.Sign(sums)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, SumsFile), sums, 0o644)
		os.WriteFile(filepath.Join(dir, SumsFile+".sig"), []byte(sig+"\n"), 0o644)
		return dir
	}
	files := map[string]string{"antctl-linux-x86_64": "linux binary", "antctl-windows-x86_64.exe": "windows binary"}

	t.Run("as written", func(t *testing.T) {
		sums, problems := checkAssets(write(t, files), assets, verifier)
		if len(problems) > 0 || len(sums) != 2 || sums["antctl-linux-x86_64"] != fmt.Sprintf("%x", sha256.Sum256([]byte("linux binary"))) {
			t.Errorf("sums %v, problems %v", sums, problems)
		}
	})
	for _, tt := range []struct {
		name   string
		change func(t *testing.T, dir string)
		want   string
	}{
		{"a file replaced", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "antctl-linux-x86_64"), []byte("trojan binary"), 0o755)
		}, "antctl-linux-x86_64: its sha256 is"},
		{"SHA256SUMS edited to match", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "antctl-linux-x86_64"), []byte("trojan binary"), 0o755)
			data, _ := os.ReadFile(filepath.Join(dir, SumsFile))
			edited := strings.Replace(string(data), fmt.Sprintf("%x", sha256.Sum256([]byte("linux binary"))), fmt.Sprintf("%x", sha256.Sum256([]byte("trojan binary"))), 1)
			os.WriteFile(filepath.Join(dir, SumsFile), []byte(edited), 0o644)
		}, "does not verify"},
		{"a file missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "antctl-windows-x86_64.exe"))
		}, "antctl-windows-x86_64.exe: open"},
		{"no signature", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, SumsFile+".sig"))
		}, "SHA256SUMS.sig: no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := write(t, files)
			tt.change(t, dir)
			_, problems := checkAssets(dir, assets, verifier)
			if !strings.Contains(strings.Join(problems, "\n"), tt.want) {
				t.Errorf("problems %q, want one saying %q", problems, tt.want)
			}
		})
	}
	t.Run("another key's signature", func(t *testing.T) {
		if _, problems := checkAssets(write(t, files), assets, foreign); !strings.Contains(strings.Join(problems, "\n"), "does not verify") {
			t.Errorf("problems %q", problems)
		}
	})
	t.Run("one asset more or less than the tag names", func(t *testing.T) {
		dir := write(t, map[string]string{"antctl-linux-x86_64": "linux binary", "antctl-darwin-arm64": "mac binary"})
		_, problems := checkAssets(dir, assets, verifier)
		all := strings.Join(problems, "\n")
		if !strings.Contains(all, "lists no antctl-windows-x86_64.exe") || !strings.Contains(all, "lists antctl-darwin-arm64, which the tag's") {
			t.Errorf("problems %q", problems)
		}
	})
}

// TestCheckManifests: release:verify accepts a manifest pinned to the
// digests the registry serves, and refuses one pinned to others or
// another file than the tag's.
func TestCheckManifests(t *testing.T) {
	root := t.TempDir()
	source := "# the agent\nimage: antrea/antrea-agent:latest # kept\n---\nimage: antrea/antrea-controller\n"
	os.MkdirAll(filepath.Join(root, "build", "yamls"), 0o755)
	os.WriteFile(filepath.Join(root, "build", "yamls", "antrea.yml"), []byte(source), 0o644)
	files := []config.ManifestFile{{Path: "build/yamls/antrea.yml", Name: "antrea.yml"}}
	agent, controller := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("c", 64)
	images := []VerifiedImage{
		{Name: "antrea-agent", Ref: "reg.example:5000/antrea/antrea-agent:v1.0.0", Digest: agent},
		{Name: "antrea-controller", Ref: "reg.example:5000/antrea/antrea-controller:v1.0.0", Digest: controller},
	}
	released := "# the agent\nimage: reg.example:5000/antrea/antrea-agent@" + agent + " # kept\n---\nimage: reg.example:5000/antrea/antrea-controller@" + controller + "\n"
	sums := func(content string) map[string]string {
		return map[string]string{"antrea.yml": fmt.Sprintf("%x", sha256.Sum256([]byte(content)))}
	}
	if compared, problems := checkManifests(root, files, "antrea", images, sums(released)); len(problems) > 0 || !slices.Equal(compared, []string{"antrea.yml"}) {
		t.Errorf("the manifest as released: compared %v, problems %v", compared, problems)
	}
	swapped := strings.NewReplacer(agent, controller, controller, agent).Replace(released)
	if _, problems := checkManifests(root, files, "antrea", images, sums(swapped)); len(problems) != 1 || !strings.Contains(problems[0], "antrea.yml: SHA256SUMS says") {
		t.Errorf("a manifest pinned to other digests: %v", problems)
	}
	other := slices.Clone(images)
	other[0].Digest = "sha256:" + strings.Repeat("b", 64)
	if _, problems := checkManifests(root, files, "antrea", other, sums(released)); len(problems) != 1 {
		t.Errorf("the registry serving another agent: %v", problems)
	}
	if _, problems := checkManifests(root, files, "antrea", images, sums(strings.Replace(released, "# kept", "# edited", 1))); len(problems) != 1 {
		t.Errorf("a manifest edited beyond its references: %v", problems)
	}
}

// keyPair writes a cosign key pair named name under dir.
func keyPair(t *testing.T, dir, name string) (*sign.Signer, *sign.Verifier) {
	t.Helper()
	private, public, err := sign.GenerateKeyPair([]byte("pass"))
	if err != nil {
		t.Fatal(err)
	}
	key, pub := filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	os.WriteFile(key, private, 0o600)
	os.WriteFile(pub, public, 0o644)
	signer, err := sign.LoadKey(key, []byte("pass"))
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := sign.LoadPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return signer, verifier
}

func TestDealAssets(t *testing.T) {
	shares := []spread.Share{{Host: "a", Platforms: []string{"linux/amd64", "linux/arm/v7"}}, {Host: "b", Platforms: []string{"linux/arm64"}}}
	assets := []image.Asset{
		{Name: "antctl-linux-arm", Platform: "linux/arm/v7"},
		{Name: "antctl-windows.exe", Platform: "windows/amd64"},
		{Name: "antctl-darwin", Platform: "darwin/arm64"},
		{Name: "antctl-linux-arm64", Platform: "linux/arm64"},
		{Name: "antrea-cni-windows.exe", Platform: "windows/amd64"},
	}
	var got []string
	for i, d := range dealAssets(assets, shares) {
		for _, a := range d {
			got = append(got, shares[i].Host+" "+a.Name)
		}
	}
	// Each to the share of its platform; the platforms no share has to the
	// least loaded, both Windows assets together.
	want := []string{"a antctl-linux-arm", "a antctl-darwin", "b antctl-windows.exe", "b antctl-linux-arm64", "b antrea-cni-windows.exe"}
	if !slices.Equal(got, want) {
		t.Errorf("dealt %v, want %v", got, want)
	}
}
