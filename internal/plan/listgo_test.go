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
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	wrapper := filepath.Join(dir, "go")
	script := "#!/bin/sh\n" +
		"[ \"$GOTOOLCHAIN\" = local ] || { echo \"GOTOOLCHAIN=$GOTOOLCHAIN, want local\" >&2; exit 1; }\n" +
		"echo \"$*\" >> " + calls + "\n" +
		"exec " + hostGo + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// Were they obeyed, go would switch to this release, or read the
	// standard library from another folder (a go that switched sets GOROOT
	// for what it runs).
	t.Setenv("GOTOOLCHAIN", "go1.27.3")
	t.Setenv("GOROOT", t.TempDir())

	p, err := Resolve(root, cfg, Options{ListGo: wrapper})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(calls)
	if !strings.Contains(string(data), "list -e -deps") {
		t.Fatalf("the packages were not listed by the given go; it ran: %q", data)
	}
	version := exec.Command(hostGo, "env", "GOVERSION")
	version.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOROOT=")
	out, err := version.Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(out)) == "go"+p.Toolchain.GoVersion && len(p.Std) == 0 {
		t.Errorf("listed by go%s, the pinned version, yet the plan has no standard library packages", p.Toolchain.GoVersion)
	}
}
