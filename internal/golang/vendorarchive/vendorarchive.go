// Package vendorarchive owns the vendor archive: a repository's vendor/
// folder as one tar with fixed owners, modes and times, kept under kiln's
// cache folder with a record of the stats it was made from, and served to
// BuildKit as the local source golang.LocalVendor.
package vendorarchive

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
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/tonistiigi/fsutil"
	"github.com/tonistiigi/fsutil/types"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// Source is the local source golang.LocalVendor: the folder of a
// vendor archive, made when BuildKit first asks for it. By then the build
// has read the files for its record of inputs, so a file that changes in
// between makes that record older than what was built, and the next build
// builds again; the other way round, it would keep a stale build.
type Source struct {
	root  string
	files []string
	cache string
	began *uptodate.Clock // the session's, set once it starts

	once sync.Once
	err  error
	// racy is set when a file changed so recently that its stat may hide
	// a change during the build (say, an edit and its revert after the
	// build read its inputs): the build's outputs are not recorded as
	// up to date, so the next build asks BuildKit again.
	racy bool
	// file is the archive, open: a later removal of its folder (by another
	// kiln's clean-up) cannot take it from this session's solves.
	file *os.File
	stat *types.Stat
}

// New is the vendor archive of files (below vendor/ of root), kept under
// cache and made when BuildKit first asks for it; began is the session's
// clock, read then.
func New(root string, files []string, cache string, began *uptodate.Clock) *Source {
	return &Source{root: root, files: files, cache: cache, began: began}
}

func (v *Source) ready(ctx context.Context) error {
	v.once.Do(func() {
		for attempt := 0; ; attempt++ {
			var dir string
			if dir, v.racy, v.err = vendorArchive(ctx, v.root, v.files, v.cache, *v.began); v.err != nil {
				return
			}
			path := filepath.Join(dir, golang.VendorTar)
			if v.file, v.err = os.Open(path); v.err == nil {
				if v.stat, v.err = fsutil.Stat(path); v.err == nil {
					v.stat.Path = golang.VendorTar
					return
				}
				v.file.Close()
			}
			// Removed between the record's read and the open: archive again.
			if !errors.Is(v.err, fs.ErrNotExist) || attempt == 1 {
				return
			}
		}
	})
	return v.err
}

// Walk sends the archive, the one file of the source.
func (v *Source) Walk(ctx context.Context, target string, fn fs.WalkDirFunc) error {
	if err := v.ready(ctx); err != nil {
		return err
	}
	if t := strings.Trim(filepath.ToSlash(filepath.Clean(target)), "/"); t != "" && t != "." && t != golang.VendorTar {
		return nil
	}
	if err := fn(golang.VendorTar, &fsutil.DirEntryInfo{Stat: v.stat}, nil); err != nil && !errors.Is(err, filepath.SkipDir) && !errors.Is(err, filepath.SkipAll) {
		return err
	}
	return nil
}

