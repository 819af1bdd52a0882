package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersionsThatCouldEscapeAPathAreRefused(t *testing.T) {
	for _, v := range []string{"v1.2.3", "v1.2.3-rc.1", "1.0", "v0.1.0-5-gabcdef-dirty"} {
		if err := ValidVersion(v); err != nil {
			t.Errorf("%q refused: %v", v, err)
		}
	}
	for _, v := range []string{"../../../x", "v1/../../x", "..", "v1 2", "v1\n", "a/b", "", ".hidden", "v1+build", strings.Repeat("v", 129)} {
		if err := ValidVersion(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("../../../x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := gitDescribe(dir); err == nil || !strings.Contains(err.Error(), "VERSION") {
		t.Errorf("VERSION=../../../x gave %v; want an error naming the file", err)
	}
}
