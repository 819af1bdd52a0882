package session_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// Release assets are built for darwin and windows too; a module only those
// platforms import (cobra's mousetrap, on windows) must be downloaded.
func TestModulesOfEveryPlatformTheBinariesAreBuiltFor(t *testing.T) {
	has := func(p []string) bool {
		return slices.ContainsFunc(p, func(m string) bool { return strings.HasPrefix(m, "github.com/inconshreveable/mousetrap@") })
	}
	linux, err := session.Plan(session.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64"})
	if err != nil {
		t.Fatal(err)
	}
	withWindows, err := session.Plan(session.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64", BinaryPlatforms: "windows/amd64,darwin/arm64"})
	if err != nil {
		t.Fatal(err)
	}
	if has(linux.Modules) || !has(withWindows.Modules) {
		t.Errorf("mousetrap in the linux plan: %t, in the plan with windows assets: %t; want false, true", has(linux.Modules), has(withWindows.Modules))
	}
}

// The plan reuses go list's answers while what go reads is the same, and
// asks again when an import, a package, an embedded file or go.mod changes.
// A wrapper named go counts the real go command's runs.
func TestPlanReusesGoListOnlyWhileItsInputsAreTheSame(t *testing.T) {
	t.Setenv("KILN_CACHE_DIR", t.TempDir())
	real, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	bin, calls := t.TempDir(), filepath.Join(t.TempDir(), "calls")
	wrapper := "#!/bin/sh\necho \"$*\" >> " + calls + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	lists := func() int {
		data, _ := os.ReadFile(calls)
		return strings.Count(string(data), "list ")
	}

	mod := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		path := filepath.Join(mod, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("cmd/a/main.go", "package main\n\nimport \"example.com/m/pkg/x\"\n\nfunc main() { x.Hello() }\n")
	write("pkg/x/x.go", "package x\n\nfunc Hello() {}\n")
	plan := func() []string {
		t.Helper()
		p, err := session.Plan(session.Options{Root: testdaemon.RepoRoot(t), Module: mod, Packages: []string{"./cmd/a"}, Platforms: "linux/amd64"})
		if err != nil {
			t.Fatal(err)
		}
		return p.Binaries[0].Files
	}
	step := func(what string, wantRuns bool, wantFiles ...string) {
		t.Helper()
		before := lists()
		files := plan()
		if ran := lists() > before; ran != wantRuns {
			t.Errorf("%s: go list ran: %t, want %t", what, ran, wantRuns)
		}
		for _, f := range wantFiles {
			if !slices.Contains(files, f) {
				t.Errorf("%s: the plan's files %v lack %s", what, files, f)
			}
		}
	}
	step("first plan", true, "cmd/a/main.go", "pkg/x/x.go")
	step("nothing changed", false, "pkg/x/x.go")
	write("pkg/x/x.go", "package x\n\nfunc Hello() { println(\"a body edit\") }\n")
	step("an edit below the imports", false, "pkg/x/x.go")
	write("pkg/y/y.go", "package y\n\nimport _ \"embed\"\n\n//go:embed data\nvar Data string\n")
	write("pkg/y/data", "embedded\n")
	write("pkg/x/x.go", "package x\n\nimport \"example.com/m/pkg/y\"\n\nfunc Hello() { println(y.Data) }\n")
	step("a new import", true, "pkg/y/y.go", "pkg/y/data")
	write("pkg/y/y.go", "package y\n\nimport \"embed\"\n\n//go:embed static\nvar Data embed.FS\n")
	write("pkg/y/static/one.txt", "one\n")
	step("a changed //go:embed line", true, "pkg/y/static/one.txt")
	write("pkg/y/static/deeper/two.txt", "two\n")
	step("a new file under an embedded folder", true, "pkg/y/static/deeper/two.txt")
	write("go.mod", "module example.com/m\n\ngo 1.23\n")
	step("an edit to go.mod", true)
	step("nothing changed again", false)

	write("pkg/x/x.go", "package x\n\nimport \"example.com/m/pkg/z\"\n\nfunc Hello() { z.Hello() }\n")
	if _, err := session.Plan(session.Options{Root: testdaemon.RepoRoot(t), Module: mod, Packages: []string{"./cmd/a"}, Platforms: "linux/amd64"}); err == nil {
		t.Fatal("an import of a package that does not exist planned")
	}
	write("pkg/z/z.go", "package z\n\nfunc Hello() {}\n")
	step("the missing package written", true, "pkg/z/z.go")
}

// A variant is part of a platform's output folder: arm v6 and v7 binaries
// must not overwrite each other.
func TestPlatformDirNamesTheVariant(t *testing.T) {
	for _, c := range []struct {
		platform ocispec.Platform
		want     string
	}{
		{ocispec.Platform{OS: "linux", Architecture: "amd64"}, "linux_amd64"},
		{ocispec.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}, "linux_arm_v7"},
		{ocispec.Platform{OS: "linux", Architecture: "arm", Variant: "v6"}, "linux_arm_v6"},
	} {
		if got := golang.PlatformDir(c.platform); got != c.want {
			t.Errorf("PlatformDir(%v) = %q, want %q", c.platform, got, c.want)
		}
	}
}
