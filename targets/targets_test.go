package targets_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
	"github.com/kiln-build/kiln/internal/verify/inspect"
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

// TestEveryDocumentedTargetResolves asks the binary `go run mage.go`
// compiles and runs (TestMageListsExactlyTheReadmeTargets runs it that way)
// for each target's help: through go run, each would cost three go
// commands, a second of CPU.
func TestEveryDocumentedTargetResolves(t *testing.T) {
	root := testdaemon.RepoRoot(t)
	bin := testdaemon.MageBinary(t)
	for _, name := range readmeTargets(t) {
		cmd := exec.Command(bin, "-h", name)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Contains(string(out), "Unknown target") || !strings.Contains(string(out), "mage "+name) {
			t.Errorf("mage -h %s: %v\n%s", name, err, out)
		}
	}
}

// TestAdoptingRepository is an Antrea-shaped repository of its own that
// adds kiln the way the README says: the two short files of Go
// (adopterFiles), build/kiln.yaml with Antrea's stamp
// variables, an agent image on a digest-pinned base running as root with a
// folder of scripts, and a controller image on scratch. Its binaries share a
// package and use a module from the proxy.
func TestAdoptingRepository(t *testing.T) {
	d := testdaemon.Buildkit(t)
	reg := testdaemon.StartRegistry(t)
	base := reg.PushBase(t, d, "antrea/base")
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
  - {name: antctl, package: ./cmd/antctl}
  - {name: antrea-agent, package: ./cmd/antrea-agent}
  - {name: antrea-cni, package: ./cmd/antrea-cni}
  - {name: antrea-controller, package: ./cmd/antrea-controller}
stamp:
  variables:
    example.com/antrea/pkg/version.Version: version
    example.com/antrea/pkg/version.GitSHA: commit
    example.com/antrea/pkg/version.GitTreeState: treeState
    example.com/antrea/pkg/version.ReleaseStatus: releaseStatus
cache:
  gocache: adopter-gocache
  gomodcache: adopter-gomodcache
repository: antrea
tag: dev
source: https://example.com/antrea
`
	var sums []string
	for _, line := range strings.Split(read("go.sum"), "\n") {
		if strings.HasPrefix(line, "golang.org/x/mod ") {
			sums = append(sums, line)
		}
	}
	mainOf := func(name string) string {
		return "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n\n\t\"example.com/antrea/pkg/version\"\n)\n\n" +
			"func main() {\n\tif len(os.Args) > 1 && os.Args[1] == \"--version\" {\n\t\tfmt.Println(\"" + name + "\", version.String())\n\t\treturn\n\t}\n\tfmt.Println(\"" + name + " runs\")\n}\n"
	}
	modfixture.Write(t, repo, map[string]string{
		"go.mod":                        "module example.com/antrea\n\ngo 1.26\n\nrequire golang.org/x/mod v0.41.0\n",
		"go.sum":                        strings.Join(sums, "\n") + "\n",
		"cmd/antctl/main.go":            mainOf("antctl"),
		"cmd/antrea-agent/main.go":      mainOf("antrea-agent"),
		"cmd/antrea-cni/main.go":        mainOf("antrea-cni"),
		"cmd/antrea-controller/main.go": mainOf("antrea-controller"),
		"pkg/version/version.go": "package version\n\nimport \"golang.org/x/mod/semver\"\n\n" +
			"var Version, GitSHA, GitTreeState, ReleaseStatus = \"\", \"\", \"\", \"\"\n\n" +
			"func String() string { return Version + \" \" + GitSHA + \" \" + GitTreeState + \" \" + ReleaseStatus + \" semver=\" + semver.Major(Version) }\n",
		"build/kiln.yaml": kilnYAML,
		"images/antrea-agent/image.yaml": "base: " + strings.Split(base, "@")[0] + "\nplatforms: [linux/amd64, linux/arm64]\nbinaries: [antrea-agent, antrea-cni, antctl]\nentrypoint: [/usr/local/bin/antrea-agent]\n" +
			"user: root\nrootReason: the agent programs the host's Open vSwitch and iptables\n" +
			"setuid:\n  - {path: /bin/busybox, reason: the base's busybox mounts host paths}\n" +
			"files:\n  - {src: scripts/, dest: /usr/local/bin/, mode: \"0755\"}\n",
		"images/antrea-agent/scripts/start_ovs":   "#!/bin/sh\necho ovs started\n",
		"images/antrea-agent/scripts/install_cni": "#!/bin/sh\necho cni installed\n",
		// A base per platform, each an image of its own, as projects
		// publish base-ubuntu-amd64 and base-ubuntu-arm64.
		"images/antrea-controller/image.yaml": "binaries: [antrea-controller, antctl]\nentrypoint: [/usr/local/bin/antrea-controller]\nuser: \"65532:65532\"\n" +
			"setuid:\n  - {path: /bin/busybox, reason: the base's busybox mounts host paths}\n" +
			"bases:\n  linux/amd64: " + platformBase(t, reg, base, "linux/amd64") + "\n  linux/arm64: " + platformBase(t, reg, base, "linux/arm64") + "\n",
		".gitignore": "_output/\nmagefiles/mage_output_file.go\n",
	})
	adopt(t, repo, "example.com/antrea")
	tidy(t, repo)
	// A base named by tag alone is refused; images:pin writes its digest.
	if out, err := mage(t, repo, "plan"); err == nil || !strings.Contains(out, "images:pin") || !strings.Contains(out, "images/antrea-agent/image.yaml: base") {
		t.Errorf("mage plan with an unpinned base: %v\n%s", err, out)
	}
	if out, err := mage(t, repo, "images:pin"); err != nil {
		t.Fatalf("mage images:pin: %v\n%s", err, out)
	}
	if data, _ := os.ReadFile(filepath.Join(repo, "images/antrea-agent/image.yaml")); !strings.HasPrefix(string(data), "base: "+base+"\n") {
		t.Fatalf("images:pin wrote\n%s\nwant base: %s", data, base)
	}
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
			"GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-qm", "antrea")
	git("tag", "v2.3.0")

	deps := exec.Command("go", "list", "-deps", "./...")
	deps.Dir = repo
	if out, err := deps.CombinedOutput(); err != nil || strings.Contains(string(out), "buildkit") || strings.Contains(string(out), "kiln-build") {
		t.Fatalf("the product's packages: %v\n%s", err, out)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := mage(t, repo, args...)
		if err != nil {
			t.Fatalf("mage %v in the adopting repository: %v\n%s", args, err, out)
		}
		return out
	}

	if out := run("plan"); !strings.Contains(out, "example.com/antrea/pkg/version.ReleaseStatus=unreleased") || !strings.Contains(out, "golang.org/x/mod@v0.41.0") {
		t.Fatalf("mage plan:\n%s", out)
	}
	metadata := filepath.Join(t.TempDir(), "out", "images.json")
	images := run("images", "-platforms=linux/amd64,linux/arm64", "-progress=quiet", "-metadata="+metadata)
	agentTar := filepath.Join(repo, "_output", "images", "antrea-agent.oci.tar")
	layout, err := inspect.ReadLayout(agentTar)
	if err != nil {
		t.Fatalf("%v\n%s", err, images)
	}
	// -metadata names what was made, as the layout has it.
	var made struct{ Images []session.ImageResult }
	if data, err := os.ReadFile(metadata); err != nil || json.Unmarshal(data, &made) != nil {
		t.Fatalf("-metadata wrote %s: %v", metadata, err)
	}
	var agentMade *session.ImageResult
	for i, img := range made.Images {
		if img.Name == "antrea-agent" {
			agentMade = &made.Images[i]
		}
	}
	if agentMade == nil || agentMade.Digest != layout.IndexDigest || agentMade.Path != agentTar || len(agentMade.Manifests) != len(layout.Manifests) || !strings.Contains(images, agentMade.Digest) {
		t.Fatalf("-metadata says %+v; the layout's index is %s with %d manifests", made.Images, layout.IndexDigest, len(layout.Manifests))
	}
	for i, m := range layout.Manifests {
		if agentMade.Manifests[i].Platform != m.Platform || agentMade.Manifests[i].Digest != m.Digest {
			t.Errorf("-metadata's manifest %d: %+v; the layout has %s %s", i, agentMade.Manifests[i], m.Platform, m.Digest)
		}
	}
	for _, m := range layout.Manifests {
		for _, f := range []string{"etc/os-release", "bin/busybox", "usr/local/bin/antrea-agent", "usr/local/bin/start_ovs", "usr/local/bin/install_cni"} {
			if _, ok := m.File(f); !ok {
				t.Errorf("%s: /%s missing from the agent image on its base", m.Platform, f)
			}
		}
		if script, _ := m.File("usr/local/bin/start_ovs"); script.Mode&0o777 != 0o755 {
			t.Errorf("%s: start_ovs mode %o", m.Platform, script.Mode)
		}
		c := m.Config.Config
		if c.User != "0:0" || !slices.Contains(c.Env, "BASE=kiln-test") || c.Labels["vendor"] != "kiln-test-base" || len(m.Layers) < 2 {
			t.Errorf("%s: the agent image does not sit on its base: user %q env %v labels %v, %d layers", m.Platform, c.User, c.Env, c.Labels, len(m.Layers))
		}
		// kiln adds one layer and leaves the base's byte for byte.
		var layers []string
		for _, l := range m.Manifest.Layers[:len(m.Manifest.Layers)-1] {
			layers = append(layers, l.Digest.String())
		}
		if want := baseLayers(t, reg, base, m.Platform); !slices.Equal(layers, want) {
			t.Errorf("%s: the agent image's layers under kiln's are %v, the base's %v", m.Platform, layers, want)
		}
	}
	controllerTar := filepath.Join(repo, "_output", "images", "antrea-controller.oci.tar")
	controller, err := inspect.ReadLayout(controllerTar)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range controller.Manifests {
		var layers []string
		for _, l := range m.Manifest.Layers[:len(m.Manifest.Layers)-1] {
			layers = append(layers, l.Digest.String())
		}
		if want := baseLayers(t, reg, base, m.Platform); !slices.Equal(layers, want) || m.Config.Config.User != "65532:65532" {
			t.Errorf("%s: the controller image's layers under kiln's are %v, its platform's base's %v; user %q", m.Platform, layers, want, m.Config.Config.User)
		}
	}
	if out := run("verify"); !strings.Contains(out, "root, allowed: the agent programs the host") || !strings.Contains(out, "/bin/busybox setuid, allowed: the base's busybox") {
		t.Errorf("mage verify does not report the allowed root:\n%s", out)
	}
	if out := run("release", "-dryrun", "-registry="+reg.Addr); !strings.Contains(out, "release v2.3.0") || !strings.Contains(out, reg.Addr+"/antrea/antrea-agent:v2.3.0") {
		t.Errorf("mage release -dryrun:\n%s", out)
	}

	// images:resolve pins the manifests that name the images to what it
	// pushed, and leaves every other byte.
	deploy := filepath.Join(t.TempDir(), "deploy")
	manifests := map[string]string{
		"agent.yaml": "# the agent\napiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      containers:\n" +
			"        - name: agent\n          image: antrea/antrea-agent:latest   # pinned by kiln\n        - name: side\n          image: busybox:1.36\n" +
			"---\napiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - {name: controller, image: \"antrea/antrea-controller\"}\n",
		"chart/values.yaml": "controller:\n  image:\n    repository: antrea/antrea-controller\n    tag: latest\n",
		"README.md":         "image: antrea/antrea-agent\n",
	}
	modfixture.Write(t, deploy, manifests)
	modfixture.Write(t, filepath.Join(deploy, "..", "broken"), map[string]string{"a.yaml": "image: [antrea/antrea-agent\n"})
	if out, err := mage(t, repo, "images:resolve", "-f="+filepath.Join(deploy, "..", "broken"), "-registry="+reg.Addr); err == nil || !strings.Contains(out, "a.yaml") || !strings.Contains(out, "line 1") {
		t.Errorf("images:resolve of a broken manifest: %v\n%s", err, out)
	}
	// A manifest that names none of the images fails before the build.
	modfixture.Write(t, filepath.Join(deploy, "..", "other"), map[string]string{"a.yaml": "image: busybox:1.36\n"})
	if out, err := mage(t, repo, "images:resolve", "-f="+filepath.Join(deploy, "..", "other"), "-registry="+reg.Addr); err == nil || !strings.Contains(out, "no reference to antrea/antrea-agent, antrea/antrea-controller") || strings.Contains(out, "go build") {
		t.Errorf("images:resolve of a manifest naming no image: %v\n%s", err, out)
	}
	resolvedDir := filepath.Join(repo, "_output", "resolved")
	if _, err := os.Stat(resolvedDir); err == nil {
		t.Errorf("images:resolve of a broken manifest, or one naming no image, wrote %s", resolvedDir)
	}
	resolved := run("images:resolve", "-f="+deploy, "-registry="+reg.Addr, "-platforms=linux/amd64,linux/arm64", "-progress=quiet")
	pushedDigest := map[string]string{}
	for _, line := range strings.Split(resolved, "\n") {
		if refs, dgst, ok := strings.Cut(line, "\t"); ok && strings.HasPrefix(dgst, "sha256:") {
			name, _, _ := strings.Cut(strings.TrimPrefix(refs, reg.Addr+"/"), ":")
			pushedDigest[name] = dgst
			// The registry serves that index under the pushed tag.
			if tagged, _, _, err := reg.Manifest(name, refs[strings.LastIndex(refs, ":")+1:]); err != nil || tagged != dgst {
				t.Errorf("the registry serves %s as %s (%v); images:resolve pinned %s", refs, tagged, err, dgst)
			}
		}
	}
	agentRef := reg.Addr + "/antrea/antrea-agent@" + pushedDigest["antrea/antrea-agent"]
	controllerRef := reg.Addr + "/antrea/antrea-controller@" + pushedDigest["antrea/antrea-controller"]
	want := map[string]string{
		"agent.yaml": strings.Replace(strings.Replace(manifests["agent.yaml"], "antrea/antrea-agent:latest", agentRef, 1), "\"antrea/antrea-controller\"", "\""+controllerRef+"\"", 1),
		"chart/values.yaml": "controller:\n  image:\n    repository: " + reg.Addr + "/antrea/antrea-controller\n    tag: " +
			controllerRef[strings.LastIndex(controllerRef, "@")-0:][0:0] + strings.TrimPrefix(resolvedTag(resolved, "antrea-controller"), "") + "@" + pushedDigest["antrea/antrea-controller"] + "\n",
	}
	for rel, content := range want {
		got, err := os.ReadFile(filepath.Join(resolvedDir, rel))
		if err != nil || string(got) != content || len(pushedDigest) != 2 {
			t.Errorf("images:resolve wrote %s:\n%s\nwant:\n%s\n(%v; output:\n%s)", rel, got, content, err, resolved)
		}
	}
	if _, err := os.Stat(filepath.Join(resolvedDir, "README.md")); err == nil {
		t.Error("images:resolve copied a file that is not YAML")
	}

	run("images", "-platforms=linux/amd64", "-stamp", "-progress=quiet")
	stamped, err := inspect.ReadLayout(agentTar)
	if err != nil {
		t.Fatal(err)
	}
	agent, _ := stamped.Manifests[0].File("usr/local/bin/antrea-agent")
	if out := runELF(t, agent.Data, "--version"); !strings.Contains(out, "antrea-agent v2.3.0 ") || !strings.Contains(out, " clean released semver=v2") {
		t.Errorf("the stamped agent says %q; want the adopter's own variables stamped", out)
	}

	before := digestsOf(images)

	// The vendored variant: no download step.
	vendor := exec.Command("go", "mod", "vendor")
	vendor.Dir = repo
	if out, err := vendor.CombinedOutput(); err != nil {
		t.Fatalf("go mod vendor: %v\n%s", err, out)
	}
	if out := run("plan"); !strings.Contains(out, "-mod=vendor") {
		t.Errorf("mage plan of the vendored variant does not build with -mod=vendor:\n%s", out)
	}
	// Vendored builds record no module sums in their build info, so the
	// digests differ from the proxied variant's; both must build.
	if vendored := digestsOf(run("images", "-platforms=linux/amd64,linux/arm64", "-progress=quiet")); len(vendored) != 2 {
		t.Errorf("the vendored variant built %v", vendored)
	}
	os.RemoveAll(filepath.Join(repo, "vendor"))

	run("buildkit:prune")
	after := digestsOf(run("images", "-platforms=linux/amd64,linux/arm64", "-progress=quiet"))
	if len(before) != 2 || !slices.Equal(before, after) {
		t.Errorf("digests before a prune %v, after %v", before, after)
	}

	// The rows the adopter's report must have; every scenario of the bench
	// is TestBenchOnAFixtureModule's (internal/bench).
	run("bench", "-runs=1", "-platforms=linux/amd64", "-only=cold,noop,edits")
	report, err := os.ReadFile(filepath.Join(repo, "_output", "bench", "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{"| kiln cold |", "| kiln warm no-op |", "| kiln incremental, shared |", "Module download in the cold scenarios: in both: 1 modules"} {
		if !strings.Contains(string(report), row) {
			t.Errorf("the adopter's bench report has no %q row", row)
		}
	}
	t.Logf("mage bench -runs=1 in the adopting repository:\n%s", report)
}

// The two files of Go an adopting repository writes, the same for every
// kiln version: kiln-mage, which runs mage and whatever goes with it, comes
// with kiln, a tool of magefiles/go.mod (adopt writes it).
const (
	adopterMageGo = `//go:build ignore

// ` + "`go run mage.go ARGS`" + ` runs kiln's targets: kiln-mage, a tool of magefiles/go.mod.
package main

import (
	"os"
	"os/exec"
	"syscall"
)

func main() {
	goBin, err := exec.LookPath("go") // go run puts its own go first on PATH
	if err == nil {
		err = syscall.Exec(goBin, append([]string{"go", "tool", "-C", "magefiles", "kiln-mage"}, os.Args[1:]...), os.Environ())
	}
	os.Stderr.WriteString("mage.go: run kiln's targets: " + err.Error() + "\n")
	os.Exit(1)
}
`
	adopterMagefile = `//go:build mage

// Run ` + "`go run mage.go -l`" + ` for kiln's targets.
package main

import (
	//mage:import
	_ "github.com/kiln-build/kiln/targets"
	//mage:import
	_ "github.com/kiln-build/kiln/targets/namespaces"
)
`
)

// adopt adds kiln to the repository at dir, whose module is module, as
// the README says: the two files of Go and magefiles/go.mod, requiring this
// kiln (its go.sum is kiln's, so that go mod tidy needs no network).
func adopt(t *testing.T, dir, module string) {
	t.Helper()
	kiln := testdaemon.RepoRoot(t)
	sum, err := os.ReadFile(filepath.Join(kiln, "magefiles", "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	modfixture.Write(t, dir, map[string]string{
		"mage.go":               adopterMageGo,
		"magefiles/magefile.go": adopterMagefile,
		"magefiles/go.mod": "module " + module + "/magefiles\n\ngo 1.26.8\n\nrequire github.com/kiln-build/kiln v0.0.0\n\n" +
			"replace github.com/kiln-build/kiln => " + kiln + "\n\n" +
			"tool (\n\tgithub.com/kiln-build/kiln/targets/kiln-mage\n\tgithub.com/magefile/mage\n)\n",
		"magefiles/go.sum": string(sum),
	})
}

// tidy runs go mod tidy in the repository at dir and in its magefiles/.
func tidy(t *testing.T, dir string) {
	t.Helper()
	for _, dir := range []string{dir, filepath.Join(dir, "magefiles")} {
		cmd := exec.Command("go", "mod", "tidy")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go mod tidy in %s: %v\n%s", dir, err, out)
		}
	}
}

// TestKilnIsAdoptedAsItSays: kiln's own entry is the adopter's two files,
// byte for byte, and they are short.
func TestKilnIsAdoptedAsItSays(t *testing.T) {
	root := testdaemon.RepoRoot(t)
	lines := 0
	for rel, want := range map[string]string{"mage.go": adopterMageGo, "magefiles/magefile.go": adopterMagefile} {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != want {
			t.Errorf("kiln's %s is not what an adopter writes:\n%s\nwant\n%s", rel, data, want)
		}
		for _, line := range strings.Split(want, "\n") {
			if strings.TrimSpace(line) != "" {
				lines++
			}
		}
	}
	if lines > 25 {
		t.Errorf("an adopter writes %d lines of Go; the issue allows about 20", lines)
	}
}

// TestTheTargetsStartWithoutMageWhileNothingChanged: in an adopting
// repository, kiln-mage starts the targets without mage while nothing they
// are built from changed, in the repository's root, with the targets' exit
// code; a rewrite of a magefile that keeps its size and time goes through
// mage, and what runs is the rewritten target.
func TestTheTargetsStartWithoutMageWhileNothingChanged(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the targets of a repository of its own")
	}
	repo := t.TempDir()
	modfixture.Write(t, repo, map[string]string{
		"go.mod":             "module example.com/adopter\n\ngo 1.26\n",
		"magefiles/hello.go": helloTarget,
	})
	adopt(t, repo, "example.com/adopter")
	tidy(t, repo)
	root, err := filepath.EvalSymlinks(repo)
	if err != nil {
		t.Fatal(err)
	}
	// kiln-mage vouches for no file changed in the last 2 s.
	time.Sleep(2 * time.Second)

	mageCache := t.TempDir()
	hello := func(want string, skipsMage bool) string {
		t.Helper()
		cmd := exec.Command("go", "run", "mage.go", "hello")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "KILN_MAGE_DEBUG=1", "MAGEFILE_CACHE="+mageCache)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), want+" in "+root+"\n") || strings.Contains(string(out), "without mage") != skipsMage {
			t.Errorf("mage hello: %v; want %q in %s, mage skipped: %v\n%s", err, want, root, skipsMage, out)
		}
		return string(out)
	}
	hello("adopter hello 1", false) // compiles the targets, which record their start
	hello("adopter hello 1", true)
	helloFile := filepath.Join(repo, "magefiles", "hello.go")
	fi, err := os.Stat(helloFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(helloFile, []byte(strings.Replace(helloTarget, "hello 1", "hello 2", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(helloFile, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	out := hello("adopter hello 2", false)
	// Its change time was recent, unless go took 2 s to start kiln-mage on a
	// loaded machine: then that run recorded the targets, else the run after
	// the window does.
	if strings.Contains(out, "a file changed less than 2 s ago") {
		time.Sleep(2 * time.Second)
		hello("adopter hello 2", false)
	}
	hello("adopter hello 2", true)

	// The exit code of mage, or of the targets without it, comes back, not
	// go run's (always 1). Run so, go puts itself on PATH once less than go
	// run does: the first run goes through mage and records that.
	for _, skipsMage := range []bool{false, true} {
		cmd := exec.Command("go", "tool", "-C", "magefiles", "kiln-mage", "nosuch")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "KILN_MAGE_DEBUG=1", "MAGEFILE_CACHE="+mageCache)
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "Unknown target") || strings.Contains(string(out), "without mage") != skipsMage {
			t.Errorf("kiln-mage nosuch: %v, exit code %d, want 2, mage skipped: %v\n%s", err, code, skipsMage, out)
		}
	}

	// A record another user could have written names no binary to run.
	stamps, _ := filepath.Glob(filepath.Join(mageCache, "kiln-targets-*.json"))
	if len(stamps) != 1 {
		t.Fatalf("records of the targets' start in %s: %v", mageCache, stamps)
	}
	if err := os.Chmod(stamps[0], 0o666); err != nil {
		t.Fatal(err)
	}
	if out := hello("adopter hello 2", false); !strings.Contains(out, "writable by others") {
		t.Errorf("mage hello with a record writable by others:\n%s", out)
	}
}

// helloTarget is a target of the adopting repository's own.
const helloTarget = `//go:build mage

package main

import (
	"fmt"
	"os"
)

// Hello says which build of the targets runs, and where.
func Hello() error {
	wd, err := os.Getwd()
	fmt.Println("adopter hello 1 in", wd)
	return err
}
`

// platformBase is the base's image for one platform, by its own digest.
func platformBase(t *testing.T, reg *testdaemon.Registry, base, platform string) string {
	t.Helper()
	name, dgst, _ := strings.Cut(strings.TrimPrefix(base, reg.Addr+"/"), "@")
	name, _, _ = strings.Cut(name, ":")
	_, _, body, err := reg.Manifest(name, dgst)
	if err != nil {
		t.Fatal(err)
	}
	var index ocispec.Index
	if err := json.Unmarshal(body, &index); err != nil {
		t.Fatal(err)
	}
	for _, d := range index.Manifests {
		if d.Platform != nil && d.Platform.OS+"/"+d.Platform.Architecture == platform {
			return reg.Addr + "/" + name + "@" + d.Digest.String()
		}
	}
	t.Fatalf("the base %s has no %s manifest", base, platform)
	return ""
}

// resolvedTag is the tag images:resolve printed it pushed the image as.
func resolvedTag(out, image string) string {
	for _, line := range strings.Split(out, "\n") {
		refs, _, _ := strings.Cut(line, "\t")
		if strings.Contains(refs, "/"+image+":") {
			return refs[strings.LastIndex(refs, ":")+1:]
		}
	}
	return ""
}

// baseLayers are the layer digests of the base image (a digest-pinned
// reference in reg) for one platform.
func baseLayers(t *testing.T, reg *testdaemon.Registry, base, platform string) []string {
	t.Helper()
	name, dgst, _ := strings.Cut(strings.TrimPrefix(platformBase(t, reg, base, platform), reg.Addr+"/"), "@")
	_, _, body, err := reg.Manifest(name, dgst)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range m.Layers {
		out = append(out, l.Digest.String())
	}
	return out
}

// digestsOf are the index digests mage images printed, one per image.
func digestsOf(out string) []string {
	var ds []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[1], "sha256:") {
			ds = append(ds, f[1])
		}
	}
	return ds
}

// runELF writes a binary out and runs it on this machine.
func runELF(t *testing.T, data []byte, args ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", path, err, out)
	}
	return string(out)
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
