package buildkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// CacheDir is kiln's directory under the user cache dir (KILN_CACHE_DIR
// overrides). kiln runs the buildkitd and toolchain it finds there, so the
// directory must be the user's own and writable by no one else.
func CacheDir() (string, error) {
	dir := os.Getenv("KILN_CACHE_DIR")
	if dir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("find the user cache dir (set KILN_CACHE_DIR): %w", err)
		}
		dir = filepath.Join(d, "kiln")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, TrustedDir(dir)
}

// TrustedDir refuses a directory another user owns or may write to.
func TrustedDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("kiln cache %s belongs to uid %d, not you (uid %d): kiln runs the programs it caches there; use a directory of your own (KILN_CACHE_DIR) or chown it", dir, st.Uid, os.Getuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("kiln cache %s is writable by others (mode %o): kiln runs the programs it caches there; chmod go-w %s", dir, fi.Mode().Perm(), dir)
	}
	return nil
}

// LockFile takes an exclusive flock, waiting for other kiln processes.
func LockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Tail is the last n lines of a daemon's log, to show with an error.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "buildkitd log (" + path + "):\n" + string(bytes.Join(lines, []byte("\n")))
}
