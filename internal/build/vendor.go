package build

import (
	"archive/tar"
	"bytes"
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
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/tonistiigi/fsutil"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/golang"
)

// vendorSource is the local source golang.LocalVendor: the folder of a
// vendor archive, made when BuildKit first asks for it. By then the build
// has read the files for its record of inputs, so a file that changes in
// between makes that record older than what was built, and the next build
// builds again; the other way round, it would keep a stale build.
type vendorSource struct {
	root  string
	files []string
	cache string
	began *noopStart // the session's, set once it starts

	once sync.Once
	fs   fsutil.FS
	err  error
}

func (v *vendorSource) ready(ctx context.Context) error {
	v.once.Do(func() {
		var dir string
		if dir, v.err = vendorArchive(ctx, v.root, v.files, v.cache, *v.began); v.err == nil {
			v.fs, v.err = fsutil.NewFS(dir)
		}
	})
	return v.err
}

func (v *vendorSource) Walk(ctx context.Context, target string, fn fs.WalkDirFunc) error {
	if err := v.ready(ctx); err != nil {
		return err
	}
	return v.fs.Walk(ctx, target, fn)
}

func (v *vendorSource) Open(p string) (io.ReadCloser, error) {
	if err := v.ready(context.Background()); err != nil {
		return nil, err
	}
	return v.fs.Open(p)
}

// vendorFormat names the archive's layout: a change to it must not reuse
// an archive written before.
const vendorFormat = "kiln vendor archive 1\n"

// vendorGrace is how long an archive no record names, or a partial one,
// is left for a build that may still be sending it; a variable for tests.
var vendorGrace = 10 * time.Minute

// vendorArchive returns a folder holding golang.VendorTar: files (below
// vendor/) as one tar with fixed owners, modes and times, so that the same
// files are the same bytes, and cache keys, on every machine. Archives are
// never changed once written: each lies in a folder named by its digest,
// and a record per repository and set of files names the one made from
// files that stat as they do now (name, size, modification and change time,
// inode: a rewrite that keeps size and time still has a new change time).
// A stat changed less than racyWindow before the build began is not
// recorded, since a second change within the file system's clock tick
// could keep it; the next build archives again.
func vendorArchive(ctx context.Context, root string, files []string, cache string, began noopStart) (string, error) {
	base := filepath.Join(cache, "vendor", shortDigest(root))
	record := filepath.Join(base, "set-"+shortDigest(strings.Join(files, "\x00")))
	stamp, err := vendorStamp(root, files)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", filepath.Join(root, golang.VendorDir), err)
	}
	if data, err := os.ReadFile(record); err == nil {
		if was, archive, ok := strings.Cut(string(data), " "); ok && was == stamp && fs.ValidPath(archive) {
			dir := filepath.Join(base, archive)
			if _, err := os.Stat(filepath.Join(dir, golang.VendorTar)); err == nil {
				return dir, nil
			}
		}
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(base, "root")); err != nil {
		if err := buildkit.WriteAtomic(filepath.Join(base, "root"), func(w io.Writer) error {
			_, err := io.WriteString(w, root)
			return err
		}); err != nil {
			return "", err
		}
	}
	start := time.Now()
	at := start
	if began.ok {
		at = began.at
	}
	tmp, err := os.MkdirTemp(base, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	archived, sum, racy, err := writeVendorTar(root, files, filepath.Join(tmp, golang.VendorTar), at.Add(-racyWindow))
	if err != nil {
		return "", fmt.Errorf("archive %s for BuildKit: %w", filepath.Join(root, golang.VendorDir), err)
	}
	dir := filepath.Join(base, sum)
	if err := os.Rename(tmp, dir); err != nil {
		// The same archive is there already.
		if _, statErr := os.Stat(filepath.Join(dir, golang.VendorTar)); statErr != nil {
			return "", err
		}
	}
	if !racy {
		if err := buildkit.WriteAtomic(record, func(w io.Writer) error {
			_, err := io.WriteString(w, archived+" "+sum)
			return err
		}); err != nil {
			return "", err
		}
	}
	log.G(ctx).Infof("archived %d vendored files for BuildKit in %s (again after any change to them)", len(files), time.Since(start).Round(time.Millisecond))
	removeUnusedVendorArchives(filepath.Dir(base), base, dir)
	return dir, nil
}

func shortDigest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// vendorStamp is a digest of the list of files and each one's stat.
func vendorStamp(root string, files []string) (string, error) {
	h := sha256.New()
	io.WriteString(h, vendorFormat)
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
	h.Write(statBytes(fi))
}

func statBytes(fi os.FileInfo) []byte {
	ctime, ino, _ := changeTime(fi)
	b := make([]byte, 40)
	binary.LittleEndian.PutUint64(b[0:], uint64(fi.Mode()))
	binary.LittleEndian.PutUint64(b[8:], uint64(fi.Size()))
	binary.LittleEndian.PutUint64(b[16:], uint64(fi.ModTime().UnixNano()))
	binary.LittleEndian.PutUint64(b[24:], uint64(ctime))
	binary.LittleEndian.PutUint64(b[32:], ino)
	return b
}