func (v *Source) Open(p string) (io.ReadCloser, error) {
	if err := v.ready(context.Background()); err != nil {
		return nil, err
	}
	if strings.Trim(filepath.ToSlash(filepath.Clean(p)), "/") != golang.VendorTar {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return io.NopCloser(io.NewSectionReader(v.file, 0, v.stat.Size)), nil
}

// ChangedLately says whether the archive holds a file changed too recently
// for its outputs to be recorded as up to date (see racy).
func (v *Source) ChangedLately() bool { return v != nil && v.err == nil && v.racy }

// Close closes the archive, if it was opened.
func (v *Source) Close() {
	if v.file != nil {
		v.file.Close()
	}
}

// vendorFormat names the archive's layout: a change to it must not reuse
// an archive written before.
const vendorFormat = "kiln vendor archive 3\n"

// vendorGrace is how long an archive no record names, or a partial one,
// is left for a build that may still be sending it; a variable for tests.
var vendorGrace = 10 * time.Minute

// vendorRecordLife is how long the record of a set of files that no build
// used is kept (and its archive with it).
const vendorRecordLife = 14 * 24 * time.Hour

// vendorArchive returns a folder holding golang.VendorTar: files (below
// vendor/) as one tar with fixed owners, modes and times, so that the same
// files are the same bytes, and cache keys, on every machine. Archives are
// never changed once written: each lies in a folder named by its digest,
// and a record per repository and set of files names the one made from
// files that stat as they do now (name, size, modification and change time,
// inode: a rewrite that keeps size and time still has a new change time).
// A stat changed less than uptodate.RacyWindow before the build began is not
// recorded, since a second change within the file system's clock tick
// could keep it; the next build archives again.
func vendorArchive(ctx context.Context, root string, files []string, cache string, began uptodate.Clock) (dir string, racy bool, err error) {
	base := filepath.Join(cache, "vendor", shortDigest(root))
	record := filepath.Join(base, "set-"+shortDigest(strings.Join(files, "\x00")))
	stamps := newVendorStamp()
	if err = eachVendorEntry(root, files, stamps.add, nil); err != nil {
		return "", false, fmt.Errorf("read %s: %w", filepath.Join(root, golang.VendorDir), err)
	}
	stamp := stamps.sum()
	if data, err := os.ReadFile(record); err == nil {
		if was, archive, ok := strings.Cut(string(data), " "); ok && was == stamp && fs.ValidPath(archive) {
			dir = filepath.Join(base, archive)
			if _, err := os.Stat(filepath.Join(dir, golang.VendorTar)); err == nil {
				// Used now: the clean-up goes by these times.
				now := time.Now()
				os.Chtimes(dir, now, now)
				os.Chtimes(record, now, now)
				return dir, false, nil
			}
		}
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", false, err
	}
	if _, err := os.Stat(filepath.Join(base, "root")); err != nil {
		if err := atomicfile.Write(filepath.Join(base, "root"), func(w io.Writer) error {
			_, err := io.WriteString(w, root)
			return err
		}); err != nil {
			return "", false, err
		}
	}
	start := time.Now()
	at := start
	if began.OK {
		at = began.At
	}
	tmp, err := os.MkdirTemp(base, ".tmp-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp)
	archived, sum, racy, err := writeVendorTar(root, files, filepath.Join(tmp, golang.VendorTar), at.Add(-uptodate.RacyWindow))
	if err != nil {
		return "", false, fmt.Errorf("archive %s for BuildKit: %w", filepath.Join(root, golang.VendorDir), err)
	}
	dir = filepath.Join(base, sum)
	if err := os.Rename(tmp, dir); err != nil {
		// The same archive is there already.
		if _, statErr := os.Stat(filepath.Join(dir, golang.VendorTar)); statErr != nil {
			return "", false, err
		}
		os.Chtimes(dir, start, start)
	}
	if !racy {
		if err := atomicfile.Write(record, func(w io.Writer) error {
			_, err := io.WriteString(w, archived+" "+sum)
			return err
		}); err != nil {
			return "", false, err
		}
	}
	log.G(ctx).Debugf("archived %d vendored files for BuildKit in %s", len(files), time.Since(start).Round(time.Millisecond))
	removeUnusedVendorArchives(filepath.Dir(base), base, dir)
	return dir, racy, nil
}

func shortDigest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// vendorEntry is a folder or file of the archive, in the order written.
type vendorEntry struct {
	name string      // below vendor/; a folder's ends in "/"
	path string      // on this machine
	fi   os.FileInfo // nil when missing
	link string      // a symbolic link's target
}

// eachVendorEntry calls file, then stamp when set, with each listed file
// and, first, each folder above it, once. A folder that is a link is given
// as the link, without what is below it, as the listed sources send it.
func eachVendorEntry(root string, files []string, stamp, file func(vendorEntry) error) error {
	folders := map[string]bool{} // given; true when nothing below follows
	call := func(e vendorEntry) error {
		if file != nil {
			if err := file(e); err != nil {
				return err
			}
		}
		return stamp(e)
	}
	lstat := func(name, rel string) (vendorEntry, error) {
		e := vendorEntry{name: name, path: filepath.Join(root, golang.VendorDir, filepath.FromSlash(strings.TrimSuffix(rel, "/")))}
		fi, err := os.Lstat(e.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return e, nil
		case err != nil:
			return e, err
		case fi.Mode()&fs.ModeSymlink != 0:
			e.link, err = os.Readlink(e.path)
		}
		e.fi = fi
		return e, err
	}
	for _, name := range files {
		rel, ok := strings.CutPrefix(name, golang.VendorDir+"/")
		if !ok || !fs.ValidPath(rel) {
			return fmt.Errorf("%s is not a file below %s", name, golang.VendorDir)
		}
		below := true
		for i := 0; i < len(rel) && below; i++ {
			if rel[i] != '/' {
				continue
			}
			if stop, seen := folders[rel[:i]]; seen {
				below = !stop
				continue
			}
			e, err := lstat(rel[:i]+"/", rel[:i])
			if err != nil {
				return err
			}
			if e.fi != nil && !e.fi.IsDir() && e.link == "" {
				return fmt.Errorf("%s/%s is a file, yet %s is listed below it", golang.VendorDir, rel[:i], name)
			}
			below = e.fi != nil && e.link == ""
			folders[rel[:i]] = !below
			if err := call(e); err != nil {
				return err
			}
		}
		if !below {
			continue
		}
		e, err := lstat(rel, rel)
		if err != nil {
			return err
		}
		if err := call(e); err != nil {
			return err
		}
	}
	return nil
}

// vendorStamp is a digest of every entry's name and stat (a folder's kind
// and link alone: its times change with any file in it).
type vendorStamp struct{ h hash.Hash }

func newVendorStamp() *vendorStamp {
	v := &vendorStamp{h: sha256.New()}
	io.WriteString(v.h, vendorFormat)
	return v
}

func (v *vendorStamp) add(e vendorEntry) error {
	io.WriteString(v.h, e.name+"\x00"+e.link+"\x00")
	switch {
	case e.fi == nil:
		io.WriteString(v.h, "missing")
	case strings.HasSuffix(e.name, "/"):
		fmt.Fprint(v.h, uint32(e.fi.Mode().Type()))
	default:
		fmt.Fprintf(v.h, "%+v", statForStamp(e.fi))
	}
	v.h.Write([]byte{0})
	return nil
}

func (v *vendorStamp) sum() string { return hex.EncodeToString(v.h.Sum(nil)) }

// vendorStat is what the stamp keeps of a file: its mode and uptodate.Stat.
type vendorStat struct {
	Mode fs.FileMode
	uptodate.Stat
}

func statForStamp(fi os.FileInfo) vendorStat {
	st, _ := uptodate.StatOf(fi)
	return vendorStat{fi.Mode(), st}
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
	write := func(e vendorEntry) error {
		hdr := &tar.Header{Name: e.name, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case e.fi == nil:
			return nil
		case e.link != "":
			hdr.Name, hdr.Typeflag, hdr.Linkname, hdr.Mode = strings.TrimSuffix(e.name, "/"), tar.TypeSymlink, e.link, 0o777
		case e.fi.IsDir():
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		case e.fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, e.fi.Size()
		default:
			return fmt.Errorf("%s/%s is a %s; go reads only files there: remove it and run `go mod vendor`", golang.VendorDir, e.name, kindOf(e.fi.Mode()))
		}
		if st, known := uptodate.StatOf(e.fi); !known || st.Change > trusted.UnixNano() {
			racy = true
		}
		if err := tw.WriteHeader(hdr); err != nil || hdr.Typeflag != tar.TypeReg {
			return err
		}
		return copyUnchanged(tw, e.path, e.fi)
	}
	stamps := newVendorStamp()
	if err := eachVendorEntry(root, files, stamps.add, write); err != nil {
		return "", "", false, err
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
	// taken from the content differs between any two archives. Before 2038,
	// which some file systems cannot store.
	mtime := time.Unix(1<<30+int64(binary.BigEndian.Uint32(d[:4])>>3), int64(binary.BigEndian.Uint32(d[4:8])%1e9))
	if err := os.Chtimes(dest, mtime, mtime); err != nil {
		return "", "", false, err
	}
	return stamps.sum(), hex.EncodeToString(d), racy, nil
}

func kindOf(m fs.FileMode) string {
	switch {
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
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	after, statErr := f.Stat()
	if err != nil || statErr != nil || statForStamp(after) != statForStamp(fi) {
		return fmt.Errorf("%s changed while kiln archived it: run the build again", path)
	}
	return nil
}

// removeUnusedVendorArchives removes the records of base no build used for
// vendorRecordLife; past vendorGrace, the archives no record names and
// partial ones; and the folders of repositories that are gone (a
// benchmark's copies, deleted checkouts).
func removeUnusedVendorArchives(parent, base, keep string) {
	unused := func(path string, life time.Duration) bool {
		fi, err := os.Stat(path)
		return err == nil && time.Since(fi.ModTime()) > life
	}
	named := map[string]bool{keep: true}
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		record := filepath.Join(base, e.Name())
		if !strings.HasPrefix(e.Name(), "set-") {
			continue
		}
		if unused(record, vendorRecordLife) {
			os.Remove(record)
		} else if data, err := os.ReadFile(record); err == nil {
			if _, archive, ok := strings.Cut(string(data), " "); ok {
				named[filepath.Join(base, archive)] = true
			}
		}
	}
	for _, e := range entries {
		path := filepath.Join(base, e.Name())
		if e.IsDir() && !named[path] && unused(path, vendorGrace) {
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
