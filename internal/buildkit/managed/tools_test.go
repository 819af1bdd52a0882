package managed

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/mod/modfile"
)

// TestToolsModuleSharesKilnsVersions: a module that both the tools module
// and kiln's go.mod files require is at one version in both. A package
// compiled at another version, or over a dependency at another version,
// is compiled again when the first run builds buildkitd (x/sync alone put
// 12 CPU-s of containerd's and BuildKit's packages back on it).
func TestToolsModuleSharesKilnsVersions(t *testing.T) {
	tools, err := modfile.Parse("tools/buildkitd.mod", toolsGoMod, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, r := range tools.Require {
		want[r.Mod.Path] = r.Mod.Version
	}
	for _, name := range []string{"go.mod", "magefiles/go.mod"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		kiln, err := modfile.Parse(name, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range kiln.Require {
			if v, ok := want[r.Mod.Path]; ok && v != r.Mod.Version {
				t.Errorf("%s requires %s %s, internal/buildkit/managed/tools/buildkitd.mod %s: require one version in both (go get it in a copy of the tools module, then go mod tidy)", name, r.Mod.Path, r.Mod.Version, v)
			}
		}
	}
}
