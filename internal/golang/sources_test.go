package golang

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
)

// TestSourcePatternsSelectExactlyTheListedFiles: a directory whose *.go
// files are all listed gets one pattern, and the patterns match exactly the
// listed files of the tree, as BuildKit matches them.
func TestSourcePatternsSelectTheListedFilesAndOnlyGoFilesBeside(t *testing.T) {
	root := t.TempDir()
	tree := []string{
		"go.mod", "main.go", "tool.go", "README.md",
		"vendor/m/a.go", "vendor/m/b_linux.go", "vendor/m/LICENSE", "vendor/m/sub/c.go",
		"pkg/x/x.go", "pkg/x/x_test.go", "pkg/x/data.txt", "pkg/x/notes.txt",
		"pkg/y/y.go", "pkg/y/odd[1].go",
		"pkg/z/z.go", "pkg/z/embed/file.txt",
		"docs/guide.md",
	}
	for _, f := range tree {
		p := filepath.Join(root, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	listed := []string{"go.mod", "main.go", "pkg/x/data.txt", "pkg/x/x.go", "pkg/y/odd[1].go", "pkg/y/y.go",
		"pkg/z/embed/file.txt", "pkg/z/z.go", "vendor/m/a.go", "vendor/m/b_linux.go", "vendor/m/sub/c.go"}
	patterns := sourcePatterns(listed)
	if want := []string{"go.mod", "main.go", "pkg/x/data.txt", "pkg/**/*.go", "pkg/z/embed/file.txt", "vendor/**/*.go"}; !slices.Equal(patterns, want) {
		t.Errorf("patterns %v, want %v", patterns, want)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	var matched []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		if err != nil || d.IsDir() {
			return err
		}
		if ok, _ := pm.MatchesOrParentMatches(filepath.ToSlash(rel)); ok {
			matched = append(matched, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(matched)
	// Every listed file, and beside them only .go files below a folder.
	want := append(slices.Clone(listed), "pkg/x/x_test.go")
	slices.Sort(want)
	if !slices.Equal(matched, want) {
		t.Errorf("the patterns %v select\n%s\nwant\n%s", patterns, strings.Join(matched, "\n"), strings.Join(want, "\n"))
	}
}
