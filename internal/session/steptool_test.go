package session_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// binariesInNewFolder builds opts' binaries into a folder of their own.
func binariesInNewFolder(t *testing.T, opts session.Options) *session.BinariesOutcome {
	t.Helper()
	opts.OutDir = t.TempDir()
	out, err := session.Binaries(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// keptStepTools are the kilnstep binaries a kiln cache dir keeps.
func keptStepTools(t *testing.T, cache string) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(cache, "kilnstep", "*", "kilnstep"))
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// The steps of a build take kilnstep from the client's cache, where the
// first build on the machine left it; one that is not a plain file there,
// or not the bytes recorded when it was built, is built again, not used.
func TestStepToolIsKeptOnTheClient(t *testing.T) {
	testdaemon.Shared(t)
	realCache, err := buildkit.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	freshKilnCache(t)
	cache, _ := buildkit.CacheDir()
	fixture := t.TempDir()
	modfixture.Write(t, fixture, map[string]string{
		"go.mod":       "module example.com/tool\n\ngo 1.26\n",
		"cmd/t/t.go":   "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"tool\\n\") }\n",
		"cmd/t/doc.go": "// Command t prints its name.\npackage main\n",
	})
	opts := session.Options{Root: testdaemon.RepoRoot(t), Module: fixture, Packages: []string{"./cmd/t"}, Platforms: "linux/amd64", Progress: "quiet"}
	run := func(t *testing.T) *session.BinariesOutcome {
		t.Helper()
		out := binariesInNewFolder(t, opts)
		if got, err := exec.Command(filepath.Join(out.Dir, "linux_amd64", "t")).Output(); err != nil || string(got) != "tool\n" {
			t.Fatalf("the binary printed %q (%v)", got, err)
		}
		return out
	}

	out := run(t)
	kept := keptStepTools(t, cache)
	if len(kept) != 1 {
		t.Fatalf("the first build kept %v in %s, want one kilnstep", kept, cache)
	}
	first, err := os.ReadFile(kept[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Ran("build kilnstep")) != 0 || !slices.ContainsFunc(out.Steps, func(s buildkit.Step) bool { return s.Name == "[go] kilnstep" }) {
		t.Errorf("the build's steps did not take kilnstep from the client: %v", out.Steps)
	}
	// Another daemon's build of the same key, when this machine kept one.
	if other, err := os.ReadFile(filepath.Join(realCache, "kilnstep", filepath.Base(filepath.Dir(kept[0])), "kilnstep")); err == nil && !bytes.Equal(other, first) {
		t.Errorf("kilnstep built twice under one key differs: %s and %s", kept[0], realCache)
	}

	plants := map[string]func(path string) error{
		"a link to a script": func(path string) error {
			script := filepath.Join(t.TempDir(), "planted")
			os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755)
			return os.Symlink(script, path)
		},
		"an empty file": func(path string) error { return os.WriteFile(path, nil, 0o755) },
		"the kept one with a byte appended": func(path string) error {
			return os.WriteFile(path, append(bytes.Clone(first), 0), 0o755)
		},
	}
	for name, plant := range plants {
		t.Run(name+" in its place is built again", func(t *testing.T) {
			if err := os.Remove(kept[0]); err != nil {
				t.Fatal(err)
			}
			if err := plant(kept[0]); err != nil {
				t.Fatal(err)
			}
			run(t)
			fi, err := os.Lstat(kept[0])
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("kilnstep in the cache is %v (%v) after the build, want a plain file", fi, err)
			}
			if again, _ := os.ReadFile(kept[0]); !bytes.Equal(again, first) {
				t.Error("the rebuilt kilnstep differs from the first")
			}
			if leftovers, _ := filepath.Glob(filepath.Join(cache, "kilnstep", "*.*")); len(leftovers) != 0 {
				t.Errorf("staging folders left behind: %v", strings.Join(leftovers, " "))
			}
		})
	}
}
