package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// copyModules fills the module cache dest with the modules mods
// (path@version) from the module cache src, without their zip files, which
// no compile reads: copying the extracted files costs a fraction of what
// unzipping every module again did (for BuildKit's 204 modules, 3 CPU-s
// with the hashing against 13). Each copy is hashed as go hashes a module
// (h1:) and must match the go.sum files of the working directory, so the
// copies are as verified as go's download of the zips was. A module src
// lacks, holds partly or holds otherwise than go.sum says (its cache mount
// was emptied, or written by another build) is downloaded by the go
// command goArgs instead, with those modules appended: go checks the zip.
func copyModules(src, dest string, mods, goArgs []string) error {
	sums, err := readGoSums(".")
	if err != nil {
		return err
	}
	const workers = 4 // the copies wait on the disk more than on a CPU
	var (
		mu      sync.Mutex
		missing []string
		failed  error
		wg      sync.WaitGroup
	)
	next := make(chan string)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for mod := range next {
				err := copyModule(src, dest, mod, sums[mod])
				mu.Lock()
				switch {
				case errors.Is(err, errUnusable):
					fmt.Printf("modules: %s: %v\n", mod, err)
					missing = append(missing, mod)
				case err != nil && failed == nil:
					failed = fmt.Errorf("copy %s: %w", mod, err)
				}
				mu.Unlock()
			}
		}()
	}
	for _, mod := range mods {
		next <- mod
	}
	close(next)
	wg.Wait()
	if failed != nil {
		return failed
	}
	fmt.Printf("modules: %d copied from the module cache and checked against go.sum, %d to download\n", len(mods)-len(missing), len(missing))
	if len(missing) == 0 {
		return nil
	}
	if len(goArgs) == 0 {
		return fmt.Errorf("no go command to download %s", strings.Join(missing, " "))
	}
	slices.Sort(missing)
	cmd := exec.Command(goArgs[0], append(goArgs[1:], missing...)...)
	cmd.Env = append(os.Environ(), "GOMODCACHE="+dest)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// readGoSums are the h1: hashes of module trees ("path@version" to hash)
// in the go.sum and go.work.sum files under dir.
func readGoSums(dir string) (map[string]string, error) {
	sums := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (d.Name() != "go.sum" && d.Name() != "go.work.sum") {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// "path version h1:hash"; the go.mod lines' versions end in /go.mod.
			fields := strings.Fields(sc.Text())
			if len(fields) == 3 && !strings.HasSuffix(fields[1], "/go.mod") {
				sums[fields[0]+"@"+fields[1]] = fields[2]
			}
		}
		return sc.Err()
	})
	return sums, err
}

// errUnusable says the source cache does not hold a module whole, or not
// as go.sum says.
var errUnusable = errors.New("unusable")

// copyModule copies one module's extracted directory and the files go
// checks it by (.mod, .info, .ziphash) from src to dest, and hashes the
// copy. It copies nothing unless go itself would take the module in src
// as downloaded: the directory and its .ziphash there, no .partial marker
// of an unzip that stopped half-way. A copy whose hash is not sum is
// removed again.
func copyModule(src, dest, mod, sum string) error {
	path, version, ok := strings.Cut(mod, "@")
	if !ok {
		return fmt.Errorf("not a module@version")
	}
	if !strings.HasPrefix(sum, "h1:") {
		return fmt.Errorf("%w: no h1: hash in go.sum", errUnusable)
	}
	dir := escapeModulePath(path) + "@" + escapeModulePath(version)
	meta := filepath.Join("cache", "download", escapeModulePath(path), "@v", escapeModulePath(version))
	for _, need := range []string{dir, meta + ".ziphash", meta + ".mod"} {
		if _, err := os.Stat(filepath.Join(src, need)); err != nil {
			return fmt.Errorf("%w: not in the module cache", errUnusable)
		}
	}
	if _, err := os.Stat(filepath.Join(src, meta+".partial")); err == nil {
		return fmt.Errorf("%w: partly extracted in the module cache", errUnusable)
	}
	hash, err := copyTree(filepath.Join(src, dir), filepath.Join(dest, dir), mod)
	if err != nil {
		return err
	}
	if hash != sum {
		if err := os.RemoveAll(filepath.Join(dest, dir)); err != nil {
			return err
		}
		return fmt.Errorf("%w: the module cache holds %s, go.sum says %s", errUnusable, hash, sum)
	}
	for _, ext := range []string{".mod", ".info", ".ziphash"} {
		from := filepath.Join(src, meta+ext)
		if _, err := os.Stat(from); ext == ".info" && errors.Is(err, fs.ErrNotExist) {
			continue // go build does not read it
		}
		if _, err := copyFile(from, filepath.Join(dest, meta+ext), nil); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies a module's directory, directories and regular files
// only, as a module zip holds, with the modes `go mod download
// -modcacherw` gives them (under the usual umask). It returns the copy's
// hash as go.sum writes it (golang.org/x/mod/sumdb/dirhash.Hash1, the
// files named prefix/path).
func copyTree(from, to, prefix string) (string, error) {
	var lines []string
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		target := filepath.Join(to, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			name := prefix + "/" + filepath.ToSlash(rel)
			if strings.Contains(name, "\n") {
				return fmt.Errorf("%s: a file name with a newline", path)
			}
			h := sha256.New()
			_, err := copyFile(path, target, h)
			lines = append(lines, fmt.Sprintf("%x  %s\n", h.Sum(nil), name))
			return err
		default:
			return fmt.Errorf("%s: neither a file nor a directory", path)
		}
	})
	if err != nil {
		return "", err
	}
	slices.SortFunc(lines, func(a, b string) int { return strings.Compare(a[66:], b[66:]) })
	h := sha256.New()
	for _, line := range lines {
		io.WriteString(h, line)
	}
	return "h1:" + base64.StdEncoding.EncodeToString(h.Sum(nil)), nil
}

// escapeModulePath is the module cache's case encoding (as
// golang.org/x/mod/module.EscapePath and EscapeVersion, for the valid
// paths and versions go list reports): an upper-case letter becomes '!'
// and the letter in lower case.
func escapeModulePath(s string) string {
	var b strings.Builder
	for _, r := range s {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
