package targets

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
)

func init() { restoreMageEnv() }

// restoreMageEnv undoes what the zero-install entry point (mage.go) set for
// mage alone, before any go command or the no-op check reads the
// environment: it removes the marker file whose presence says that mage is
// still compiling the targets, puts back the user's GOFLAGS, which it gave
// mage with -find added (see mage.go), set or unset as they were, and
// records that this binary is the one built from the inputs mage.go
// fingerprinted, so that its next run can start it without mage.
func restoreMageEnv() {
	if marker := os.Getenv("KILN_MAGE_STARTED"); marker != "" {
		os.Remove(marker)
		os.Unsetenv("KILN_MAGE_STARTED")
	}
	if saved, ok := os.LookupEnv("KILN_MAGE_GOFLAGS"); ok {
		if goflags, set := strings.CutPrefix(saved, "="); set {
			os.Setenv("GOFLAGS", goflags)
		} else {
			os.Unsetenv("GOFLAGS")
		}
		os.Unsetenv("KILN_MAGE_GOFLAGS")
	}
	stamp, fingerprint := os.Getenv("KILN_MAGE_STAMP"), os.Getenv("KILN_MAGE_FINGERPRINT")
	os.Unsetenv("KILN_MAGE_STAMP")
	os.Unsetenv("KILN_MAGE_FINGERPRINT")
	if stamp != "" && fingerprint != "" {
		recordTargets(stamp, fingerprint)
	}
}

// targetsStamp is the record mage.go reads (its type of the same name).
type targetsStamp struct {
	Fingerprint string
	Exe         string
	Size        int64
	ModTime     int64
	File        string // device and inode
}

// recordTargets writes the stamp mage.go asked for, whole or not at all: it
// only saves time, so a failure is silent.
func recordTargets(stamp, fingerprint string) {
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
	data, err := json.Marshal(targetsStamp{Fingerprint: fingerprint, Exe: exe, Size: info.Size(), ModTime: info.ModTime().UnixNano(), File: fileID(info)})
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

// fileID is the file's device and inode as mage.go writes them, "" where
// the system gives none.
func fileID(info os.FileInfo) string {
	v := reflect.Indirect(reflect.ValueOf(info.Sys()))
	if v.Kind() != reflect.Struct {
		return ""
	}
	var id []string
	for _, f := range []reflect.Value{v.FieldByName("Dev"), v.FieldByName("Ino")} {
		switch {
		case f.CanInt():
			id = append(id, strconv.FormatInt(f.Int(), 10))
		case f.CanUint():
			id = append(id, strconv.FormatInt(int64(f.Uint()), 10))
		default:
			return ""
		}
	}
	return strings.Join(id, ":")
}
