// Package uptodate owns the records kiln keeps to skip work it has done
// before, and the one way they read file stats: the up-to-date record of
// written outputs, the source digests explain reads, a file's stat (size,
// modification and change time, inode) and the racy window, the clock of
// the file system a build reads. Each record is a shortcut, never a source
// of truth: it may skip work only when what it checked is exactly what the
// build would read.
package uptodate

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"io"
	"os"
	"sync"
	"time"
)

// RacyWindow is how old an input must be when a build starts for its stat
// to be trusted: a change within the same clock tick could not be seen, as
// git treats "racily clean" entries. A variable so tests need not wait.
var RacyWindow = 2 * time.Second

// Stat is how a file or directory looked: its size, modification time
// and, where the system has them, its inode and change time, which no tool
// sets back (an archive extracted with its old times, a copy with
// `cp -p`).
type Stat struct {
	Size    int64  `json:"s"`
	ModTime int64  `json:"m"`
	Change  int64  `json:"c,omitempty"`
	Inode   uint64 `json:"i,omitempty"`
}

// StatPath is a path's Stat, size -1 when it does not exist; ok is false
// where the system tells no change time, so no record can be trusted.
func StatPath(path string) (Stat, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return Stat{Size: -1}, true
	}
	return StatOf(fi)
}

// StatOf is fi's Stat; ok as for StatPath.
func StatOf(fi os.FileInfo) (st Stat, ok bool) {
	st = Stat{Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}
	st.Change, st.Inode, ok = changeTime(fi)
	return st, ok
}

// StatFile is a regular file's Stat, false when it is none.
func StatFile(path string) (Stat, bool) {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return Stat{}, false
	}
	st, _ := StatOf(fi)
	return st, true
}

// Clock is when a build began, in the clock of the file system it reads
// (a network file system's may lag the host's); OK is false when it could
// not be told, and then nothing may be recorded.
type Clock struct {
	At time.Time
	OK bool
}

// statClock stats the clock's file (a test stands in a lagging clock).
var statClock = (*os.File).Stat

// FileSystemClock is now, by the clock of the file system dir is on when
// that is behind the host's: a file written where the outputs go tells
// it. A first build, which has no folder there yet, creates none (a failed
// build leaves nothing) and goes by the host's.
func FileSystemClock(dir string) Clock {
	at := time.Now()
	clock, err := os.CreateTemp(dir, ".no-op-clock-*")
	if err != nil {
		return Clock{At: at, OK: true}
	}
	fi, err := statClock(clock)
	clock.Close()
	os.Remove(clock.Name())
	if err != nil {
		return Clock{}
	}
	if fi.ModTime().Before(at) {
		at = fi.ModTime()
	}
	return Clock{At: at, OK: true}
}

// ExecutableDigest names kiln's executable by its content: the Go build ID
// the linker wrote into it (a hash of the rest), read from the ELF note
// without reading the file, else the digest of its bytes. Not its stat: go
// touches an up-to-date binary it was asked to build again, as mage does on
// every `go run mage.go`.
var ExecutableDigest = sync.OnceValues(func() (string, bool) {
	exe, err := os.Executable()
	if err != nil {
		return "", false
	}
	if f, err := elf.Open(exe); err == nil {
		defer f.Close()
		if note := f.Section(".note.go.buildid"); note != nil {
			if data, err := note.Data(); err == nil && bytes.Contains(data, []byte("/")) {
				return "go build ID " + string(data), true
			}
		}
	}
	sum, err := FileSHA256(exe)
	return sum, err == nil
})

// FileSHA256 is the hex sha256 of a file's content.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
