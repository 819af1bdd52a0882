// Package modfixture writes Go modules, module proxy directories and a git
// server over SSH for the tests of the module download stage. Everything is
// generated in the test's directories, nothing is fetched.
package modfixture

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// Write writes files (slash-separated paths relative to dir).
func Write(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Module is a module version to serve from a proxy directory.
type Module struct {
	Path, Version string
	Files         map[string]string // must include go.mod
}

// Proxy writes the modules as a GOPROXY directory (the layout of
// $GOMODCACHE/cache/download) and returns the go.sum lines for them.
func Proxy(t testing.TB, dir string, mods ...Module) string {
	t.Helper()
	var sums strings.Builder
	for _, m := range mods {
		src := t.TempDir()
		Write(t, src, m.Files)
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			t.Fatal(err)
		}
		v := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(v, 0o755); err != nil {
			t.Fatal(err)
		}
		var zb bytes.Buffer
		if err := modzip.CreateFromDir(&zb, module.Version{Path: m.Path, Version: m.Version}, src); err != nil {
			t.Fatal(err)
		}
		zipPath := filepath.Join(v, m.Version+".zip")
		Write(t, v, map[string]string{
			m.Version + ".zip":  zb.String(),
			m.Version + ".mod":  m.Files["go.mod"],
			m.Version + ".info": `{"Version":"` + m.Version + `","Time":"2026-01-01T00:00:00Z"}`,
		})
		appendLine(t, filepath.Join(v, "list"), m.Version)
		h1, err := dirhash.HashZip(zipPath, dirhash.Hash1)
		if err != nil {
			t.Fatal(err)
		}
		modHash, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(m.Files["go.mod"])), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sums.WriteString(m.Path + " " + m.Version + " " + h1 + "\n")
		sums.WriteString(m.Path + " " + m.Version + "/go.mod " + modHash + "\n")
	}
	return sums.String()
}

func appendLine(t testing.TB, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
}

// Go runs the host go in dir with extra environment and fails the test on error.
func Go(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
