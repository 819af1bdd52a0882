// Package atomicfile owns how kiln writes an output whole or not at all:
// a file or folder is made under a temporary name beside its destination
// and renamed into place, and temporaries whose writer died are swept;
// and how it reads back a JSON record it wrote.
package atomicfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Write writes a file under a temporary name in its directory and
// renames it into place, so readers see the old file or the whole new one.
func Write(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	name, err := Temp(path, false)
	if err != nil {
		return err
	}
	defer os.Remove(name)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return Replace(f.Name(), path)
}

// Replace moves a finished output into place. A directory replaces the old
// one as a whole: old output is kept aside until the new one is in.
func Replace(tmp, dest string) error {
	fi, err := os.Stat(tmp)
	if err != nil {
		return err
	}
	// Temporary names are created 0600/0700; outputs are for everyone to
	// read, as go build's are.
	if !fi.IsDir() {
		if err := os.Chmod(tmp, 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, dest)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	// One exchange where the system has it: at no moment is dest missing,
	// and a kill leaves either folder whole under one of the two names.
	if _, err := os.Lstat(dest); err == nil {
		if err := exchange(tmp, dest); err == nil {
			return os.RemoveAll(tmp) // the old folder, under the temporary name
		}
	}
	old := ""
	if _, err := os.Stat(dest); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dest, old); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dest); err != nil {
		if old != "" {
			os.Rename(old, dest)
		}
		return err
	}
	if old != "" {
		return os.RemoveAll(old)
	}
	return nil
}

// Temp reserves a temporary name beside dest, on the same file system,
// so the final rename is atomic.
func Temp(dest string, isDir bool) (string, error) {
	dir := filepath.Dir(dest)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	prefix := "." + filepath.Base(dest) + ".tmp-"
	sweep(dir, prefix)
	// The pid in the name tells a later run whether its writer is gone.
	pattern := prefix + strconv.Itoa(os.Getpid()) + "-*"
	if isDir {
		return os.MkdirTemp(dir, pattern)
	}
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	f.Close()
	return f.Name(), nil
}

// sweep removes the temporary outputs of writers that died (a SIGKILL, a
// power cut) before renaming them: those whose pid no longer runs.
func sweep(dir, prefix string) {
	matches, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	for _, m := range matches {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(m), prefix), "-")
		if pid, err := strconv.Atoi(pidText); err == nil && pid > 0 && !Alive(pid) {
			os.RemoveAll(m)
		}
	}
}

// Alive reports whether pid runs. A zombie is dead: a daemon stays one
// when the process that started it is still running and never reaps it.
func Alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// ReadJSON reads a JSON file kiln wrote earlier; a missing file is nil.
func ReadJSON[T any](path, what string) (*T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%s: not a %s (delete it to start afresh): %w", path, what, err)
	}
	return &v, nil
}
