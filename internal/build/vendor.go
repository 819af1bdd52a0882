package build

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/moby/patternmatcher"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/plan"
)

// vendorFiles are the files of vendor/ that any of the plan's binaries
// reads, .dockerignore applied as to every local source, in walk order.
func vendorFiles(p *plan.Plan, excludes []string) ([]string, error) {
	pm, err := patternmatcher.New(append(slices.Clone(golang.ContextExcludes), excludes...))
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	seen := map[string]bool{}
	var files []string
	for _, b := range p.Binaries {
		for _, f := range b.Files {
			if !strings.HasPrefix(f, golang.VendorDir+"/") || seen[f] {
				continue
			}
			seen[f] = true
			if skip, err := pm.MatchesOrParentMatches(f); err != nil {
				return nil, err
			} else if !skip {
				files = append(files, f)
			}
		}
	}
	slices.SortFunc(files, golang.WalkOrder)
	return files, nil
}

// vendorArchive returns the folder of golang.VendorTar: the plan's vendored
// files as one tar, below vendor/, with fixed owners, modes and times, so
// that the same files give the same bytes (and cache keys) on every
// machine. It is written again only when the stat of a file in it changed
// (size, modification and change time, inode: a file rewritten with the
// same size and time still has a new change time), the comparison
// BuildKit's own file sync makes. A file changed while it was read is
// archived again; one that is gone is left out, as the sync would.
func vendorArchive(ctx context.Context, root string, files []string, cache string) (string, error) {
	dir := filepath.Join(cache, "vendor", hex.EncodeToString(sha256Of(root))[:16])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := buildkit.LockFile(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	stampFile, tarFile := filepath.Join(dir, "stamp"), filepath.Join(dir, golang.VendorTar)
	stamp, err := vendorStamp(root, files)
	if err != nil {
		return "", err
	}
	if old, err := os.ReadFile(stampFile); err == nil && string(old) == stamp {
		if _, err := os.Stat(tarFile); err == nil {
			return dir, nil
		}
	}
	// The stamp goes first: an archive renamed in without one is never
	// taken for the files of an older stamp.
	if err := os.Remove(stampFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	start := time.Now()
	stamp, racy, err := writeVendorTar(root, files, dir, start)
	if err != nil {
		return "", fmt.Errorf("archive %s for BuildKit: %w", filepath.Join(root, golang.VendorDir), err)
	}
	if err := os.WriteFile(filepath.Join(dir, "root"), []byte(root), 0o644); err != nil {
		return "", err
	}
	// A file changed within a second of the archive could change again
	// with the same stat: the next build archives again.
	if !racy {
		if err := os.WriteFile(stampFile, []byte(stamp), 0o644); err != nil {
			return "", err
		}
	}
	log.G(ctx).Infof("archived %d vendored files for BuildKit in %s (again after any change to them)", len(files), time.Since(start).Round(time.Millisecond))
	removeOrphanedVendorArchives(filepath.Dir(dir))
	return dir, nil
}

func sha256Of(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// vendorStamp is a digest of the list of files and each one's stat.
func vendorStamp(root string, files []string) (string, error) {
	h := sha256.New()
	for _, f := range files {
		fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		stampEntry(h, f, fi)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// stampEntry adds a file's name and stat (nil: missing) to a stamp.
func stampEntry(h hash.Hash, name string, fi os.FileInfo) {
	h.Write([]byte(name))
	h.Write([]byte{0})
	if fi == nil {
		h.Write([]byte("missing\x00"))
		return
	}
	ctime, ino, _ := changeTime(fi)
	var b [40]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(fi.Mode()))
	binary.LittleEndian.PutUint64(b[8:], uint64(fi.Size()))
	binary.LittleEndian.PutUint64(b[16:], uint64(fi.ModTime().UnixNano()))
	binary.LittleEndian.PutUint64(b[24:], uint64(ctime))
	binary.LittleEndian.PutUint64(b[32:], ino)
	h.Write(b[:])
}

// writeVendorTar writes the archive of files into dir and returns the stamp
// of the stats it archived, each taken before its file was read, and
// whether a file changed less than a second before start: file times
// move in ticks, so a second change within one can keep the stat.
func writeVendorTar(root string, files []string, dir string, start time.Time) (stamp string, racy bool, err error) {
	tmp, err := os.CreateTemp(dir, ".tmp-*.tar")
	if err != nil {
		return "", false, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	tw := tar.NewWriter(tmp)
	dirs := map[string]bool{}
	header := func(hdr *tar.Header) error {
		hdr.ModTime, hdr.Format = time.Unix(0, 0), tar.FormatPAX
		return tw.WriteHeader(hdr)
	}
	for _, f := range files {
		rel, ok := strings.CutPrefix(f, golang.VendorDir+"/")
		if !ok || !fs.ValidPath(rel) {
			return "", false, fmt.Errorf("%s is not a file below %s", f, golang.VendorDir)
		}
		// The folders above it, once each: walk order puts them first.
		for i := 0; i < len(rel); i++ {
			if rel[i] == '/' && !dirs[rel[:i]] {
				dirs[rel[:i]] = true
				if err := header(&tar.Header{Typeflag: tar.TypeDir, Name: rel[:i] + "/", Mode: 0o755}); err != nil {
					return "", false, err
				}
			}
		}
		name := filepath.Join(root, filepath.FromSlash(f))
		fi, err := os.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			stampEntry(h, f, nil)
			continue
		} else if err != nil {
			return "", false, err
		}
		stampEntry(h, f, fi)
		ctime, _, known := changeTime(fi)
		if !known || fi.ModTime().After(start.Add(-time.Second)) || ctime > start.Add(-time.Second).UnixNano() {
			racy = true
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(name)
			if err != nil {
				return "", false, err
			}
			if err := header(&tar.Header{Typeflag: tar.TypeSymlink, Name: rel, Linkname: target, Mode: 0o777}); err != nil {
				return "", false, err
			}
		case fi.Mode().IsRegular():
			if err := header(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Size: fi.Size(), Mode: 0o644}); err != nil {
				return "", false, err
			}
			if err := copyFileInto(tw, name, fi.Size()); err != nil {
				return "", false, fmt.Errorf("%s: %w", f, err)
			}
		default:
			return "", false, fmt.Errorf("%s is a %s, not a file go reads", f, fi.Mode().Type())
		}
	}
	if err := tw.Close(); err != nil {
		return "", false, err
	}
	if err := tmp.Close(); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, golang.VendorTar)); err != nil {
		return "", false, err
	}
	return hex.EncodeToString(h.Sum(nil)), racy, nil
}

// copyFileInto copies exactly size bytes of a file, or fails: a file that
// shrank under the read would leave the archive short.
func copyFileInto(w io.Writer, name string, size int64) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if n, err := io.CopyN(w, f, size); err != nil {
		return fmt.Errorf("changed while archived (%d of %d bytes read): %w", n, size, err)
	}
	return nil
}

// removeOrphanedVendorArchives removes the archives of repositories that
// are gone (a benchmark's copies, deleted checkouts).
func removeOrphanedVendorArchives(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		dir := filepath.Join(parent, e.Name())
		root, err := os.ReadFile(filepath.Join(dir, "root"))
		if err != nil {
			continue // being written, or not an archive
		}
		if _, err := os.Stat(filepath.Join(string(root), golang.VendorDir)); errors.Is(err, fs.ErrNotExist) {
			os.RemoveAll(dir)
		}
	}
}
