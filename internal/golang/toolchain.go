// Package golang owns the Go stages of the LLB graph: the pinned toolchain,
// the module download step, each platform's go build of the binaries and the
// per-binary steps that take them out of it.
package golang

import (
	"archive/tar"
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/moby/patternmatcher"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
)

const toolchainModulePath = "golang.org/toolchain"

// ToolchainDir is where FetchToolchain extracts the toolchain.
func ToolchainDir(tc plan.Toolchain, cacheDir string) string {
	return filepath.Join(cacheDir, "toolchain", tc.SHA256)
}

// ToolchainArchiveDir is where ToolchainArchive keeps the toolchain's tar.
func ToolchainArchiveDir(tc plan.Toolchain, cacheDir string) string {
	return filepath.Join(cacheDir, "toolchain", tc.SHA256+".archive"+toolchainArchiveFormat)
}

// FetchToolchain makes the pinned toolchain available as a directory under
// cacheDir and returns it. The archive comes from the first usable entry
// of goproxy (the host's GOPROXY, plan.Host) and must match the pinned sha256; a verified extraction is reused.
func FetchToolchain(ctx context.Context, tc plan.Toolchain, cacheDir, goproxy string) (string, error) {
	dir := ToolchainDir(tc, cacheDir)
	if _, err := os.Stat(filepath.Join(dir, "bin", "go")); err == nil {
		return dir, nil
	}
	proxy, err := moduleProxy(goproxy)
	if err != nil {
		return "", err
	}
	u := fmt.Sprintf("%s/%s/@v/%s.zip", strings.TrimSuffix(proxy, "/"), toolchainModulePath, tc.Module)
	log.G(ctx).Warnf("first run: downloading the Go %s toolchain (%s@%s, about 70 MiB)", tc.GoVersion, toolchainModulePath, tc.Module)

	if err := os.MkdirAll(filepath.Join(cacheDir, "toolchain"), 0o755); err != nil {
		return "", err
	}
	zipFile, err := os.CreateTemp(filepath.Join(cacheDir, "toolchain"), "download-*.zip")
	if err != nil {
		return "", err
	}
	defer os.Remove(zipFile.Name())
	defer zipFile.Close()

	sum, size, err := download(ctx, u, zipFile)
	if err != nil {
		return "", fmt.Errorf("download Go toolchain %s from GOPROXY %s: %w", tc.Module, plan.RedactURL(proxy), err)
	}
	if sum != tc.SHA256 {
		return "", fmt.Errorf("build/kiln.yaml: toolchain.sha256: the proxy %s serves %s@%s with sha256 %s, not the pinned %s; check toolchain.go and the pin",
			plan.RedactURL(proxy), toolchainModulePath, tc.Module, sum, tc.SHA256)
	}
	tmp, err := os.MkdirTemp(filepath.Join(cacheDir, "toolchain"), "extract-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	prefix := toolchainModulePath + "@" + tc.Module + "/"
	if err := extract(zipFile, size, prefix, tmp); err != nil {
		return "", fmt.Errorf("extract Go toolchain %s: %w", tc.Module, err)
	}
	if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
		if _, statErr := os.Stat(filepath.Join(dir, "bin", "go")); statErr != nil {
			return "", err
		}
	}
	return dir, nil
}

// moduleProxy returns the first http(s) or file:// entry of GOPROXY (as
// `go env GOPROXY` gives it).
func moduleProxy(goproxy string) (string, error) {
	for _, e := range plan.ProxyEntries(goproxy) {
		if entry := e.URL; strings.HasPrefix(entry, "https://") || strings.HasPrefix(entry, "http://") || strings.HasPrefix(entry, "file://") {
			return entry, nil
		}
	}
	return "", fmt.Errorf("GOPROXY=%q has no http(s) or file:// proxy to fetch the Go toolchain from; set GOPROXY to a module proxy", strings.TrimSpace(goproxy))
}

// Limits of a toolchain download. The archive is checked against the pin,
// so a bad proxy cannot change what runs, only waste disk and time.
const (
	maxToolchainZip     = 512 << 20
	toolchainDownloadIn = 20 * time.Minute
)

func download(ctx context.Context, u string, w io.Writer) (string, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, toolchainDownloadIn)
	defer cancel()
	w = &progressWriter{ctx: ctx, w: w, next: time.Now().Add(10 * time.Second)}
	if path, ok := strings.CutPrefix(u, "file://"); ok {
		// An air-gapped proxy directory.
		f, err := os.Open(path)
		if err != nil {
			return "", 0, err
		}
		defer f.Close()
		return copyHashed(w, f)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("%s", resp.Status)
	}
	return copyHashed(w, resp.Body)
}

