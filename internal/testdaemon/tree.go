package testdaemon

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// CopyTree copies a repository for a test to edit, leaving out _output.
func CopyTree(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if rel == "_output" {
			return filepath.SkipDir
		}
		dst := filepath.Join(to, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		case d.Type().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, data, info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// AppendLine appends text to a file of a test tree.
func AppendLine(t testing.TB, path, line string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(data, line...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// GrepTree returns a regular file under dir that contains needle.
func GrepTree(dir string, needle []byte) (string, bool) {
	var found string
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || found != "" || !info.Mode().IsRegular() || info.Size() > 64<<20 {
			return nil
		}
		if data, err := os.ReadFile(path); err == nil && bytes.Contains(data, needle) {
			found = path
		}
		return nil
	})
	return found, found != ""
}
