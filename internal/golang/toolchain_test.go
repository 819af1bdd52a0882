package golang

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/plan"
)

// fakeProxy serves a small toolchain module zip, as the Go module proxy would.
func fakeProxy(t *testing.T, module string) (url, sum string) {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	prefix := "golang.org/toolchain@" + module + "/"
	for name, content := range map[string]string{"bin/go": "#!fake go", "pkg/tool/linux_amd64/compile": "fake", "src/fmt/print.go": "package fmt"} {
		w, err := zw.Create(prefix + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(content))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(buf.Bytes())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/golang.org/toolchain/@v/"+module+".zip" {
			http.NotFound(w, r)
			return
		}
		w.Write(buf.Bytes())
	}))
	t.Cleanup(srv.Close)
	return srv.URL, hex.EncodeToString(h[:])
}

func TestFetchToolchainVerifiesThePin(t *testing.T) {
	tc := plan.Toolchain{GoVersion: "1.26.8", Module: "v0.0.1-go1.26.8.linux-amd64"}
	url, sum := fakeProxy(t, tc.Module)
	t.Setenv("GOPROXY", url+",direct")
	t.Setenv("GOFLAGS", "")

	t.Run("mismatch", func(t *testing.T) {
		bad := tc
		bad.SHA256 = strings.Repeat("0", 64)
		cache := t.TempDir()
		_, err := FetchToolchain(context.Background(), bad, cache, os.Getenv("GOPROXY"))
		if err == nil {
			t.Fatal("a toolchain with the wrong hash was accepted")
		}
		for _, want := range []string{"build/kiln.yaml", "toolchain.sha256", sum, bad.SHA256} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
		if entries, _ := os.ReadDir(filepath.Join(cache, "toolchain")); len(entries) != 0 {
			t.Errorf("a rejected toolchain left files behind: %v", entries)
		}
	})
	t.Run("match", func(t *testing.T) {
		good := tc
		good.SHA256 = sum
		dir, err := FetchToolchain(context.Background(), good, t.TempDir(), os.Getenv("GOPROXY"))
		if err != nil {
			t.Fatal(err)
		}
		for path, mode := range map[string]os.FileMode{"bin/go": 0o755, "pkg/tool/linux_amd64/compile": 0o755, "src/fmt/print.go": 0o644} {
			fi, err := os.Stat(filepath.Join(dir, path))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != mode {
				t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), mode)
			}
		}
	})
	t.Run("file:// proxy directory", func(t *testing.T) {
		resp, err := http.Get(url + "/golang.org/toolchain/@v/" + tc.Module + ".zip")
		if err != nil {
			t.Fatal(err)
		}
		var zipData bytes.Buffer
		zipData.ReadFrom(resp.Body)
		resp.Body.Close()
		dir := t.TempDir()
		v := filepath.Join(dir, "golang.org", "toolchain", "@v")
		os.MkdirAll(v, 0o755)
		os.WriteFile(filepath.Join(v, tc.Module+".zip"), zipData.Bytes(), 0o644)
		t.Setenv("GOPROXY", "file://"+dir)
		good := tc
		good.SHA256 = sum
		got, err := FetchToolchain(context.Background(), good, t.TempDir(), os.Getenv("GOPROXY"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(got, "bin", "go")); err != nil {
			t.Error(err)
		}
	})
	t.Run("unreachable proxy", func(t *testing.T) {
		t.Setenv("GOPROXY", "http://127.0.0.1:1")
		bad := tc
		bad.SHA256 = sum
		_, err := FetchToolchain(context.Background(), bad, t.TempDir(), os.Getenv("GOPROXY"))
		if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Errorf("error does not name the proxy: %v", err)
		}
	})
}

// The archive is the same bytes from any unpacked copy (its digest keys
// every Go step, on every machine), and leaves out what no build needs.
func TestToolchainTarIsTheSameFromAnyCopyAndLeavesOutTests(t *testing.T) {
	write := func(dir string, mtime time.Time) {
		files := map[string]string{"bin/go": "#!go", "src/fmt/print.go": "package fmt", "src/fmt/print_test.go": "package fmt",
			"src/cmd/compile/main.go": "package main", "src/net/testdata/x": "x", "test/a.go": "package a", "pkg/tool/linux_amd64/compile": "elf", "pkg/tool/linux_amd64/vet": "elf",
			"pkg/tool/linux_amd64/cgo": "elf", "bin/gofmt": "elf", "src/runtime/race/race.go": "package race", "src/runtime/race/race_linux_arm64.syso": "obj",
			"src/runtime/race/internal/amd64v1/race_linux.syso": "obj", "src/runtime/race/internal/amd64v1/race_darwin.syso": "obj", "src/runtime/race/race_darwin_arm64.syso": "obj"}
		for name, data := range files {
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			mode := os.FileMode(0o644)
			if strings.HasPrefix(name, "bin/") || strings.HasPrefix(name, "pkg/tool/") {
				mode = 0o755
			}
			if err := os.WriteFile(path, []byte(data), mode); err != nil {
				t.Fatal(err)
			}
			os.Chtimes(path, mtime, mtime)
		}
	}
	a, b := t.TempDir(), t.TempDir()
	write(a, time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))
	write(b, time.Now())
	tarA, tarB := filepath.Join(t.TempDir(), "a.tar"), filepath.Join(t.TempDir(), "b.tar")
	if err := writeToolchainTar(a, tarA); err != nil {
		t.Fatal(err)
	}
	if err := writeToolchainTar(b, tarB); err != nil {
		t.Fatal(err)
	}
	dataA, _ := os.ReadFile(tarA)
	dataB, _ := os.ReadFile(tarB)
	if !bytes.Equal(dataA, dataB) {
		t.Error("two copies of one toolchain archive to different bytes")
	}
	got := map[string]int64{}
	tr := tar.NewReader(bytes.NewReader(dataA))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		got[h.Name] = h.Mode
	}
	want := map[string]int64{"bin/": 0o755, "bin/go": 0o755, "pkg/": 0o755, "pkg/tool/": 0o755, "pkg/tool/linux_amd64/": 0o755, "pkg/tool/linux_amd64/compile": 0o755,
		"src/": 0o755, "src/fmt/": 0o755, "src/fmt/print.go": 0o644, "src/net/": 0o755,
		// -race needs cgo but on macOS, and kiln builds without it.
		"src/runtime/": 0o755, "src/runtime/race/": 0o755, "src/runtime/race/race.go": 0o644, "src/runtime/race/race_darwin_arm64.syso": 0o644,
		"src/runtime/race/internal/": 0o755, "src/runtime/race/internal/amd64v1/": 0o755, "src/runtime/race/internal/amd64v1/race_darwin.syso": 0o644}
	if !maps.Equal(got, want) {
		t.Errorf("archive holds %v, want %v", got, want)
	}
}
