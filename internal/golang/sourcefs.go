package golang

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tonistiigi/fsutil"
)

// listedFS is a local source that holds exactly the listed files of a
// directory and the folders above them. fsutil would walk the whole tree
// and match every path against the include patterns: on a vendored tree
// that is thousands of entries and patterns go never reads. This walks
// the list, in the order fsutil's receiver expects (each folder's entries
// sorted by name), and the daemon can open nothing else.
type listedFS struct {
	root  string
	files []string // slash-separated, sorted as WalkOrder sorts them
	open  map[string]bool
}

// Root is the folder the listed files lie under.
func (l *listedFS) Root() string { return l.root }

// newListedFS lists files (slash-separated, relative to root) for a local
// source.
func newListedFS(root string, files []string) *listedFS {
	l := &listedFS{root: root, files: slices.Clone(files), open: map[string]bool{}}
	slices.SortFunc(l.files, WalkOrder)
	l.files = slices.Compact(l.files)
	for _, f := range l.files {
		l.open[filepath.FromSlash(f)] = true
	}
	return l
}

// WalkOrder sorts paths as a walk of the tree visits them: by folder, then
// by name, so "a/b" comes before "a-c" although '-' sorts before '/'.
// It compares in place: the sources are sorted on every solve.
func WalkOrder(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] == b[i] {
			continue
		}
		switch {
		case a[i] == '/':
			return -1
		case b[i] == '/':
			return 1
		case a[i] < b[i]:
			return -1
		default:
			return 1
		}
	}
	return len(a) - len(b)
}

// Walk calls fn for each listed file and each folder above one, folders
// first, with the stat fsutil would send. A listed file that is gone is
// left out, as a walk would not find it; a folder that is not a folder (a
// symbolic link) is sent as what it is, without what was listed below it.
func (l *listedFS) Walk(ctx context.Context, target string, fn fs.WalkDirFunc) error {
	prefix := strings.Trim(filepath.ToSlash(filepath.Clean(target)), "/")
	if prefix == "." {
		prefix = ""
	}
	sent := map[string]bool{} // folders sent (or above the target)
	// Folders whose contents are not sent: fn skipped them, they are not
	// folders, or fn skipped the rest of their entries.
	skip := map[string]bool{}
	skipped := func(p string) bool {
		for d := p; d != "."; {
			if d = path.Dir(d); skip[d] {
				return true
			}
		}
		return false
	}
	// visit sends one entry and reports whether it is a folder whose
	// contents follow.
	visit := func(rel string) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		st, err := fsutil.Stat(filepath.Join(l.root, filepath.FromSlash(rel)))
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		st.Path = filepath.FromSlash(rel)
		isDir := os.FileMode(st.Mode).IsDir()
		switch err := fn(st.Path, &fsutil.DirEntryInfo{Stat: st}, nil); {
		case errors.Is(err, filepath.SkipDir) && isDir:
			return false, nil
		case errors.Is(err, filepath.SkipDir):
			skip[path.Dir(rel)] = true
			return false, nil
		case err != nil:
			return false, err
		}
		return isDir, nil
	}
	stop := func(err error) error {
		if errors.Is(err, filepath.SkipAll) {
			return nil
		}
		return err
	}
	for _, f := range l.files {
		if prefix != "" && f != prefix && !strings.HasPrefix(f, prefix+"/") || skipped(f) {
			continue
		}
		blocked := false
		for i := strings.IndexByte(f, '/'); i >= 0 && !blocked; {
			dir := f[:i]
			if !sent[dir] {
				sent[dir] = true
				if len(dir) >= len(prefix) {
					open, err := visit(dir)
					if err != nil {
						return stop(err)
					}
					if !open {
						skip[dir], blocked = true, true
					}
				}
			}
			next := strings.IndexByte(f[i+1:], '/')
			if next < 0 {
				break
			}
			i += 1 + next
		}
		if blocked || skipped(f) {
			continue
		}
		if _, err := visit(f); err != nil {
			return stop(err)
		}
	}
	return nil
}

// Open opens a listed file; the daemon asks for nothing else.
func (l *listedFS) Open(p string) (io.ReadCloser, error) {
	p = filepath.Clean(strings.TrimPrefix(p, string(filepath.Separator)))
	if !l.open[p] {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return os.Open(filepath.Join(l.root, p))
}
