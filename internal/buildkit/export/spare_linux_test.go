package export

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestASpareIsOursAlone: the export writes into a spare only when this
// user owns it and its folder, and no one else may write the folder; a
// planted one keeps its bytes.
func TestASpareIsOursAlone(t *testing.T) {
	plant := func(t *testing.T, folderMode os.FileMode, owner int) (dest, spare string) {
		t.Helper()
		dest = filepath.Join(t.TempDir(), "bin")
		if err := os.MkdirAll(dest, 0o755); err != nil {
			t.Fatal(err)
		}
		dir := spareDir(dest)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		spare = filepath.Join(dir, spareName("linux_amd64/tool"))
		if err := os.WriteFile(spare, []byte("planted"), 0o755); err != nil {
			t.Fatal(err)
		}
		if owner >= 0 {
			if err := os.Chown(spare, owner, owner); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(dir, folderMode); err != nil {
			t.Fatal(err)
		}
		return dest, spare
	}
	take := func(dest string) *os.File {
		path := filepath.Join(t.TempDir(), "tool")
		if err := os.WriteFile(path, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		return takeSpare(dest, "linux_amd64/tool", path)
	}
	if dest, _ := plant(t, 0o755, -1); take(dest) == nil {
		t.Fatal("this user's own spare was not taken")
	}
	if dest, spare := plant(t, 0o777, -1); take(dest) != nil {
		t.Error("a spare in a folder anyone may write to was taken")
	} else if got, _ := os.ReadFile(spare); !bytes.Equal(got, []byte("planted")) {
		t.Errorf("the refused spare holds %q", got)
	}
	if os.Geteuid() == 0 {
		if dest, spare := plant(t, 0o755, 65534); take(dest) != nil {
			t.Error("another user's spare was taken")
		} else if got, err := os.ReadFile(spare); err == nil && !bytes.Equal(got, []byte("planted")) {
			t.Errorf("another user's spare holds %q", got)
		}
	}
}
