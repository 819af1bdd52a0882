package plan

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
