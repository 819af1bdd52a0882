package build

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/explain"
)

// An output is up to date when the inputs that made it are the inputs of
// this build and the files it wrote are still the ones it wrote. Builds are
// reproducible (tests prove it), so the same inputs would write the same
// bytes: kiln then skips the solve and the export, as Bazel skips an action
// whose key it has seen. The key holds every input explain tracks (each
// file the go command reads, the toolchain pin, stamps, flags, modules, the
// LLB definitions, image.yaml and its files) and kiln's own executable, so a
// kiln upgrade rebuilds once.
const upToDateFile = "up-to-date.json"

// outputRecord is what one written output was made of.
type outputRecord struct {
	Key    string              `json:"key"`
	Files  map[string]fileStat `json:"files"`
	Digest string              `json:"digest,omitempty"`
}

// fileStat is how a written file looked right after kiln wrote it. The
// change time and inode catch a rewrite that kept the size and set the old
// modification time back.
type fileStat struct {
	Size       int64  `json:"size"`
	ModTime    int64  `json:"modTime"`
	ChangeTime int64  `json:"changeTime,omitempty"`
	Inode      uint64 `json:"inode,omitempty"`
}

func statFile(path string) (fileStat, bool) {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return fileStat{}, false
	}
	ctime, ino, _ := changeTime(fi)
	return fileStat{Size: fi.Size(), ModTime: fi.ModTime().UnixNano(), ChangeTime: ctime, Inode: ino}, true
}

// outputKey is the key of an output made from these steps' inputs.
func outputKey(kind, name string, inputs explain.Inputs, steps []string, extra ...string) (string, bool) {
	exe, ok := executableDigest()
	if !ok {
		return "", false
	}
	h := sha256.New()
	fmt.Fprintf(h, "kiln %s\n%s %s\n", exe, kind, name)
	for _, e := range extra {
		fmt.Fprintf(h, "%s\n", e)
	}
	for _, st := range steps {
		in, ok := inputs[st]
		if !ok {
			return "", false // an untracked step: always build
		}
		fmt.Fprintf(h, "step %s\n", st)
		for _, k := range slices.Sorted(maps.Keys(in)) {
			fmt.Fprintf(h, "\t%s=%s\n", k, in[k])
		}
	}
	return hex.EncodeToString(h.Sum(nil)), true
}

// executableDigest names kiln's executable by its content: the Go build ID
// the linker wrote into it (a hash of the rest), read from the ELF note
// without reading the file, else the digest of its bytes. Not its stat: go
// touches an up-to-date binary it was asked to build again, as mage does on
// every `go run mage.go`.
var executableDigest = sync.OnceValues(func() (string, bool) {
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
	sum, err := buildkit.FileSHA256(exe)
	return sum, err == nil
})

// upToDate is the record file of one output directory.
type upToDate struct {
	path    string
	records map[string]outputRecord
}

func readUpToDate(outDir string) *upToDate {
	u := &upToDate{path: filepath.Join(outDir, explainDir, upToDateFile), records: map[string]outputRecord{}}
	if r, err := readJSON[map[string]outputRecord](u.path, "record of written outputs"); err == nil && r != nil {
		u.records = *r
	}
	return u
}

// current returns the record of output name when key made it and its files
// are untouched.
func (u *upToDate) current(name, key string) (outputRecord, bool) {
	r, ok := u.records[name]
	if !ok || key == "" || r.Key != key || len(r.Files) == 0 {
		return outputRecord{}, false
	}
	for path, want := range r.Files {
		if got, ok := statFile(path); !ok || got != want {
			return outputRecord{}, false
		}
	}
	return r, true
}

// set records output name as made by key, and returns the record; with an
// empty key it forgets it.
func (u *upToDate) set(name, key, digest string, files []string) outputRecord {
	if key == "" {
		delete(u.records, name)
		return outputRecord{}
	}
	r := outputRecord{Key: key, Digest: digest, Files: map[string]fileStat{}}
	for _, f := range files {
		st, ok := statFile(f)
		if !ok {
			delete(u.records, name)
			return outputRecord{}
		}
		r.Files[f] = st
	}
	u.records[name] = r
	return r
}

func (u *upToDate) write() error {
	return buildkit.WriteAtomic(u.path, func(w io.Writer) error { return json.NewEncoder(w).Encode(u.records) })
}