func copyHashed(w io.Writer, r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(r, maxToolchainZip+1))
	if err != nil {
		return "", 0, err
	}
	if n > maxToolchainZip {
		return "", 0, fmt.Errorf("the archive is over %d MiB; a Go toolchain is about 70", maxToolchainZip>>20)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// progressWriter logs how much of a long download has arrived, every ten
// seconds, so a first run is never silent for long.
type progressWriter struct {
	ctx  context.Context
	w    io.Writer
	n    int64
	next time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if time.Now().After(p.next) {
		log.G(p.ctx).Warnf("downloading the Go toolchain: %s so far", config.FormatSize(p.n))
		p.next = time.Now().Add(10 * time.Second)
	}
	return n, err
}

// extract unpacks the module zip under dir, stripping the module prefix.
// Module zips carry no modes, so executables get theirs back here, the
// same way the go command does when it switches toolchains.
func extract(f *os.File, size int64, prefix, dir string) error {
	zr, err := zip.NewReader(f, size)
	if err != nil {
		return err
	}
	for _, zf := range zr.File {
		name, ok := strings.CutPrefix(zf.Name, prefix)
		if !ok || name == "" || strings.Contains(name, "..") {
			return fmt.Errorf("unexpected file %q in archive", zf.Name)
		}
		if strings.HasSuffix(name, "/") {
			continue
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "bin/") || strings.HasPrefix(name, "pkg/tool/") {
			mode = 0o755
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := writeZipFile(zf, dst, mode); err != nil {
			return err
		}
	}
	return nil
}

func writeZipFile(zf *zip.File, dst string, mode os.FileMode) error {
	r, err := zf.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	w, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// toolchainExcludes is what no build of a program needs: tests, docs, the
// sources of the go command and compiler (their binaries are prebuilt),
// the tools only go vet, go fix and go test -cover run, and, as kiln
// builds with CGO_ENABLED=0, the cgo tool and the race detector's objects
// for every system but macOS (the only one where -race needs no cgo), and
// gofmt. That is 120 of 240 MB (the tar: 102 MB against 117), which a
// fresh daemon does not have to receive and unpack.
var toolchainExcludes = []string{"test", "api", "doc", "misc", "**/testdata", "**/*_test.go", "src/cmd",
	"pkg/tool/*/fix", "pkg/tool/*/vet", "pkg/tool/*/cover", "pkg/tool/*/preprofile", "pkg/tool/*/cgo", "bin/gofmt",
	"src/runtime/race/**/*.syso", "!src/runtime/race/**/race_darwin*.syso"}

// toolchainArchiveFormat names what toolchainExcludes leaves out: an archive
// made with other excludes is other bytes, so it has another name.
const toolchainArchiveFormat = "2"

// ToolchainTar is the file of a toolchain archive directory.
const ToolchainTar = "go.tar"

// ToolchainArchive returns the directory holding the pinned toolchain as
// one tar file (ToolchainTar), which kiln sends as a local source and
// BuildKit unpacks once. A directory of 7,000 files took 0.16 s to compare
// on every build; one file's stat takes nothing. It is made once from
// FetchToolchain's directory, with fixed owners and times, so it is the
// same bytes on every machine: its digest keys every Go step.
func ToolchainArchive(ctx context.Context, tc plan.Toolchain, cacheDir, goproxy string) (string, error) {
	dir := ToolchainArchiveDir(tc, cacheDir)
	if _, err := os.Stat(filepath.Join(dir, ToolchainTar)); err == nil {
		return dir, nil
	}
	src, err := FetchToolchain(ctx, tc, cacheDir, goproxy)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Join(cacheDir, "toolchain"), "archive-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := writeToolchainTar(src, filepath.Join(tmp, ToolchainTar)); err != nil {
		return "", fmt.Errorf("archive the Go toolchain %s: %w", tc.Module, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another build made it first.
		if _, statErr := os.Stat(filepath.Join(dir, ToolchainTar)); statErr != nil {
			return "", err
		}
	}
	return dir, nil
}

func writeToolchainTar(src, dest string) error {
	excludes, err := patternmatcher.New(toolchainExcludes)
	if err != nil {
		return err
	}
	f, err := os.Create(dest)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == src {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if skip, err := excludes.MatchesOrParentMatches(rel); err != nil || skip {
			if skip && d.IsDir() {
				return filepath.SkipDir
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: rel, Mode: int64(info.Mode().Perm()), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case info.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
		case info.Mode()&fs.ModeSymlink != 0:
			if hdr.Linkname, err = os.Readlink(path); err != nil {
				return err
			}
			hdr.Typeflag = tar.TypeSymlink
		default:
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		file, err := os.Open(path)
		if err != nil {
			return err
		}
		defer file.Close()
		_, err = io.Copy(tw, file)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
