package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const goodKiln = `toolchain:
  go: "1.26.8"
  sha256:
    linux/amd64: 30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7
platforms: [linux/amd64, linux/arm64]
go:
  tags: []
  ldflags: "-s -w"
binaries:
  - name: antctl
    package: ./cmd/antctl
  - name: antrea-agent
    package: ./cmd/antrea-agent
stamp:
  package: example.com/m/pkg/version
cache:
  gocache: kiln-gocache
  gomodcache: kiln-gomodcache
repository: antrea
tag: latest
`

const goodImage = `binaries: [antrea-agent, antctl]
entrypoint: [/usr/local/bin/antrea-agent]
`

// repo writes a configuration tree; files maps paths to contents, and a
// nil-like "-" content deletes the default file; "@TARGET" makes a
// symbolic link to TARGET.
func repo(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	all := map[string]string{File: goodKiln, "images/antrea-agent/image.yaml": goodImage}
	for k, v := range files {
		all[k] = v
	}
	for rel, content := range all {
		if content == "-" {
			continue
		}
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "@"); ok { // a symbolic link
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestLoadGood(t *testing.T) {
	c, err := Load(repo(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Images) != 1 || c.Images[0].User != DefaultUser || c.Images[0].Workdir != "/" {
		t.Errorf("image defaults not applied: %+v", c.Images)
	}
	if got := FormatPlatform(c.ParsedPlatforms[1]); got != "linux/arm64" {
		t.Errorf("platforms[1] = %s", got)
	}
	// Without a release section a release carries the build's platforms
	// and ships no files.
	if !slices.Equal(c.Release.Platforms, []string{"linux/amd64", "linux/arm64"}) || len(c.Release.Assets) != 0 {
		t.Errorf("release defaults: %+v", c.Release)
	}
}

// TestBuilders: a builder's platforms are normalised as platforms are.
func TestBuilders(t *testing.T) {
	c, err := Load(repo(t, map[string]string{File: strings.Replace(goodKiln, "tag: latest", "tag: latest\nbuilders:\n  - address: \" kube-pod://buildkitd-arm64-0\"\n    platforms: [linux/arm64/v8, linux/arm]", 1)}))
	if err != nil {
		t.Fatal(err)
	}
	if b := c.Builders; len(b) != 1 || b[0].Address != "kube-pod://buildkitd-arm64-0" || !slices.Equal(b[0].Platforms, []string{"linux/arm64", "linux/arm/v7"}) {
		t.Errorf("builders: %+v", b)
	}
}

// TestARepositoryThatStampsNothingLoads: stamp is optional; without it
// no variable is stamped.
func TestARepositoryThatStampsNothingLoads(t *testing.T) {
	c, err := Load(repo(t, map[string]string{File: strings.Replace(goodKiln, "stamp:\n  package: example.com/m/pkg/version\n", "", 1)}))
	if err != nil {
		t.Fatal(err)
	}
	if vars := c.Stamp.StampVariables(); len(vars) != 0 {
		t.Errorf("stamp variables without a stamp section: %v", vars)
	}
}

// TestImageFilesComeFromAnywhereInTheRepository: files[].src is relative
// to the image folder and may reach the repository's other folders; a
// symlink there may not lead out of the repository.
func TestImageFilesComeFromAnywhereInTheRepository(t *testing.T) {
	files := map[string]string{
		"images/antrea-agent/image.yaml": goodImage + "files:\n  - src: ../../build/images/scripts/\n    dest: /usr/local/bin/\n",
		"build/images/scripts/start.sh":  "#!/bin/sh\n",
	}
	c, err := Load(repo(t, files))
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Images[0].Files[0]; !f.Dir || f.Src != "../../build/images/scripts/" {
		t.Errorf("files[0] = %+v", f)
	}
	root := repo(t, files)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("x"), 0o600)
	os.Remove(filepath.Join(root, "build/images/scripts/start.sh"))
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "build/images/scripts/start.sh")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "images/antrea-agent/image.yaml"), []byte(goodImage+"files:\n  - src: ../../build/images/scripts/start.sh\n    dest: /usr/local/bin/start.sh\n"), 0o644)
	if _, err := Load(root); err == nil || !strings.Contains(err.Error(), "leads outside the repository") {
		t.Errorf("a symlink out of the repository: %v", err)
	}
}

func TestLoadRepositoryConfig(t *testing.T) {
	if _, err := Load("../.."); err != nil {
		t.Fatalf("the repository's own configuration does not load: %v", err)
	}
}

