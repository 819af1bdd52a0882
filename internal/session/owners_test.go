package session_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// Another user's checkout of the same tree (another owner, group-writable
// files from umask 002) hits the layer cache the first one filled: BuildKit
// hashes the owner and mode of every file it is sent into the cache keys.
func TestAnotherUsersCheckoutHitsTheSameCache(t *testing.T) {
	testdaemon.Shared(t)
	fixture := t.TempDir()
	modfixture.Write(t, fixture, map[string]string{
		"go.mod":       "module example.com/owners\n\ngo 1.26\n",
		"cmd/o/o.go":   "package main\n\nimport \"example.com/owners/lib\"\n\nfunc main() { println(lib.Name) }\n",
		"lib/lib.go":   "package lib\n\n// Name is printed.\nconst Name = \"owners\"\n",
		"cmd/o/doc.go": "// Command o prints a name.\npackage main\n",
	})
	opts := session.Options{Root: testdaemon.RepoRoot(t), Module: fixture, Packages: []string{"./cmd/o"}, Platforms: "linux/amd64", Progress: "quiet"}
	binariesInNewFolder(t, opts)
	err := filepath.WalkDir(fixture, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.Chmod(path, fi.Mode().Perm()|0o020); err != nil {
			return err
		}
		return os.Lchown(path, 4242, 4242)
	})
	if err != nil {
		t.Fatal(err)
	}
	out := binariesInNewFolder(t, opts)
	if len(out.Ran("sources")) == 0 {
		t.Fatalf("the second build sent no sources, so it proves nothing: %v", out.Steps)
	}
	if ran := out.Ran("go build"); len(ran) != 0 {
		t.Errorf("the other user's checkout ran %v again; want every step from the cache", ran)
	}
}
