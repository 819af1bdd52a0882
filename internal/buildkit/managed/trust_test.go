package managed

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/uptodate"
)

func TestACachedBinaryThatChangedIsRefused(t *testing.T) {
	dir := t.TempDir()
	m := &Managed{Dir: dir, BinDir: dir}
	if err := os.WriteFile(m.Binary(), []byte("buildkitd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.checkBinary(); !os.IsNotExist(err) {
		t.Errorf("a binary with no recorded sha256: %v; want it treated as missing (built again)", err)
	}
	sum, _ := uptodate.FileSHA256(m.Binary())
	os.WriteFile(m.Binary()+".sha256", []byte(sum+"\n"), 0o644)
	if err := m.checkBinary(); err != nil {
		t.Errorf("the recorded binary: %v", err)
	}
	os.WriteFile(filepath.Join(dir, filepath.Base(m.Binary())), []byte("planted"), 0o755)
	if err := m.checkBinary(); err == nil || !strings.Contains(err.Error(), "changed since kiln built it") {
		t.Errorf("a replaced binary gave %v", err)
	}
}
