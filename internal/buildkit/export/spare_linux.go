package export

import (
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// An export keeps, beside its folder, the files it replaced: the next
// export of a file writes into its spare's pages, which are still in
// memory. A file written into new pages cost 3-5 ms per MB here (a virtual
// machine whose host takes back the pages the guest frees): 0.18 s of the
// 0.21-0.30 s that sending a 57 MB binary took, where overwriting the
// pages of a file in the page cache took 10-15 ms.

// spareDir is the folder of dest's spares. It holds files only, named by
// their path in dest with its slashes escaped, so that no path under it
// goes through a folder someone else made.
func spareDir(dest string) string {
	return filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".spare")
}

func spareName(rel string) string { return url.PathEscape(filepath.ToSlash(rel)) }

// keepSpares links each file the export replaces (its path in dest) to its
// spare, when nothing else links it: once the export is in, only the spare
// names it, so no one who reads the output sees the next export write into
// it. Spares of files the export no longer has are removed.
func keepSpares(dest string, replaced []string, files []FileCopy) {
	var kept []string
	for _, rel := range replaced {
		if fi, err := os.Lstat(filepath.Join(dest, rel)); err == nil && fi.Mode().IsRegular() && links(fi) == 1 {
			kept = append(kept, rel)
		}
	}
	dir, ok := spareFolder(dest, len(kept) > 0)
	if !ok {
		return
	}
	var names []string
	for _, f := range files {
		names = append(names, spareName(exportRel(f.Dest)))
	}
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			if !slices.Contains(names, e.Name()) {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	for _, rel := range kept {
		spare := filepath.Join(dir, spareName(exportRel(rel)))
		os.Remove(spare)
		os.Link(filepath.Join(dest, rel), spare)
	}
}

// spareFolder is dest's spare folder when it is a folder (not a link to
// one) of this user's that no one else may write to, made when create is
// set.
func spareFolder(dest string, create bool) (string, bool) {
	dir := spareDir(dest)
	if create {
		os.Mkdir(dir, 0o755)
	}
	fi, err := os.Lstat(dir)
	return dir, err == nil && fi.IsDir() && ours(fi) && fi.Mode().Perm()&0o022 == 0
}

// ours says whether this user owns the file: one another user planted (a
// root build in a shared folder) is never written into.
func ours(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}

// takeSpare moves the spare of rel (its path in dest) to path, which the
// caller created, and opens it to be written over, without truncating it
// (that would free its pages). It takes only a regular file that no other
// name links and that no process has open, maps or runs: a write lease is
// granted only then. A spare it cannot use is removed.
func takeSpare(dest, rel, path string) *os.File {
	dir, ok := spareFolder(dest, false)
	if !ok {
		return nil
	}
	spare := filepath.Join(dir, spareName(rel))
	fi, err := os.Lstat(spare)
	if err != nil {
		return nil
	}
	if !fi.Mode().IsRegular() || links(fi) != 1 || !ours(fi) || os.Rename(spare, path) != nil {
		os.Remove(spare)
		return nil
	}
	// O_NONBLOCK: should a fifo have taken the spare's place, the open
	// fails rather than waits.
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err == nil {
		if open, err := f.Stat(); err == nil && os.SameFile(open, fi) && links(open) == 1 && unusedElsewhere(f) {
			return f
		}
		f.Close()
	}
	os.Remove(path) // for the caller to create anew
	return nil
}

// unusedElsewhere says whether f is the only open file of its inode: the
// kernel grants a write lease only then (a running program or a mapping
// counts). The lease is given back at once: the spare is out of sight in
// the export's temporary folder by now.
func unusedElsewhere(f *os.File) bool {
	fd := int(f.Fd())
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		return false
	}
	unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	return true
}

// links is a file's number of hard links; 0 when it cannot be read.
func links(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}
