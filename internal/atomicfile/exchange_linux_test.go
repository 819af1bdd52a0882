package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAFolderIsReplacedInOneStep: the old folder and the new trade names
// in one exchange, so no moment leaves the destination missing, and no
// ".old" folder is left to be swept as a dead writer's.
func TestAFolderIsReplacedInOneStep(t *testing.T) {
	dir := t.TempDir()
	dest := filepath.Join(dir, "bin")
	for i, content := range []string{"first", "second"} {
		tmp, err := Temp(dest, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, "tool"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			// The two paths swap: the temporary name holds the old folder.
			if err := exchange(tmp, dest); err != nil {
				t.Fatalf("exchange: %v", err)
			}
			if got, _ := os.ReadFile(filepath.Join(tmp, "tool")); string(got) != "first" {
				t.Fatalf("after the exchange the temporary name holds %q, want the old folder", got)
			}
			if err := exchange(tmp, dest); err != nil {
				t.Fatal(err)
			}
		}
		if err := Replace(tmp, dest); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dest, "tool")); string(got) != "second" {
		t.Errorf("the folder holds %q, want the second", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left beside the output: %v", entries)
	}
}
