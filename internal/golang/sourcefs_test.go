package golang

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/tonistiigi/fsutil"
	"github.com/tonistiigi/fsutil/types"

	"github.com/kiln-build/kiln/internal/plan"
)

// walked is what a walk of an fsutil.FS sends, one line per entry.
func walked(t *testing.T, f fsutil.FS) []string {
	t.Helper()
	var out []string
	err := f.Walk(context.Background(), string(filepath.Separator), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*types.Stat)
		out = append(out, fmt.Sprintf("%s %v %d %d %q", filepath.ToSlash(st.Path), os.FileMode(st.Mode), st.Size, st.ModTime, st.Linkname))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestListedSourcesSendWhatFsutilWouldSend: the listed files' source sends
// the same entries, in the same order and with the same stats, as fsutil's
// own walk of the tree filtered to those files by exact include patterns,
// and lets the daemon open only listed files.
func TestListedSourcesSendWhatFsutilWouldSend(t *testing.T) {
	root := t.TempDir()
	tree := []string{
		"go.mod", "main.go", "README.md",
		"a/b/x.go", "a-c/y.go", "a.go", "a/b.go", "a/b-c/z.go", // '-' sorts before '/'
		"vendor/m/a.go", "vendor/m/LICENSE", "vendor/m/sub/c.go", "vendor/unused/u.go",
		"pkg/y/odd[1].go", "pkg/z/embed/file.txt",
	}
	for _, f := range tree {
		p := filepath.Join(root, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../a", filepath.Join(root, "pkg/link")); err != nil {
		t.Fatal(err)
	}
	listed := []string{"vendor/m/sub/c.go", "a/b/x.go", "a-c/y.go", "a.go", "a/b.go", "a/b-c/z.go", "go.mod", "main.go",
		"pkg/y/odd[1].go", "pkg/z/embed/file.txt", "vendor/m/a.go",
		"pkg/link/b.go", // below a symbolic link: the link is sent, not what it points to
		"gone.go",       // deleted since go listed it
		"a.go",          // listed twice
	}

	host, err := fsutil.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, f := range listed {
		if f != "gone.go" && f != "pkg/link/b.go" {
			patterns = append(patterns, regexp.MustCompile(`[\[\]*?\\]`).ReplaceAllString(f, `\$0`))
		}
	}
	patterns = append(patterns, "pkg/link")
	filtered, err := fsutil.NewFilterFS(host, &fsutil.FilterOpt{IncludePatterns: patterns})
	if err != nil {
		t.Fatal(err)
	}
	want := walked(t, filtered)
	got := walked(t, newListedFS(root, listed))
	if !slices.Equal(got, want) {
		t.Errorf("listed source sends\n%s\nfsutil sends\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Excludes still apply on top, as the daemon asks for them.
	excluded, err := fsutil.NewFilterFS(newListedFS(root, listed), &fsutil.FilterOpt{ExcludePatterns: []string{"vendor"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range walked(t, excluded) {
		if strings.HasPrefix(e, "vendor") {
			t.Errorf("excluded entry sent: %s", e)
		}
	}

	l := newListedFS(root, listed)
	rc, err := l.Open("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if dt, _ := io.ReadAll(rc); string(dt) != "main.go" {
		t.Errorf("main.go reads %q", dt)
	}
	rc.Close()
	for _, p := range []string{"README.md", "vendor/unused/u.go", "../" + filepath.Base(root) + "/README.md", "a/../README.md"} {
		if rc, err := l.Open(filepath.FromSlash(p)); !errors.Is(err, fs.ErrNotExist) {
			if rc != nil {
				rc.Close()
			}
			t.Errorf("the daemon opened %s, which is not listed (err %v)", p, err)
		}
	}
}

func TestVendorFiles(t *testing.T) {
	p := &plan.Plan{Root: t.TempDir(), Binaries: []plan.Binary{
		{Name: "a", Files: []string{"go.mod", "cmd/a/main.go", "vendor/modules.txt", "vendor/x.io/y/y.go", "vendor/x.io/y-z/z.go"}},
		{Name: "b", Files: []string{"go.mod", "cmd/b/main.go", "vendor/modules.txt", "vendor/x.io/y/y.go", "vendor/x.io/w/w.go"}},
	}}
	g := &Graph{Plan: p, Excludes: []string{"*.md"}}
	files, err := g.UseVendorArchive()
	if err != nil {
		t.Fatal(err)
	}
	// Every binary's, once each, in walk order ("y/" before "y-z").
	if want := []string{"vendor/modules.txt", "vendor/x.io/w/w.go", "vendor/x.io/y/y.go", "vendor/x.io/y-z/z.go"}; !slices.Equal(files, want) {
		t.Errorf("vendored files %v; want %v", files, want)
	}
	// The listed sources keep vendor/modules.txt alone: the mount point.
	g.Sources(p.Binaries[0])
	if got := g.sources[LocalSources+"-"+digest.FromString("a").Encoded()[:16]]; !slices.Equal(got, []string{"go.mod", "cmd/a/main.go", "vendor/modules.txt"}) {
		t.Errorf("a's listed sources %v; want its own files and vendor/modules.txt", got)
	}

	g = &Graph{Plan: p, Excludes: []string{"vendor/x.io/w"}}
	if _, err := g.UseVendorArchive(); err == nil || !strings.Contains(err.Error(), ".dockerignore excludes vendor/x.io/w/w.go, which go reads to build b") {
		t.Errorf("a .dockerignore'd vendored file gave %v; want it named", err)
	}
}