// TestReleaseManifests: a folder of release.manifests ships each YAML file
// in it, searched through, under its name; other files stay behind.
func TestReleaseManifests(t *testing.T) {
	root := repo(t, map[string]string{
		File:                           strings.Replace(goodKiln, "tag: latest", "tag: latest\nrelease:\n  manifests: [build/yamls, deploy/values.yaml]", 1),
		"build/yamls/antrea.yml":       "x: 1\n",
		"build/yamls/windows/win.yaml": "x: 2\n",
		"build/yamls/README.md":        "not shipped",
		"deploy/values.yaml":           "x: 3\n",
	})
	c, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []ManifestFile{{"build/yamls/antrea.yml", "antrea.yml"}, {"build/yamls/windows/win.yaml", "win.yaml"}, {"deploy/values.yaml", "values.yaml"}}
	if !slices.Equal(c.Release.ManifestFiles, want) {
		t.Errorf("release.manifests found %v, want %v", c.Release.ManifestFiles, want)
	}
}

func TestLoadBadInput(t *testing.T) {
	img := "images/antrea-agent/image.yaml"
	kiln := func(old, new string) map[string]string {
		if !strings.Contains(goodKiln, old) {
			t.Fatalf("test setup: %q not in kiln.yaml", old)
		}
		return map[string]string{File: strings.Replace(goodKiln, old, new, 1)}
	}
	image := func(content string) map[string]string { return map[string]string{img: content} }
	tests := []struct {
		name  string
		files map[string]string
		want  []string // every one must appear in the error
	}{
		{"unknown binary in image", image("binaries: [antrea-agent, antrea-foo]\nentrypoint: [/x]\n"), []string{img, "binaries[1]", `unknown binary "antrea-foo"`, "antctl, antrea-agent"}},
		{"unknown field in image", image(goodImage + "entrypiont: [/x]\n"), []string{img, "line 3", "entrypiont"}},
		{"unknown field in kiln.yaml", kiln("tag: latest", "tag: latest\ntagz: x"), []string{File, "line 21", `unknown field "tagz"`}},
		{"malformed yaml", kiln("platforms: [linux/amd64, linux/arm64]", "platforms: [linux/amd64"), []string{File, "line"}},
		{"wrong type", kiln("platforms: [linux/amd64, linux/arm64]", "platforms: linux/amd64"), []string{File, "line 5"}},
		{"invalid platform", kiln("linux/arm64]", "linux/arm64/v8/x]"), []string{File, "platforms[1]", "invalid platform"}},
		{"unsupported platform", kiln("linux/arm64]", "plan9/mips]"), []string{File, "platforms[1]", "unsupported platform"}},
		{"duplicate platform", kiln("linux/arm64]", "linux/amd64]"), []string{File, "platforms[1]", "twice"}},
		{"no platforms", kiln("platforms: [linux/amd64, linux/arm64]", "platforms: []"), []string{File, "platforms", "missing"}},
		{"image folder without image.yaml", map[string]string{"images/empty/README": "x"}, []string{"images/empty", "no image.yaml"}},
		{"missing kiln.yaml", map[string]string{File: "-"}, []string{File, "not found"}},
		{"empty kiln.yaml", map[string]string{File: ""}, []string{File, "empty"}},
		{"two documents", kiln("tag: latest", "tag: latest\n---\ntag: x"), []string{File, "more than one"}},
		{"bad toolchain hash", kiln("30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7", "abc"), []string{File, "toolchain.sha256.linux/amd64", "64"}},
		{"no toolchain version", kiln(`go: "1.26.8"`, `go: ""`), []string{File, "toolchain.go", "missing"}},
		{"bad toolchain version", kiln(`go: "1.26.8"`, `go: "latest"`), []string{File, "toolchain.go", "latest"}},
		{"non-linux build platform", kiln("    linux/amd64: 30c2", "    darwin/arm64: 30c2"), []string{File, "toolchain.sha256.darwin/arm64", "linux"}},
		{"cgo tag", kiln("tags: []", "tags: [cgo]"), []string{File, "go.tags[0]", "CGO_ENABLED=0"}},
		{"external linking", kiln(`ldflags: "-s -w"`, `ldflags: "-linkmode=external"`), []string{File, "go.ldflags"}},
		{"GOOS in go.env", kiln("tags: []", "tags: []\n  env:\n    GOOS: darwin"), []string{File, "go.env.GOOS", "platforms"}},
		{"cgo on for all", kiln("tags: []", "tags: []\n  env:\n    CGO_ENABLED: \"1\""), []string{File, "go.env.CGO_ENABLED"}},
		{"-o in flags", kiln("tags: []", "tags: []\n  flags: [-o=/x]"), []string{File, "go.flags[0]"}},
		{"budget for unknown binary", kiln("tag: latest", "tag: latest\nbudgets:\n  antrea-foo: 1MiB"), []string{File, "budgets.antrea-foo", "unknown binary"}},
		{"unparsable budget", kiln("tag: latest", "tag: latest\nbudgets:\n  antctl: lots"), []string{File, "budgets.antctl", "size"}},
		{"bad per-binary tag", kiln("package: ./cmd/antctl", "package: ./cmd/antctl\n    go:\n      tags: [\"a b\"]"), []string{File, "binaries[0].go.tags[0]"}},
		{"duplicate binary", kiln("name: antrea-agent", "name: antctl"), []string{File, "binaries[1].name", "twice"}},
		{"builder without scheme", kiln("tag: latest", "tag: latest\nbuilders:\n  - {address: buildkitd-0, platforms: [linux/arm64]}"), []string{File, "builders[0].address", "kube-pod://"}},
		{"builder naming two daemons", kiln("tag: latest", "tag: latest\nbuilders:\n  - {address: \"tcp://a:1234,tcp://b:1234\", platforms: [linux/arm64]}"), []string{File, "builders[0].address", "comma"}},
		{"builder listed twice", kiln("tag: latest", "tag: latest\nbuilders:\n  - {address: \"kube-pod://b-0\", platforms: [linux/arm64]}\n  - {address: \"kube-pod://b-0\", platforms: [linux/amd64]}"), []string{File, "builders[1].address", "two builders"}},
		{"builder without platforms", kiln("tag: latest", "tag: latest\nbuilders:\n  - {address: \"kube-pod://b-0\"}"), []string{File, "builders[0].platforms", "missing"}},
		{"builder naming a platform twice", kiln("tag: latest", "tag: latest\nbuilders:\n  - {address: \"kube-pod://b-0\", platforms: [linux/arm, linux/arm/v7]}"), []string{File, "builders[0].platforms[1]", "twice"}},
		{"builder with a bad platform", kiln("tag: latest", "tag: latest\nbuilders:\n  - {address: \"kube-pod://b-0\", platforms: [linux/amd64, arm64]}"), []string{File, "builders[0].platforms[1]", "invalid platform"}},
		{"release image platform not linux", kiln("tag: latest", "tag: latest\nrelease:\n  platforms: [linux/amd64, darwin/arm64]"), []string{File, "release.platforms[1]", "linux only", "release.assets"}},
		{"release platform twice", kiln("tag: latest", "tag: latest\nrelease:\n  platforms: [linux/arm/v7, linux/arm]"), []string{File, "release.platforms[1]", "twice"}},
		{"asset of an unknown binary", kiln("tag: latest", "tag: latest\nrelease:\n  assets:\n    antrea-foo: [linux/amd64]"), []string{File, "release.assets.antrea-foo", "unknown binary", "antctl, antrea-agent"}},
		{"asset for no platform", kiln("tag: latest", "tag: latest\nrelease:\n  assets:\n    antctl: []"), []string{File, "release.assets.antctl", "no platforms"}},
		{"two assets of one name", kiln("tag: latest", "tag: latest\nrelease:\n  assets:\n    antctl: [linux/arm/v7, linux/arm/v6]"), []string{File, "release.assets.antctl[1]", "linux/arm/v7 and linux/arm/v6 both ship as antctl-linux-arm"}},
		{"asset platform unsupported", kiln("tag: latest", "tag: latest\nrelease:\n  assets:\n    antctl: [linux/amd64, plan9/mips]"), []string{File, "release.assets.antctl[1]", "unsupported platform"}},
		{"manifest outside the repository", kiln("tag: latest", "tag: latest\nrelease:\n  manifests: [../antrea.yml]"), []string{File, "release.manifests[0]", "stays inside it"}},
		{"missing manifest", kiln("tag: latest", "tag: latest\nrelease:\n  manifests: [build/yamls/antrea.yml]"), []string{File, "release.manifests[0]", "build/yamls/antrea.yml does not exist"}},
		{"manifest folder without YAML", map[string]string{File: strings.Replace(goodKiln, "tag: latest", "tag: latest\nrelease:\n  manifests: [build/yamls]", 1), "build/yamls/README": "x"}, []string{File, "release.manifests[0]", "no .yaml or .yml"}},
		{"manifest folder linking out", map[string]string{File: strings.Replace(goodKiln, "tag: latest", "tag: latest\nrelease:\n  manifests: [build/yamls]", 1), "build/yamls/a.yaml": "x: 1\n", "build/yamls/passwd.yaml": "@/etc/passwd"}, []string{File, "release.manifests[0]", "build/yamls/passwd.yaml leads outside the repository"}},
		{"two manifests of one name", map[string]string{File: strings.Replace(goodKiln, "tag: latest", "tag: latest\nrelease:\n  manifests: [build/yamls, deploy/antrea.yml]", 1), "build/yamls/antrea.yml": "x: 1\n", "deploy/antrea.yml": "x: 2\n"}, []string{File, "release.manifests[1]", "deploy/antrea.yml would ship as antrea.yml, as build/yamls/antrea.yml does"}},
		{"manifest named as a binary asset", map[string]string{File: strings.Replace(goodKiln, "tag: latest", "tag: latest\nrelease:\n  assets:\n    antctl: [linux/amd64]\n  manifests: [deploy/antctl-linux-x86_64]", 1), "deploy/antctl-linux-x86_64": "x: 1\n"}, []string{File, "release.manifests[0]", "as the binary antctl for linux/amd64 does"}},
		{"bad binary name", kiln("name: antrea-agent", "name: Antrea Agent"), []string{File, "binaries[1].name"}},
		{"package outside module", kiln("package: ./cmd/antctl", "package: ../other"), []string{File, "binaries[0].package"}},
		{"no binaries", kiln("binaries:\n  - name: antctl\n    package: ./cmd/antctl\n  - name: antrea-agent\n    package: ./cmd/antrea-agent\n", "binaries: []\n"), []string{File, "binaries", "missing"}},
		{"bad cache id", kiln("gocache: kiln-gocache", "gocache: Kiln Cache"), []string{File, "cache.gocache"}},
		{"same cache ids", kiln("gomodcache: kiln-gomodcache", "gomodcache: kiln-gocache"), []string{File, "cache.gomodcache"}},
		{"bad repository", kiln("repository: antrea", "repository: Antrea!"), []string{File, "repository"}},
		{"bad tag", kiln("tag: latest", "tag: -x:y"), []string{File, "tag"}},
		{"image without binaries", image("entrypoint: [/x]\n"), []string{img, "binaries", "missing"}},
		{"duplicate binary in image", image("binaries: [antctl, antctl]\nentrypoint: [/x]\n"), []string{img, "binaries[1]", "twice"}},
		{"relative entrypoint", image("binaries: [antctl]\nentrypoint: [antctl]\n"), []string{img, "entrypoint[0]", "absolute"}},
		{"no entrypoint", image("binaries: [antctl]\n"), []string{img, "entrypoint", "missing"}},
		{"user by name", image(goodImage + "user: nobody\n"), []string{img, "user", "numeric"}},
		{"relative workdir", image(goodImage + "workdir: app\n"), []string{img, "workdir", "absolute"}},
		{"bad env name", image(goodImage + "env:\n  \"A B\": x\n"), []string{img, "env.A B"}},
		{"missing extra file", image(goodImage + "files:\n  - src: nope.conf\n    dest: /etc/nope.conf\n"), []string{img, "files[0].src", "does not exist"}},
		{"extra file outside the repository", image(goodImage + "files:\n  - src: ../../../etc/passwd\n    dest: /x\n"), []string{img, "files[0].src", "stays inside the repository"}},
		{"absolute extra file", image(goodImage + "files:\n  - src: /etc/passwd\n    dest: /x\n"), []string{img, "files[0].src", "relative to images/antrea-agent"}},
		{"bad file mode", map[string]string{img: goodImage + "files:\n  - src: a.conf\n    dest: /etc/a.conf\n    mode: rwx\n", "images/antrea-agent/a.conf": "x"}, []string{img, "files[0].mode"}},
		{"relative file dest", map[string]string{img: goodImage + "files:\n  - src: a.conf\n    dest: etc/a.conf\n", "images/antrea-agent/a.conf": "x"}, []string{img, "files[0].dest"}},
		{"root without a reason", image(goodImage + "user: root\n"), []string{img, "user", "rootReason"}},
		{"uid 0 without a reason", image(goodImage + "user: \"0:0\"\n"), []string{img, "user", "rootReason"}},
		{"image platform outside the build's", image(goodImage + "platforms: [linux/arm/v7]\n"), []string{img, "platforms[0]", "linux/arm/v7", "linux/amd64, linux/arm64"}},
		{"setuid file mode", map[string]string{img: goodImage + "files:\n  - src: a.conf\n    dest: /etc/a.conf\n    mode: \"4755\"\n", "images/antrea-agent/a.conf": "x"}, []string{img, "files[0].mode", "setuid"}},
		{"setuid without a reason", image(goodImage + "setuid:\n  - {path: /bin/mount}\n"), []string{img, "setuid[0].reason", "/bin/mount"}},
		{"setuid relative path", image(goodImage + "setuid:\n  - {path: bin/mount, reason: mounts}\n"), []string{img, "setuid[0].path", "absolute"}},
		{"file over a binary", map[string]string{img: goodImage + "files:\n  - src: a.sh\n    dest: /usr/local/bin/antctl\n", "images/antrea-agent/a.sh": "x"}, []string{img, "files[0].dest", "the binary antctl"}},
		{"folder over the user database", map[string]string{img: goodImage + "files:\n  - src: etc\n    dest: /etc\n", "images/antrea-agent/etc/passwd": "x"}, []string{img, "files[0].dest", "/etc/passwd", "user database"}},
		{"missing folder", image(goodImage + "files:\n  - src: scripts/\n    dest: /usr/local/bin/\n"), []string{img, "files[0].src", "does not exist"}},
		{"unknown stamp value", kiln("package: example.com/m/pkg/version", "package: example.com/m/pkg/version\n  variables:\n    example.com/m/pkg/version.GitSHA: sha"), []string{File, "stamp.variables.example.com/m/pkg/version.GitSHA", `unknown value "sha"`, "shortCommit"}},
		{"stamp variable without a name", kiln("package: example.com/m/pkg/version", "package: example.com/m/pkg/version\n  variables:\n    example.com/m/pkg/version: version"), []string{File, "stamp.variables", "<import path>.<Name>"}},
		{"unknown signing layout", kiln("tag: latest", "tag: latest\nsigning:\n  layout: bundles"), []string{File, "signing.layout", `"bundles"`, "referrers"}},
		{"bad image folder name", map[string]string{"images/Bad_Name/image.yaml": goodImage}, []string{"images/Bad_Name", "image name"}},
		{"bases beside base", image(goodImage + "base: r.example/b@" + pin + "\nbases:\n  linux/amd64: r.example/b-amd64@" + pin + "\n  linux/arm64: r.example/b-arm64@" + pin + "\n"), []string{img, "bases", "not both"}},
		{"bases missing a platform", image(goodImage + "bases:\n  linux/amd64: r.example/b-amd64@" + pin + "\n"), []string{img, "bases", "no base for linux/arm64"}},
		{"base for a platform the image lacks", image(goodImage + "platforms: [linux/amd64]\nbases:\n  linux/amd64: r.example/b-amd64@" + pin + "\n  linux/arm64: r.example/b-arm64@" + pin + "\n"), []string{img, "bases.linux/arm64", "not a platform of this image (linux/amd64)"}},
		{"per-platform base by tag", image(goodImage + "bases:\n  linux/amd64: r.example/b-amd64@" + pin + "\n  linux/arm64: r.example/b-arm64:1\n"), []string{img, "bases.linux/arm64", "not pinned by digest", "images:pin"}},
		{"per-platform base on a bad platform", image(goodImage + "bases:\n  linux: r.example/b@" + pin + "\n"), []string{img, "bases.linux"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(repo(t, tt.files))
			if err == nil {
				t.Fatal("Load accepted bad input")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			if strings.Count(err.Error(), "\n") > 0 {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestParsePlatform(t *testing.T) {
	good := map[string]string{
		"linux/amd64":    "linux/amd64",
		"linux/arm64":    "linux/arm64",
		"linux/arm64/v8": "linux/arm64",
		"linux/arm":      "linux/arm/v7",
		"linux/arm/v7":   "linux/arm/v7",
		"linux/arm/v6":   "linux/arm/v6",
		"linux/x86_64":   "linux/amd64",
		" linux/amd64 ":  "linux/amd64",
		"windows/amd64":  "windows/amd64",
	}
	for in, want := range good {
		p, err := ParsePlatform(in)
		if err != nil {
			t.Errorf("ParsePlatform(%q): %v", in, err)
			continue
		}
		if got := FormatPlatform(p); got != want {
			t.Errorf("ParsePlatform(%q) = %s, want %s", in, got, want)
		}
	}
	for _, bad := range []string{"", "linux", "linux/", "linux/amd64/v9/x", "plan9/386", "linux/mips", "LINUX//amd64", "linux/arm/v5"} {
		if p, err := ParsePlatform(bad); err == nil {
			t.Errorf("ParsePlatform(%q) = %s, want an error", bad, FormatPlatform(p))
		}
	}
	if _, err := ParsePlatforms("linux/amd64,linux/amd64"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate platforms: %v", err)
	}
}

func FuzzParsePlatform(f *testing.F) {
	for _, s := range []string{"linux/amd64", "linux/arm/v7", "", "/", "linux//", "a/b/c/d", "windows/arm64"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePlatform(s)
		if err != nil {
			return
		}
		again, err := ParsePlatform(FormatPlatform(p))
		if err != nil || FormatPlatform(again) != FormatPlatform(p) {
			t.Fatalf("%q parsed to %s, which does not parse back to itself", s, FormatPlatform(p))
		}
	})
}

func TestParsePlatformRefusesVariantsGoCannotTarget(t *testing.T) {
	for in, want := range map[string]string{"linux/arm64/v8": "linux/arm64", "linux/arm64": "linux/arm64", "linux/arm": "linux/arm/v7", "linux/arm/v6": "linux/arm/v6"} {
		p, err := ParsePlatform(in)
		if err != nil || FormatPlatform(p) != want {
			t.Errorf("ParsePlatform(%q) = %s, %v; want %s", in, FormatPlatform(p), err, want)
		}
	}
	if _, err := ParsePlatform("linux/arm64/v9"); err == nil || !strings.Contains(err.Error(), "v8 only") {
		t.Errorf("linux/arm64/v9 gave %v, want it refused", err)
	}
}

const pin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Bases published one image per architecture, as a real project's
// Dockerfiles name them.
func TestABasePerPlatform(t *testing.T) {
	c, err := Load(repo(t, map[string]string{"images/antrea-agent/image.yaml": goodImage +
		"bases:\n  linux/arm64/v8: r.example/base-ubuntu-arm64@" + pin + "\n  linux/amd64: r.example/base-ubuntu-amd64@" + pin + "\n"}))
	if err != nil {
		t.Fatal(err)
	}
	img := c.Images[0]
	arm64, _ := ParsePlatform("linux/arm64")
	amd64, _ := ParsePlatform("linux/amd64")
	if !img.HasBase() || img.BaseFor(arm64) != "r.example/base-ubuntu-arm64@"+pin || img.BaseFor(amd64) != "r.example/base-ubuntu-amd64@"+pin {
		t.Errorf("bases %v", img.Bases)
	}
	if got := img.AllBases(); len(got) != 2 || got[0] != "r.example/base-ubuntu-amd64@"+pin {
		t.Errorf("AllBases %v", got)
	}
	// A base image runs as its own user: kiln sets none.
	if img.User != "" || img.Workdir != "" {
		t.Errorf("user %q workdir %q on a base", img.User, img.Workdir)
	}
}

func TestImageFeaturesOfARealProject(t *testing.T) {
	img := "images/antrea-agent/image.yaml"
	c, err := Load(repo(t, map[string]string{
		img: goodImage + "user: root\nrootReason: manages host networking\nplatforms: [linux/amd64]\n" +
			"files:\n  - src: scripts/\n    dest: /usr/local/bin/\n    mode: \"0755\"\n" +
			"setuid:\n  - {path: /bin/mount, reason: mounts host paths for the CNI}\n",
		"images/antrea-agent/scripts/start.sh":   "#!/bin/sh\n",
		"images/antrea-agent/scripts/lib/ovs.sh": "#!/bin/sh\n",
		File:                                     strings.Replace(goodKiln, "package: example.com/m/pkg/version", "variables:\n    example.com/m/pkg/version.Version: version\n    example.com/m/pkg/version.GitSHA: commit\n    example.com/m/pkg/version.ReleaseStatus: releaseStatus", 1),
	}))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Images[0]
	if got.User != "0:0" || !got.Files[0].Dir || got.Platforms[0] != "linux/amd64" || got.Setuid[0].Reason != "mounts host paths for the CNI" {
		t.Errorf("image %+v", got)
	}
	vars := c.Stamp.StampVariables()
	if len(vars) != 3 || vars[0] != [2]string{"example.com/m/pkg/version.GitSHA", "commit"} {
		t.Errorf("stamp variables %v", vars)
	}
}
