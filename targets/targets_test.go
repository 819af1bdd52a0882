package targets_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/testdaemon"
	"github.com/kiln-build/kiln/internal/verify"
)

// mage runs the README's entry, `go run mage.go`, in dir.
func mage(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", "mage.go"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// readmeTargets are the names in the README's target table.
func readmeTargets(t *testing.T) []string {
	f, err := os.Open(filepath.Join(testdaemon.RepoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([a-z:]+)` \\|")
	var names []string
	inTable := false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			inTable = line == "## Targets"
		}
		if m := row.FindStringSubmatch(line); inTable && m != nil {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return names
}

func TestMageListsExactlyTheReadmeTargets(t *testing.T) {
	out, err := mage(t, testdaemon.RepoRoot(t), "-l")
	if err != nil {
		t.Fatalf("mage -l: %v\n%s", err, out)
	}
	var listed []string
	inTargets := false
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "Targets:") {
			inTargets = true
			continue
		}
		if fields := strings.Fields(line); inTargets && len(fields) > 0 {
			listed = append(listed, strings.TrimSuffix(fields[0], "*"))
		}
	}
	slices.Sort(listed)
	if documented := readmeTargets(t); !slices.Equal(listed, documented) || len(listed) < 10 {
		t.Errorf("mage -l lists %v\nthe README documents %v", listed, documented)
	}
}

func TestEveryDocumentedTargetResolves(t *testing.T) {
	root := testdaemon.RepoRoot(t)
	for _, name := range readmeTargets(t) {
		out, err := mage(t, root, "-h", name)
		if err != nil || strings.Contains(out, "Unknown target") || !strings.Contains(out, "mage "+name) {
			t.Errorf("mage -h %s: %v\n%s", name, err, out)
		}
	}
}

// TestAdoptingRepository is a repository of its own that adds kiln the way
// the README says: a magefile with two imports, magefiles/go.mod requiring
// kiln, build/kiln.yaml and one image.
func TestAdoptingRepository(t *testing.T) {
	testdaemon.Buildkit(t)
	kiln := testdaemon.RepoRoot(t)
	repo := t.TempDir()
	read := func(rel string) string {
		data, err := os.ReadFile(filepath.Join(kiln, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	kilnYAML := read("build/kiln.yaml")
	kilnYAML = kilnYAML[:strings.Index(kilnYAML, "# The binaries kiln builds")] + `
binaries:
  - name: hello
    package: ./cmd/hello
stamp:
  package: example.com/adopter/pkg/version
cache:
  gocache: adopter-gocache
  gomodcache: adopter-gomodcache
repository: adopter
tag: dev
source: https://example.com/adopter
`
	modfixture.Write(t, repo, map[string]string{
		"go.mod":                  "module example.com/adopter\n\ngo 1.26\n",
		"cmd/hello/main.go":       "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/adopter/pkg/version\"\n)\n\nfunc main() { fmt.Println(\"hello\", version.Version) }\n",
		"pkg/version/version.go":  "package version\n\nvar Version, GitCommit, GitTreeState = \"\", \"\", \"\"\n",
		"build/kiln.yaml":         kilnYAML,
		"images/hello/image.yaml": "binaries: [hello]\nentrypoint: [/usr/local/bin/hello]\n",
		"mage.go":                 read("mage.go"),
		"magefiles/magefile.go":   read("magefiles/magefile.go"),
		"magefiles/go.mod": "module example.com/adopter/magefiles\n\ngo 1.26.8\n\nrequire github.com/kiln-build/kiln v0.0.0\n\n" +
			"replace github.com/kiln-build/kiln => " + kiln + "\n\ntool github.com/magefile/mage\n",
		"magefiles/go.sum": read("magefiles/go.sum"),
	})
	tidy := exec.Command("go", "mod", "tidy")
	tidy.Dir = filepath.Join(repo, "magefiles")
	if out, err := tidy.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy in magefiles: %v\n%s", err, out)
	}
	deps := exec.Command("go", "list", "-deps", "./...")
	deps.Dir = repo
	if out, err := deps.CombinedOutput(); err != nil || strings.Contains(string(out), "buildkit") {
		t.Fatalf("the product's packages: %v\n%s", err, out)
	}

	out, err := mage(t, repo, "plan")
	if err != nil || !strings.Contains(out, "example.com/adopter/pkg/version.Version=v0.0.0-dev") {
		t.Fatalf("mage plan in the adopting repository: %v\n%s", err, out)
	}
	out, err = mage(t, repo, "images", "-platforms=linux/amd64", "-progress=plain")
	if err != nil {
		t.Fatalf("mage images in the adopting repository: %v\n%s", err, out)
	}
	tarball := filepath.Join(repo, "_output", "images", "hello.oci.tar")
	layout, err := verify.ReadLayout(tarball)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "adopter/hello:dev") || len(layout.Manifests) != 1 {
		t.Errorf("images printed %q and wrote %d manifests", out, len(layout.Manifests))
	}
	if _, ok := layout.Manifests[0].File("usr/local/bin/hello"); !ok {
		t.Error("the image lacks /usr/local/bin/hello")
	}
}

func TestProductBinariesImportNothingOfTheBuildLayer(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/...")
	cmd.Dir = testdaemon.RepoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/kiln-build/kiln/pkg/version") {
		t.Fatalf("go list -deps ./cmd/... = %v", deps)
	}
	for _, dep := range deps {
		for _, banned := range []string{"github.com/moby/buildkit", "github.com/containerd/", "google.golang.org/grpc", "github.com/kiln-build/kiln/internal/", "github.com/kiln-build/kiln/targets", "github.com/magefile/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("a binary of the product imports %s", dep)
			}
		}
	}
}
