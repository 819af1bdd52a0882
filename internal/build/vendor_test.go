package build

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/modfixture"
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
	time.Sleep(1100 * time.Millisecond) // files a second old are not racy

	dirA, err := vendorArchive(ctx, rootA, listed, cache)
	if err != nil {
		t.Fatal(err)
	}
	dirB, err := vendorArchive(ctx, rootB, listed, cache)
	if err != nil {
		t.Fatal(err)
	}
	if dirA == dirB {
		t.Fatalf("two repositories share the archive folder %s", dirA)
	}
	a, _ := os.ReadFile(filepath.Join(dirA, golang.VendorTar))
	b, _ := os.ReadFile(filepath.Join(dirB, golang.VendorTar))
	if len(a) == 0 || !bytes.Equal(a, b) {
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

	// Unchanged: the archive is not written again.
	before, _ := os.Stat(filepath.Join(dirA, golang.VendorTar))
	if _, err := vendorArchive(ctx, rootA, listed, cache); err != nil {
		t.Fatal(err)
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
	if _, err := vendorArchive(ctx, rootA, listed, cache); err != nil {
		t.Fatal(err)
	}
	a, _ = os.ReadFile(filepath.Join(dirA, golang.VendorTar))
	if got := tarFiles(t, a)["example.com/greet/a.go"]; got != "package GREET\n" {
		t.Errorf("after an edit that kept size and time the archive holds %q", got)
	}

	// A file that appears is archived.
	writeTree(t, rootA, map[string]string{"vendor/example.com/gone.go": "package example\n"}, time.Now().Add(-time.Hour))
	if _, err := vendorArchive(ctx, rootA, listed, cache); err != nil {
		t.Fatal(err)
	}
	a, _ = os.ReadFile(filepath.Join(dirA, golang.VendorTar))
	if _, ok := tarFiles(t, a)["example.com/gone.go"]; !ok {
		t.Errorf("a listed file that appeared is not in the archive")
	}

	// The archive of a repository that is gone goes with the next one made.
	if err := os.RemoveAll(rootB); err != nil {
		t.Fatal(err)
	}
	writeTree(t, rootA, map[string]string{"vendor/modules.txt": "# changed\n"}, time.Now().Add(-time.Hour))
	if _, err := vendorArchive(ctx, rootA, listed, cache); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dirB); !os.IsNotExist(err) {
		t.Errorf("the archive of a deleted repository is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dirA, golang.VendorTar)); err != nil {
		t.Errorf("the archive of a live repository went: %v", err)
	}
}
