// Package magerun is what kiln-mage and the targets it starts agree on: the
// variables kiln-mage sets for mage's run and the record the targets write
// when they start, which kiln-mage reads to start them without mage. It
// imports only the standard library, so building kiln-mage stays cheap.
package magerun

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
)

const (
	// StartedEnv names a file the targets remove when they start: until
	// then mage is still compiling them.
	StartedEnv = "KILN_MAGE_STARTED"
	// GoflagsEnv carries the user's GOFLAGS past mage, which runs with
	// -find added: "unset", or "=" and the value.
	GoflagsEnv = "KILN_MAGE_GOFLAGS"
	// StampEnv and FingerprintEnv ask the targets to record, in the file
	// StampEnv names, that they were built from the inputs FingerprintEnv
	// digests.
	StampEnv       = "KILN_MAGE_STAMP"
	FingerprintEnv = "KILN_MAGE_FINGERPRINT"
)

// Record names the targets binary that started, built from the inputs
// Fingerprint digests, and what its file was then.
type Record struct {
	Fingerprint string
	Exe         string
	Size        int64
	ModTime     int64
	File        string // device and inode
}

// Write records the running binary in stamp, whole or not at all, and only
// when the binary is in stamp's folder (mage's cache): the record only saves
// time, so a failure is silent.
func Write(stamp, fingerprint string) {
	exe, err := os.Executable()
	if err != nil {
		return
	}
	cache, err := filepath.EvalSymlinks(filepath.Dir(stamp))
	if err != nil || filepath.Dir(exe) != cache {
		return
	}
	info, err := os.Stat(exe)
	if err != nil {
		return
	}
	// Another checkout with the same magefiles builds to the same path: only
	// the binary that is running now is vouched for.
	if self, err := os.Stat("/proc/self/exe"); err == nil && !os.SameFile(self, info) {
		return
	}
	data, err := json.Marshal(Record{Fingerprint: fingerprint, Exe: exe, Size: info.Size(), ModTime: info.ModTime().UnixNano(), File: FileID(info)})
	if err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(stamp), filepath.Base(stamp)+".*")
	if err != nil {
		return
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil || tmp.Close() != nil {
		return
	}
	os.Rename(tmp.Name(), stamp)
}

// Matches says whether info is still the file the record names.
func (r Record) Matches(info fs.FileInfo) bool {
	return info.Size() == r.Size && info.ModTime().UnixNano() == r.ModTime && FileID(info) == r.File
}

// FileID is the file's device and inode, "" where the system gives none.
func FileID(info fs.FileInfo) string {
	dev, ok1 := StatField(info, "Dev")
	ino, ok2 := StatField(info, "Ino")
	if !ok1 || !ok2 {
		return ""
	}
	return fmt.Sprintf("%d:%d", dev, ino)
}

// StatField reads an integer of the system's stat structure by field name
// (its types differ between systems), false where there is none.
func StatField(info fs.FileInfo, names ...string) (int64, bool) {
	v := reflect.ValueOf(info.Sys())
	for _, name := range names {
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return 0, false
		}
		if v = v.FieldByName(name); !v.IsValid() {
			return 0, false
		}
	}
	switch {
	case v.CanInt():
		return v.Int(), true
	case v.CanUint():
		return int64(v.Uint()), true
	}
	return 0, false
}
