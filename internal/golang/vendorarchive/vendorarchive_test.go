package vendorarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/uptodate"
)

func writeTree(t *testing.T, root string, files map[string]string, mtime time.Time) {
	t.Helper()
	modfixture.Write(t, root, files)
	for name := range files {
		if err := os.Chtimes(filepath.Join(root, filepath.FromSlash(name)), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
}

func tarFiles(t *testing.T, data []byte) map[string]string {
	t.Helper()
	files := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		files[hdr.Name] = string(body)
	}
}

func TestVendorArchive(t *testing.T) {
	ctx := context.Background()
	defer trustRecentInputs()()
	grace := vendorGrace
	vendorGrace = 0
	defer func() { vendorGrace = grace }()
	now := func() uptodate.Clock { return uptodate.Clock{At: time.Now(), OK: true} }
	tree := map[string]string{
		"vendor/modules.txt":              "# example.com/greet v1.0.0\n",
		"vendor/example.com/greet/a.go":   "package greet\n",
		"vendor/example.com/greet-x/b.go": "package x\n",
		"vendor/example.com/greet/sub/c":  "embedded",
		"main.go":                         "package main\n",
	}
	listed := []string{"vendor/example.com/greet-x/b.go", "vendor/example.com/greet/a.go", "vendor/example.com/greet/sub/c", "vendor/modules.txt", "vendor/example.com/gone.go"}
	slices.SortFunc(listed, golang.WalkOrder)
	cache := t.TempDir()
	rootA, rootB := t.TempDir(), t.TempDir()
	writeTree(t, rootA, tree, time.Now().Add(-time.Hour))
	writeTree(t, rootB, tree, time.Now().Add(-2*time.Hour))

	dirA, err := archiveOf(ctx, rootA, listed, cache, now())
	if err != nil {
		t.Fatal(err)
	}
	dirB, err := archiveOf(ctx, rootB, listed, cache, now())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dirA) == filepath.Dir(dirB) {
		t.Fatalf("two repositories share the archive folder %s", filepath.Dir(dirA))
	}
	a, _ := os.ReadFile(filepath.Join(dirA, golang.VendorTar))
	b, _ := os.ReadFile(filepath.Join(dirB, golang.VendorTar))
	if len(a) == 0 || !bytes.Equal(a, b) || filepath.Base(dirA) != filepath.Base(dirB) {
		t.Fatalf("the same files at other paths and times gave different archives (%d and %d bytes)", len(a), len(b))
	}
	got := tarFiles(t, a)
	for name, body := range map[string]string{"modules.txt": tree["vendor/modules.txt"], "example.com/greet/a.go": "package greet\n", "example.com/greet/sub/c": "embedded", "example.com/greet/": "", "example.com/greet/sub/": ""} {
		if v, ok := got[name]; !ok || v != body {
			t.Errorf("archive entry %s = %q (present %v); want %q", name, v, ok, body)
		}
	}
	if _, ok := got["example.com/gone.go"]; ok || len(got) != 8 {
		t.Errorf("archive holds %v; want the four listed files that exist, below their folders", got)
	}

	// Unchanged: the same archive, not written again.
	before, _ := os.Stat(filepath.Join(dirA, golang.VendorTar))
	if again, err := archiveOf(ctx, rootA, listed, cache, now()); err != nil || again != dirA {
		t.Fatalf("an unchanged vendor/ gave %s, %v; want %s", again, err, dirA)
	}
	if after, _ := os.Stat(filepath.Join(dirA, golang.VendorTar)); !os.SameFile(before, after) {
		t.Errorf("an unchanged vendor/ was archived again")
	}

	// The same size and modification time: the change time still differs.
	edited := filepath.Join(rootA, "vendor/example.com/greet/a.go")
	info, _ := os.Stat(edited)
	if err := os.WriteFile(edited, []byte("package GREET\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(edited, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	dirEdited, err := archiveOf(ctx, rootA, listed, cache, now())
	if err != nil {
		t.Fatal(err)
	}
	a, _ = os.ReadFile(filepath.Join(dirEdited, golang.VendorTar))
	if got := tarFiles(t, a)["example.com/greet/a.go"]; got != "package GREET\n" {
		t.Errorf("after an edit that kept size and time the archive holds %q", got)
	}
	// BuildKit resends by size and modification time: two archives of one
	// size must differ in time.
	if x, y := before, mustStat(t, filepath.Join(dirEdited, golang.VendorTar)); x.Size() != y.Size() || x.ModTime().Equal(y.ModTime()) {
		t.Errorf("two archives of %d and %d bytes have the times %v and %v; want equal sizes and other times", x.Size(), y.Size(), x.ModTime(), y.ModTime())
	}
	// The archive no record names is removed (past the grace, here none);
	// rootB's record still names its own.
	if _, err := os.Stat(dirA); !os.IsNotExist(err) {
		t.Errorf("the archive the edit replaced is still there: %v", err)
	}

	// A file that appears is archived; a folder that is a link goes as the
	// link, without what was listed below it.
	writeTree(t, rootA, map[string]string{"vendor/example.com/gone.go": "package example\n"}, time.Now().Add(-time.Hour))
	if err := os.Rename(filepath.Join(rootA, "vendor/example.com/greet-x"), filepath.Join(rootA, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../elsewhere", filepath.Join(rootA, "vendor/example.com/greet-x")); err != nil {
		t.Fatal(err)
	}
	dirLinked, err := archiveOf(ctx, rootA, listed, cache, now())
	if err != nil {
		t.Fatal(err)
	}
	a, _ = os.ReadFile(filepath.Join(dirLinked, golang.VendorTar))
	got = tarFiles(t, a)
	if _, ok := got["example.com/gone.go"]; !ok {
		t.Errorf("a listed file that appeared is not in the archive")
	}
	if _, ok := got["example.com/greet-x/b.go"]; ok {
		t.Errorf("a file below a linked folder was archived: %v", got)
	}
	// A link pointed elsewhere is a new archive, though the files it
	// reaches stat the same.
	link := filepath.Join(rootA, "vendor/example.com/greet-x")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../elsewhere/.", link); err != nil {
		t.Fatal(err)
	}
	dirRelinked, err := archiveOf(ctx, rootA, listed, cache, now())
	if err != nil {
		t.Fatal(err)
	}
	if dirRelinked == dirLinked {
		t.Errorf("a re-pointed link kept the archive of the old one")
	}

	// The session serves the archive it opened, though another kiln removes
	// its folder; it is sent as one file, dated before 2038.
	src := New(rootA, listed, cache, &uptodate.Clock{})
	defer src.Close()
	var walked []string
	if err := src.Walk(ctx, "/", func(p string, d fs.DirEntry, err error) error {
		walked = append(walked, p)
		if info, _ := d.Info(); info.ModTime().Year() >= 2038 {
			t.Errorf("the archive is dated %v, which some file systems cannot store", info.ModTime())
		}
		return err
	}); err != nil || !slices.Equal(walked, []string{golang.VendorTar}) {
		t.Fatalf("the vendor source walked %v, %v; want the archive alone", walked, err)
	}
	if err := os.RemoveAll(dirRelinked); err != nil {
		t.Fatal(err)
	}
	r, err := src.Open(golang.VendorTar)
	if err != nil {
		t.Fatal(err)
	}
	served, _ := io.ReadAll(r)
	if _, ok := tarFiles(t, served)["example.com/gone.go"]; !ok {
		t.Errorf("the archive served after its folder went is not the one opened (%d bytes)", len(served))
	}

	// The archives of a repository that is gone go with the next one made.
	if err := os.RemoveAll(rootB); err != nil {
		t.Fatal(err)
	}
	writeTree(t, rootA, map[string]string{"vendor/modules.txt": "# changed\n"}, time.Now().Add(-time.Hour))
	dirLast, err := archiveOf(ctx, rootA, listed, cache, now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(dirB)); !os.IsNotExist(err) {
		t.Errorf("the archives of a deleted repository are still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dirLast, golang.VendorTar)); err != nil {
		t.Errorf("the archive of a live repository went: %v", err)
	}

	// A stat younger than the racy window is not trusted: the record still
	// names the archive before, so the next build archives again.
	vendorGrace = time.Hour
	uptodate.RacyWindow = time.Hour
	writeTree(t, rootA, map[string]string{"vendor/modules.txt": "# racy\n"}, time.Now().Add(-time.Hour))
	racy, changedLately, err := vendorArchive(ctx, rootA, listed, cache, now())
	if err != nil || !changedLately {
		t.Fatalf("an archive of a file changed within the racy window: %v, racy %v; want racy", err, changedLately)
	}
	records, _ := filepath.Glob(filepath.Join(filepath.Dir(racy), "set-*"))
	for _, r := range records {
		if data, _ := os.ReadFile(r); strings.HasSuffix(string(data), filepath.Base(racy)) {
			t.Errorf("a racy archive was recorded as current: %s", data)
		}
	}
	if len(records) != 1 {
		t.Errorf("records %v; want one, for the one set of files", records)
	}
}

func mustStat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// archiveOf is vendorArchive's folder, for checks that do not look at
// whether it was racy.
func archiveOf(ctx context.Context, root string, files []string, cache string, began uptodate.Clock) (string, error) {
	dir, _, err := vendorArchive(ctx, root, files, cache, began)
	return dir, err
}

// trustRecentInputs lets a test trust a tree written a moment ago; the
// returned function restores the window.
func trustRecentInputs() func() {
	old := uptodate.RacyWindow
	uptodate.RacyWindow = 0
	return func() { uptodate.RacyWindow = old }
}
