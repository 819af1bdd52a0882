package golang_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/golang"
)

func TestStdBuildArgsKeepWhatReachesTheStandardLibrary(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"-trimpath", "-gcflags=all=-dwarf=false", "-ldflags=-s -w"}, []string{"-trimpath", "-gcflags=all=-dwarf=false"}},
		{[]string{"-gcflags=-N -l", "--gcflags= -m", "-asmflags=-D=X", "-gcflags="}, nil},
		{[]string{"-gcflags=std=-N", "-asmflags=all=-D=X", "-tags=a"}, []string{"-gcflags=std=-N", "-asmflags=all=-D=X", "-tags=a"}},
		{[]string{"-gcflags", "-N", "-ldflags", "-s", "-pgo=off"}, []string{"-pgo=off"}},
		{[]string{"-cover", "-covermode", "atomic", "-race"}, []string{"-race"}},
		{[]string{"-cover", "-covermode=set", "-coverpkg=example.com/m/..."}, []string{"-cover", "-covermode=set", "-coverpkg=example.com/m/..."}},
	} {
		if got := golang.StdBuildArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("StdBuildArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestTheStandardLibraryStepCompilesWhatTheGoBuildLooksUp: go build given
// the go build step's flags, an unpatterned -gcflags among them, finds in
// GOCACHE every standard package the standard-library step compiled
// before it, and compiles none of them again.
func TestTheStandardLibraryStepCompilesWhatTheGoBuildLooksUp(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	dir := t.TempDir()
	for name, text := range map[string]string{
		"go.mod":     "module example.com/m\n\ngo 1.22\n",
		"lib/lib.go": "package lib\n\nimport \"unicode/utf8\"\n\nvar N = utf8.RuneLen('x')\n",
	} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := []string{"-trimpath", "-gcflags=all=-dwarf=false", "-gcflags=-N -l", "-ldflags=-s -w"}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", append([]string{"build", "-x"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOTOOLCHAIN=local", "CGO_ENABLED=0", "GOPROXY=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go build %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	t.Setenv("GOCACHE", t.TempDir()) // one cache, empty, for both
	std := run(append(golang.StdBuildArgs(build), "unicode/utf8")...)
	if !strings.Contains(std, " -p unicode/utf8 ") {
		t.Fatalf("the standard-library step did not compile unicode/utf8:\n%s", std)
	}
	got := run(append(build, "./lib")...)
	if !strings.Contains(got, " -p example.com/m/lib ") {
		t.Fatalf("the go build did not compile its own package:\n%s", got)
	}
	if strings.Contains(got, " -p unicode/utf8 ") {
		t.Errorf("the go build compiled unicode/utf8 again: the standard-library step's flags differ\n%s", got)
	}
}
