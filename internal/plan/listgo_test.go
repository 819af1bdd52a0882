package plan

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/config"
)

// The go that lists the packages is the one kiln is given (the pinned
// toolchain's), run as it is whatever GOTOOLCHAIN the caller set: another Go
// on the host would list other standard packages, and other files where
// build constraints name Go versions.
func TestPackagesAreListedByTheGivenGo(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	hostGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	asItIs := append(os.Environ(), "GOTOOLCHAIN=local", "GOROOT=", "GOENV=off")
	goenv := exec.Command(hostGo, "env", "GOROOT", "GOVERSION")
	goenv.Env = asItIs
	out, err := goenv.Output()
	if err != nil {
		t.Fatal(err)
	}
	hostRoot, hostVersion, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	// A toolchain folder as kiln's cache holds one: the host's GOROOT, with
	// a bin/go that checks how it is run.
	goroot := t.TempDir()
	entries, err := os.ReadDir(hostRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "bin" {
			if err := os.Symlink(filepath.Join(hostRoot, e.Name()), filepath.Join(goroot, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	calls := filepath.Join(t.TempDir(), "calls")
	wrapper := filepath.Join(goroot, "bin", "go")
	script := "#!/bin/sh\n" +
		"[ \"$GOTOOLCHAIN\" = local ] || { echo \"GOTOOLCHAIN=$GOTOOLCHAIN, want local\" >&2; exit 1; }\n" +
		"[ \"$GOROOT\" = " + goroot + " ] || { echo \"GOROOT=$GOROOT, want its own\" >&2; exit 1; }\n" +
		"echo \"$*\" >> " + calls + "\n" +
		"exec " + hostGo + " \"$@\"\n"
	if err := os.MkdirAll(filepath.Dir(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// Were they obeyed, go would switch to this release, or read the
	// standard library from another folder: a go that switched sets GOROOT
	// for what it runs, and `go env -w` can write one.
	t.Setenv("GOTOOLCHAIN", "go1.27.3")
	t.Setenv("GOROOT", t.TempDir())
	// The machine's own settings (its GOPROXY, say) stay.
	envFile := filepath.Join(t.TempDir(), "env")
	settings := []byte{}
	if own, err := GoEnvFile(); err == nil {
		settings, _ = os.ReadFile(own)
	}
	if err := os.WriteFile(envFile, append(settings, "\nGOROOT="+t.TempDir()+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOENV", envFile)

	p, err := Resolve(root, cfg, Options{ListGo: wrapper})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(calls)
	if !strings.Contains(string(data), "list -e -deps") {
		t.Fatalf("the packages were not listed by the given go; it ran: %q", data)
	}
	if hostVersion == "go"+p.Toolchain.GoVersion && len(p.Std) == 0 {
		t.Errorf("listed by go%s, the pinned version, yet the plan has no standard library packages", p.Toolchain.GoVersion)
	}
}

// A variable the run overrides (the pinned go's GOTOOLCHAIN and GOROOT)
// does not split the list cache by the caller's value of it.
func TestListCacheKeyHasOnlyTheValuesGoSees(t *testing.T) {
	c := listCache{dir: t.TempDir()}
	env := []string{"GOTOOLCHAIN=local", "GOROOT=/pinned"}
	t.Setenv("GOTOOLCHAIN", "go1.27.3")
	t.Setenv("GOROOT", "/one")
	a, _ := c.key("/src", env, []string{"list"})
	t.Setenv("GOTOOLCHAIN", "auto")
	t.Setenv("GOROOT", "/another")
	b, _ := c.key("/src", env, []string{"list"})
	if a != b {
		t.Error("the caller's overridden GOTOOLCHAIN and GOROOT changed the key")
	}
	c2, _ := c.key("/src", []string{"GOTOOLCHAIN=local", "GOROOT=/other-pinned"}, []string{"list"})
	if c2 == b {
		t.Error("the GOROOT go lists with is not in the key")
	}
}

// The listing chooses a binary's files as its compile does: the variables
// that choose files by build constraint (GOAMD64, GOEXPERIMENT…) and the
// tags of go.env's GOFLAGS come from kiln.yaml, never from the shell or a
// `go env -w`, since the compile in BuildKit sees neither.
func TestTheListingChoosesFilesAsTheCompileDoes(t *testing.T) {
	_, resolve := helloModule(t, map[string]string{
		"go.mod":                "module example.com/app\n\ngo 1.26\n",
		"cmd/hello/main.go":     "package main\n\nfunc main() {}\n",
		"cmd/hello/v3.go":       "//go:build amd64.v3\n\npackage main\n",
		"cmd/hello/jsonv2.go":   "//go:build goexperiment.jsonv2\n\npackage main\n",
		"cmd/hello/tagged.go":   "//go:build kilntag\n\npackage main\n",
		"cmd/hello/untagged.go": "//go:build !kilntag\n\npackage main\n",
	})
	listed := func(env map[string]string) []string {
		t.Helper()
		return resolve(env, Options{}).Binary("hello").Files
	}
	// The shell and the go env file ask for v3, jsonv2 and the tag.
	envFile := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(envFile, []byte("GOAMD64=v3\nGOEXPERIMENT=jsonv2\nGOFLAGS=-tags=kilntag\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOENV", envFile)
	got := listed(nil)
	if want := []string{"cmd/hello/main.go", "cmd/hello/untagged.go", "go.mod"}; !slices.Equal(got, want) {
		t.Errorf("with the host's go env file asking for v3, jsonv2 and a tag, kiln.yaml for none: %v, want %v", got, want)
	}
	t.Setenv("GOENV", "off")
	t.Setenv("GOAMD64", "v3")
	t.Setenv("GOEXPERIMENT", "jsonv2")
	if got := listed(nil); slices.Contains(got, "cmd/hello/v3.go") || slices.Contains(got, "cmd/hello/jsonv2.go") {
		t.Errorf("the shell's GOAMD64 and GOEXPERIMENT chose files: %v", got)
	}
	t.Setenv("GOAMD64", "")
	t.Setenv("GOEXPERIMENT", "")
	got = listed(map[string]string{"GOAMD64": "v3", "GOEXPERIMENT": "jsonv2", "GOFLAGS": "-tags=kilntag"})
	if want := []string{"cmd/hello/jsonv2.go", "cmd/hello/main.go", "cmd/hello/tagged.go", "cmd/hello/v3.go", "go.mod"}; !slices.Equal(got, want) {
		t.Errorf("with kiln.yaml's go.env asking for v3, jsonv2 and the tag: %v, want %v", got, want)
	}
}

// A stamped build of a tree with a file git does not track, compiled into
// a binary, is stamped dirty and names the file: the tree is not the
// commit its stamp and provenance name.
func TestAnUntrackedFileAStampedBuildReadsMakesTheTreeDirty(t *testing.T) {
	app, resolve := helloModule(t, map[string]string{
		"go.mod":            "module example.com/app\n\ngo 1.26\n",
		"cmd/hello/main.go": "package main\n\nfunc main() {}\n",
		"VERSION":           "v1.2.3\n",
	})
	git := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-C", app, "-c", "user.name=kiln", "-c", "user.email=kiln@example.com"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-q", "-m", "one")
	writeFile(t, filepath.Join(app, "cmd", "hello", "extra.go"), "package main\n\nvar extra = 1\n")
	stamped := func() *Plan { return resolve(nil, Options{Stamp: true}) }
	if p := stamped(); p.Stamp.TreeState != "dirty" || !slices.Equal(p.Untracked, []string{"cmd/hello/extra.go"}) {
		t.Errorf("with extra.go untracked: tree %s, untracked %v; want dirty, naming it", p.Stamp.TreeState, p.Untracked)
	}
	git("add", ".")
	git("commit", "-q", "-m", "two")
	if p := stamped(); p.Stamp.TreeState != "clean" || len(p.Untracked) != 0 {
		t.Errorf("with everything committed: tree %s, untracked %v; want clean", p.Stamp.TreeState, p.Untracked)
	}
}

// helloModule writes files (slash paths) into a new module folder and
// returns it with a resolver of its ./cmd/hello under this repository's
// configuration (toolchain pins, caches), with go.env set to env.
func helloModule(t *testing.T, files map[string]string) (string, func(env map[string]string, opts Options) *Plan) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := config.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	for name, body := range files {
		writeFile(t, filepath.Join(app, filepath.FromSlash(name)), body)
	}
	return app, func(env map[string]string, opts Options) *Plan {
		t.Helper()
		cfg := *repo
		cfg.Binaries, cfg.Images, cfg.Budgets, cfg.Stamp = []config.Binary{{Name: "hello", Package: "./cmd/hello"}}, nil, nil, config.Stamp{}
		cfg.Go.Env = env
		opts.Platforms = []ocispec.Platform{{OS: "linux", Architecture: "amd64"}}
		p, err := Resolve(app, &cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// writeFile writes body to path, making its folder.
func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