// writeVendorTar writes the archive of files to dest. It returns the stamp
// of the stats it archived, each taken before its file was read, the
// archive's digest, and whether a file changed after trusted (its stat may
// not show a second change).
func writeVendorTar(root string, files []string, dest string, trusted time.Time) (stamp, sum string, racy bool, err error) {
	f, err := os.Create(dest)
	if err != nil {
		return "", "", false, err
	}
	defer f.Close()
	digest := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(f, digest))
	stamps := sha256.New()
	io.WriteString(stamps, vendorFormat)
	header := func(hdr *tar.Header) error {
		hdr.ModTime, hdr.Format = time.Unix(0, 0), tar.FormatPAX
		return tw.WriteHeader(hdr)
	}
	folders := map[string]bool{} // written; true when a symbolic link
	for _, name := range files {
		rel, ok := strings.CutPrefix(name, golang.VendorDir+"/")
		if !ok || !fs.ValidPath(rel) {
			return "", "", false, fmt.Errorf("%s is not a file below %s", name, golang.VendorDir)
		}
		// The folders above it, once each (walk order puts them first). A
		// folder that is a link goes as the link, without what is below it,
		// as the listed sources send it.
		linked := false
		for i := 0; i < len(rel) && !linked; i++ {
			if rel[i] != '/' {
				continue
			}
			if link, seen := folders[rel[:i]]; seen {
				linked = link
				continue
			}
			fi, err := os.Lstat(filepath.Join(root, golang.VendorDir, filepath.FromSlash(rel[:i])))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					break // the file is missing too
				}
				return "", "", false, err
			}
			if linked = fi.Mode()&fs.ModeSymlink != 0; linked {
				err = linkHeader(header, root, rel[:i])
			} else if fi.IsDir() {
				err = header(&tar.Header{Typeflag: tar.TypeDir, Name: rel[:i] + "/", Mode: 0o755})
			} else {
				err = fmt.Errorf("%s/%s is a file, yet %s is listed below it", golang.VendorDir, rel[:i], name)
			}
			if err != nil {
				return "", "", false, err
			}
			folders[rel[:i]] = linked
		}
		path := filepath.Join(root, filepath.FromSlash(name))
		fi, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			stampEntry(stamps, name, nil)
			continue
		} else if err != nil {
			return "", "", false, err
		}
		stampEntry(stamps, name, fi)
		if ctime, _, known := changeTime(fi); !known || ctime > trusted.UnixNano() {
			racy = true
		}
		switch {
		case linked:
		case fi.Mode()&fs.ModeSymlink != 0:
			err = linkHeader(header, root, rel)
		case fi.Mode().IsRegular():
			if err = header(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Size: fi.Size(), Mode: 0o644}); err == nil {
				err = copyUnchanged(tw, path, fi)
			}
		default:
			err = fmt.Errorf("%s is a %s; go reads only files there: remove it and run `go mod vendor`", name, kindOf(fi.Mode()))
		}
		if err != nil {
			return "", "", false, err
		}
	}
	if err := tw.Close(); err != nil {
		return "", "", false, err
	}
	if err := f.Sync(); err != nil {
		return "", "", false, err
	}
	if err := f.Close(); err != nil {
		return "", "", false, err
	}
	d := digest.Sum(nil)
	// BuildKit resends a file whose size or modification time changed: one
	// taken from the content differs between any two archives.
	mtime := time.Unix(1<<30+int64(binary.BigEndian.Uint32(d[:4])), int64(binary.BigEndian.Uint32(d[4:8])%1e9))
	if err := os.Chtimes(dest, mtime, mtime); err != nil {
		return "", "", false, err
	}
	return hex.EncodeToString(stamps.Sum(nil)), hex.EncodeToString(d), racy, nil
}

func linkHeader(header func(*tar.Header) error, root, rel string) error {
	target, err := os.Readlink(filepath.Join(root, golang.VendorDir, filepath.FromSlash(rel)))
	if err != nil {
		return err
	}
	return header(&tar.Header{Typeflag: tar.TypeSymlink, Name: rel, Linkname: target, Mode: 0o777})
}

func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "folder"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// copyUnchanged copies a file whose stat was fi, and fails if it changed
// while it was read: the archive would hold a torn file.
func copyUnchanged(w io.Writer, path string, fi os.FileInfo) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(w, f, fi.Size())
	after, statErr := f.Stat()
	if err != nil || statErr != nil || !bytes.Equal(statBytes(after), statBytes(fi)) {
		return fmt.Errorf("%s changed while kiln archived it: run the build again", path)
	}
	return nil
}

// removeUnusedVendorArchives removes, past vendorGrace, the archives of
// base that no record names and partial ones, and the folders of
// repositories that are gone (a benchmark's copies, deleted checkouts).
func removeUnusedVendorArchives(parent, base, keep string) {
	old := func(path string) bool {
		fi, err := os.Stat(path)
		return err == nil && time.Since(fi.ModTime()) > vendorGrace
	}
	named := map[string]bool{keep: true}
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "set-") {
			if data, err := os.ReadFile(filepath.Join(base, e.Name())); err == nil {
				if _, archive, ok := strings.Cut(string(data), " "); ok {
					named[filepath.Join(base, archive)] = true
				}
			}
		}
	}
	for _, e := range entries {
		path := filepath.Join(base, e.Name())
		if e.IsDir() && !named[path] && old(path) {
			os.RemoveAll(path)
		}
	}
	roots, _ := os.ReadDir(parent)
	for _, e := range roots {
		dir := filepath.Join(parent, e.Name())
		root, err := os.ReadFile(filepath.Join(dir, "root"))
		if dir == base || err != nil || !filepath.IsAbs(string(root)) {
			continue
		}
		if _, err := os.Stat(string(root)); errors.Is(err, fs.ErrNotExist) {
			os.RemoveAll(dir)
		}
	}
}
