package buildkit

import (
	"os"
	"strings"
	"testing"
)

func TestCacheDirOthersCanWriteIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KILN_CACHE_DIR", dir)
	if _, err := CacheDir(); err == nil || !strings.Contains(err.Error(), "writable by others") || !strings.Contains(err.Error(), dir) {
		t.Errorf("a world-writable cache gave %v", err)
	}
	os.Chmod(dir, 0o700)
	if _, err := CacheDir(); err != nil {
		t.Errorf("a private cache: %v", err)
	}
}
